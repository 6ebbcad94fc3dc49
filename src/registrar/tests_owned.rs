//! The program's-own-memory rule on every path: a registration or export is made only when every
//! byte of the range lies in allocations the program made through CUDA (neighbours together are
//! fine); CUDA's own memory and a range running past an allocation are refused, as libcuda does.

use super::tests::{map_on_gpu, tracker_with, FakeRm, C, DEV, GPU};
use super::*;
use crate::abi::dmabuf::ExportToDmabufFd;
use crate::decode::Event;
use crate::fd::FileId;
use crate::fd::OwnedFd;

const VA: u64 = 0x7f00_0000_0000;
const MB2: u64 = 0x20_0000;

/// An RM that exports dma-bufs (fd 100, 101, …) and says every GPU can.
#[derive(Default)]
struct ExportRm {
    exports: u32,
}
impl Rm for ExportRm {
    fn alloc_p2p(&mut self, _: Client, _: u32) -> Result<u32, u32> {
        panic!("the DMA-BUF route makes no 503C")
    }
    fn register_va_space(&mut self, _: Client, _: u32, _: u32) -> Result<u64, u32> {
        panic!("the DMA-BUF route makes no 503C")
    }
    fn register_vidmem(&mut self, _: Client, _: u32, _: &VidmemTuple) -> Result<(), u32> {
        panic!("the DMA-BUF route makes no 503C")
    }
    fn unregister_vidmem(&mut self, _: Client, _: u32, _: u32) -> Result<(), u32> {
        panic!("the DMA-BUF route makes no 503C")
    }
    fn free(&mut self, _: Client, _: u32, _: u32) -> Result<(), u32> {
        panic!("the DMA-BUF route makes no 503C")
    }
    fn gpu_dmabuf_capable(&mut self, _: Client, _: u32) -> Result<bool, u32> {
        Ok(true)
    }
    fn export_dmabuf(
        &mut self,
        _: Client,
        _: u32,
        _: &mut ExportToDmabufFd,
        _: Option<&OwnedFd>,
    ) -> Result<Option<OwnedFd>, u32> {
        self.exports += 1;
        Ok(Some(OwnedFd::new(
            99 + self.exports as i32,
            FileId { dev: 7, ino: u64::from(self.exports), rdev: 0 },
        )))
    }
    fn close_fd(&mut self, _: OwnedFd) {}
    fn still_ours(&mut self, _: &OwnedFd) -> bool {
        true
    }
}

/// Memory `h` of `len` bytes mapped at `va` (libcuda's UVM calls), not handed to the program.
fn cuda_internal(t: &mut Tracker, h: u32, va: u64, len: u64) {
    t.apply(&Event::Memory {
        h_client: C,
        h_parent: DEV,
        h_memory: h,
        class: 0x40,
        size: Some(len),
        attr: 0,
        attr2: 0,
        flags: 0,
    });
    t.apply(&Event::UvmCreateExternalRange { base: va, length: len });
    t.apply(&map_on_gpu(va, len, 0, h));
}

/// Two 2 MiB allocations side by side (two memory objects), then 4 MiB of CUDA's own memory
/// right after them, as the H200 showed after a cudaMalloc.
fn program_then_internal() -> Tracker {
    let mut t = tracker_with(&[(0x10, VA, MB2), (0x11, VA + MB2, MB2)]);
    cuda_internal(&mut t, 0x12, VA + 2 * MB2, 2 * MB2);
    t
}

#[test]
fn nv503c_registers_neighbours_and_refuses_cuda_memory_and_overruns() {
    let mut t = program_then_internal();
    let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
    let inside = r.before_reg(&t, &mut rm, VA + 0x1000, 0x1000);
    assert!(matches!(inside, Decision::Hit { .. }), "{inside:?}");
    let internal = r.before_reg(&t, &mut rm, VA + 2 * MB2, 0x1000);
    assert_eq!(
        internal,
        Decision::Refuse(RegMiss::NotProgramMemory { at: VA + 2 * MB2 }),
        "CUDA's own memory"
    );
    let over = r.before_reg(&t, &mut rm, VA + MB2 + MB2 / 2, MB2);
    assert_eq!(
        over,
        Decision::Refuse(RegMiss::NotProgramMemory { at: VA + 2 * MB2 }),
        "running past the allocation"
    );
    assert_eq!(rm.regs.len(), 1, "only the program's memory was registered with RM");
    // a free by the program: its memory is not its own any more, though still mapped
    t.map.disown_at(VA);
    assert_eq!(
        r.before_reg(&t, &mut rm, VA + 0x2000, 0x1000),
        Decision::Refuse(RegMiss::NotProgramMemory { at: VA + 0x2000 })
    );
    let why = RegMiss::NotProgramMemory { at: VA }.to_string();
    assert!(
        why.contains("not in any allocation this program made through CUDA")
            && why.contains("CUDA's own memory"),
        "{why}"
    );
}

#[test]
fn dmabuf_exports_across_neighbours_and_refuses_cuda_memory_on_every_path() {
    let t = program_then_internal();
    let (mut rm, mut r) = (ExportRm::default(), Registrar::with_route(false, Ok(Route::Dmabuf)));
    // two allocations side by side: one buffer of two pieces
    let d = r.before_verbs(
        &t,
        &mut rm,
        VerbsReg { addr: VA + MB2 / 2, len: MB2, access: 0, rereg: false },
    );
    assert!(matches!(&d, Decision::Exported(e) if e.pieces == 2), "{d:?}");
    assert_eq!(
        r.export(&t, &mut rm, VA, 2 * MB2, 0).map(|e| e.map(|e| e.pieces)),
        Ok(Some(2)),
        "CUDA's caller, both allocations"
    );
    let exports = rm.exports;
    // the verbs path, CUDA's callers (cuMemGetHandleForAddressRange, gdrshim_export_dmabuf) and
    // an export running 4 MiB past the allocation: all refused, nothing exported
    let d = r.before_verbs(
        &t,
        &mut rm,
        VerbsReg { addr: VA + 2 * MB2, len: 0x1000, access: 0, rereg: false },
    );
    assert_eq!(d, Decision::Refuse(RegMiss::NotProgramMemory { at: VA + 2 * MB2 }));
    assert_eq!(
        r.export(&t, &mut rm, VA + 2 * MB2, 2 * MB2, 0),
        Err(RegMiss::NotProgramMemory { at: VA + 2 * MB2 })
    );
    assert_eq!(
        r.export(&t, &mut rm, VA, 4 * MB2, 0),
        Err(RegMiss::NotProgramMemory { at: VA + 2 * MB2 })
    );
    assert_eq!(
        rm.exports, exports,
        "RM was asked for no export of memory the program did not allocate"
    );
    let mut shadow = Registrar::with_route(true, Ok(Route::Dmabuf));
    let d = shadow.before_verbs(
        &t,
        &mut rm,
        VerbsReg { addr: VA + 2 * MB2, len: 0x1000, access: 0, rereg: false },
    );
    assert_eq!(
        d,
        Decision::Miss(RegMiss::NotProgramMemory { at: VA + 2 * MB2 }),
        "shadow mode predicts the same refusal"
    );
}

#[test]
fn va_the_driver_takes_back_is_not_the_programs_any_more() {
    let other = [7u8; 16];
    let mut t = tracker_with(&[(0x10, VA, MB2)]);
    // mapped on a second GPU too (peer access): unmapping one GPU leaves the allocation
    t.apply(&Event::UvmMapExternal {
        base: VA,
        length: MB2,
        offset: 0,
        gpus: smallvec::smallvec![other],
        rm_ctrl_fd: 8,
        h_client: C,
        h_memory: 0x10,
    });
    t.apply(&Event::UvmUnmapExternal { base: VA, length: MB2, gpu: other });
    assert_eq!(t.map.first_unowned(VA, VA + MB2), None, "still mapped on its own GPU");
    t.apply(&Event::UvmUnmapExternal { base: VA, length: MB2, gpu: GPU });
    assert_eq!(t.map.first_unowned(VA, VA + MB2), Some(VA), "no GPU maps it: not the program's");
    // CUDA maps its own memory at the same VA next: refused, though the program once had it
    cuda_internal(&mut t, 0x13, VA, MB2);
    let (mut rm, mut r) = (FakeRm::default(), Registrar::new(false));
    assert_eq!(
        r.before_reg(&t, &mut rm, VA, 0x1000),
        Decision::Refuse(RegMiss::NotProgramMemory { at: VA })
    );
    // and a UVM_FREE of a range takes what the program had in it
    let mut t = tracker_with(&[(0x10, VA, MB2)]);
    t.apply(&Event::UvmFree { base: VA, length: None });
    assert_eq!((t.map.first_unowned(VA, VA + MB2), t.map.owned_ranges()), (Some(VA), 0));
}

/// Pinned host memory (`cls` 0x3e or 0x71) `h` of `len` bytes that CUDA also mapped for the GPU at
/// `va`, as libcuda does with its own and the program's (cudaHostAlloc, cudaHostRegister).
fn pinned_host(t: &mut Tracker, h: u32, cls: u32, va: u64, len: u64) {
    t.apply(&Event::Memory {
        h_client: C,
        h_parent: DEV,
        h_memory: h,
        class: cls,
        size: Some(len),
        attr: 0,
        attr2: 0,
        flags: 0,
    });
    t.apply(&Event::UvmCreateExternalRange { base: va, length: len });
    t.apply(&map_on_gpu(va, len, 0, h));
}

/// NCCL registers its host buffers (cudaHostAlloc) with ibv_reg_mr_iova2: they sit in the GPU's
/// VA too (the H200's many-hosts run refused them with EFAULT until pinned host memory was
/// known as host memory). On both routes they, and host memory beside them, are delegated;
/// a range reaching into GPU memory is not.
#[test]
fn pinned_host_memory_mapped_for_the_gpu_is_host_memory_on_both_routes() {
    let host = VA + 4 * MB2;
    for cls in
        [crate::abi::class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR, crate::abi::class::NV01_MEMORY_SYSTEM]
    {
        let mut t = program_then_internal();
        pinned_host(&mut t, 0x20, cls, host, MB2);
        let reg = |addr, len| VerbsReg { addr, len, access: 0, rereg: false };
        let (mut rm, mut nv) = (FakeRm::default(), Registrar::new(false));
        assert_eq!(
            nv.before_verbs(&t, &mut rm, reg(host + 0x1000, 0x81000)),
            Decision::Host,
            "class {cls:#x}"
        );
        assert_eq!(
            nv.before_verbs(&t, &mut rm, reg(host + MB2 / 2, MB2)),
            Decision::Host,
            "with plain host memory after it"
        );
        let into_gpu = nv.before_verbs(&t, &mut rm, reg(host - 0x1000, 0x2000));
        assert!(
            matches!(into_gpu, Decision::Refuse(_)),
            "reaching into CUDA's own GPU memory: {into_gpu:?}"
        );
        assert!(rm.regs.is_empty(), "RM registered nothing");
        let (mut rm, mut dmabuf) =
            (ExportRm::default(), Registrar::with_route(false, Ok(Route::Dmabuf)));
        assert_eq!(dmabuf.before_verbs(&t, &mut rm, reg(host, MB2)), Decision::Host);
        assert!(matches!(
            dmabuf.before_verbs(&t, &mut rm, reg(host - 0x1000, 0x2000)),
            Decision::Refuse(_)
        ));
        assert_eq!(rm.exports, 0, "nothing exported");
    }
}
