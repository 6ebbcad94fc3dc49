use super::*;
use crate::abi::{pod_bytes, zeroed, DriverVersion};
use std::collections::HashMap;

#[test]
fn pending_releases_read_only_the_fields_they_need() {
    for v in ["535.288.01", "580.159.04", "595.45.04"] {
        let t = abi::table_for(DriverVersion::parse(v).unwrap()).unwrap();
        let l = t.uvm_map_external();
        let mut map = vec![0u8; l.size()];
        map[0..8].copy_from_slice(&0x7f00_0000_0000u64.to_le_bytes());
        map[8..16].copy_from_slice(&0x20_0000u64.to_le_bytes());
        map[16..24].copy_from_slice(&0x1_0000u64.to_le_bytes());
        map[l.h_client()..l.h_client() + 4].copy_from_slice(&0xc1d0_0001u32.to_le_bytes());
        map[l.h_memory()..l.h_memory() + 4].copy_from_slice(&0x5c00_0042u32.to_le_bytes());
        let read = |b: &[u8], pieces: &[(usize, usize)]| -> Option<Vec<u8>> {
            let mut out = Vec::new();
            for &(o, n) in pieces {
                out.extend_from_slice(b.get(o..o + n)?);
            }
            Some(out)
        };
        let got = pending(DevKind::Uvm, uvm::MAP_EXTERNAL_ALLOCATION, t, &|p| read(&map, p));
        assert_eq!(
            got,
            Some(Pending::UvmMap {
                base: 0x7f00_0000_0000,
                length: 0x20_0000,
                offset: 0x1_0000,
                h_client: 0xc1d0_0001,
                h_memory: 0x5c00_0042
            }),
            "{v}"
        );
        let unmap = [0x11u8; 40];
        assert_eq!(
            pending(DevKind::Uvm, uvm::UNMAP_EXTERNAL, t, &|p| read(&unmap, p)),
            Some(Pending::UvmUnmap { base: 0x1111_1111_1111_1111, length: 0x1111_1111_1111_1111 })
        );
        assert_eq!(
            pending(DevKind::Uvm, uvm::MAP_EXTERNAL_SPARSE, t, &|p| read(&unmap, p)),
            Some(Pending::UvmUnmap { base: 0x1111_1111_1111_1111, length: 0x1111_1111_1111_1111 }),
            "a sparse map unmaps first"
        );
        let mut free = zeroed::<abi::Nvos00Free>();
        free.h_root = 7;
        free.h_object_old = 9;
        let req = abi::nv_ioctl(esc::RM_FREE, 16);
        assert_eq!(
            pending(DevKind::Ctl, req, t, &|p| read(pod_bytes(&free), p)),
            Some(Pending::RmFree { h_client: 7, h_object: 9 })
        );
        assert_eq!(
            pending(DevKind::Gpu(0), req, t, &|p| read(pod_bytes(&free), p)),
            Some(Pending::RmFree { h_client: 7, h_object: 9 })
        );
        // calls that release nothing read nothing; an unreadable argument is no release
        assert_eq!(
            pending(DevKind::Ctl, abi::nv_ioctl(esc::RM_ALLOC, 48), t, &|_| panic!("read")),
            None
        );
        assert_eq!(pending(DevKind::Uvm, uvm::FREE, t, &|_| None), None);
    }
}

struct Params(HashMap<u64, Vec<u8>>);
impl ParamReader for Params {
    fn read(&self, ptr: u64, len: usize) -> Option<Vec<u8>> {
        self.0.get(&ptr).filter(|b| b.len() >= len).map(|b| b[..len].to_vec())
    }
}

fn t580() -> &'static AbiTable {
    abi::table_for(DriverVersion(580, 159, 4)).unwrap()
}

#[test]
fn memory_alloc_reads_size_from_class_params_not_params_size() {
    let mut mp: abi::MemoryAllocationParamsV545 = zeroed();
    mp.size = 64 << 20;
    mp.attr = 0x1180_0000;
    let mut a: abi::Nvos64Alloc = zeroed();
    a.h_root = 0xc1d0_0022;
    a.h_object_parent = 0x5c00_0002;
    a.h_object_new = 0x5c00_0096;
    a.h_class = 0x40;
    a.p_alloc_parms = 0x1000;
    a.params_size = 0; // as libcuda passes it
    let p = Params([(0x1000, pod_bytes(&mp).to_vec())].into());
    let r = abi::nv_ioctl(esc::RM_ALLOC, 48);
    let o = decode(DevKind::Ctl, 8, r, 0, pod_bytes(&a), &p, t580());
    assert_eq!(
        o,
        Outcome::Event(Event::Memory {
            h_client: 0xc1d0_0022,
            h_parent: 0x5c00_0002,
            h_memory: 0x5c00_0096,
            class: 0x40,
            size: Some(64 << 20),
            attr: 0x1180_0000,
            attr2: 0,
            flags: 0
        })
    );
}

/// libcuda's pinned host memory on the H200 (580.159.04, during cuInit): NV_ESC_RM_ALLOC_MEMORY
/// on /dev/nvidia0 describing 2 MiB of its host memory at 0x7f4376800000 to RM, as captured.
#[test]
fn alloc_memory_of_host_pages_is_sysmem_memory() {
    let raw = "2200d0c10200005c7000005c71000000101000400000000000008076437f0000\
               ffff1f00000000000000000000000000ffffffff00000000";
    let b: Vec<u8> = (0..raw.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&raw[i..i + 2], 16).unwrap())
        .collect();
    let r = abi::nv_ioctl(esc::RM_ALLOC_MEMORY, 56);
    let o = decode(DevKind::Gpu(0), 12, r, 0, &b, &NoParams, t580());
    assert_eq!(
        o,
        Outcome::Event(Event::Memory {
            h_client: 0xc1d0_0022,
            h_parent: 0x5c00_0002,
            h_memory: 0x5c00_0070,
            class: class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR,
            size: Some(2 << 20),
            attr: 0,
            attr2: 0,
            flags: 0x4000_1010
        })
    );
    assert!(
        class::is_sysmem(class::NV01_MEMORY_SYSTEM_OS_DESCRIPTOR)
            && !class::is_sysmem(class::NV01_MEMORY_LOCAL_USER)
    );
    let mut failed = b.clone();
    failed[40] = 0x1f; // a status: nothing was allocated
    assert!(matches!(
        decode(DevKind::Gpu(0), 12, r, 0, &failed, &NoParams, t580()),
        Outcome::Failed { .. }
    ));
}

#[test]
fn failed_status_and_failed_rc_are_not_decoded() {
    let mut f: abi::Nvos00Free = zeroed();
    f.status = status::NV_ERR_OBJECT_NOT_FOUND;
    let r = abi::nv_ioctl(esc::RM_FREE, 16);
    assert_eq!(
        decode(DevKind::Ctl, 3, r, 0, pod_bytes(&f), &NoParams, t580()),
        Outcome::Failed { rc: 0, status: 0x57 }
    );
    f.status = 0;
    assert_eq!(
        decode(DevKind::Ctl, 3, r, -1, pod_bytes(&f), &NoParams, t580()),
        Outcome::Failed { rc: -1, status: 0 }
    );
}

#[test]
fn size_mismatch_is_malformed() {
    let f: abi::Nvos00Free = zeroed();
    let r = abi::nv_ioctl(esc::RM_FREE, 20);
    let mut b = pod_bytes(&f).to_vec();
    b.extend_from_slice(&[0; 4]);
    assert!(matches!(decode(DevKind::Ctl, 3, r, 0, &b, &NoParams, t580()), Outcome::Malformed(_)));
    // captured length different from _IOC_SIZE
    let r = abi::nv_ioctl(esc::RM_FREE, 16);
    assert!(matches!(decode(DevKind::Ctl, 3, r, 0, &b, &NoParams, t580()), Outcome::Malformed(_)));
}

#[test]
fn uvm_map_external_uses_the_branch_layout() {
    for (t, max) in [(abi::table_for(DriverVersion(535, 288, 1)).unwrap(), 32usize), (t580(), 256)]
    {
        let l = t.uvm_map_external();
        let mut b = vec![0u8; l.size()];
        b[0..8].copy_from_slice(&0x7f43_5200_0000u64.to_le_bytes());
        b[8..16].copy_from_slice(&(64u64 << 20).to_le_bytes());
        b[24..40].copy_from_slice(&[7; 16]);
        b[l.count()..l.count() + 8].copy_from_slice(&1u64.to_le_bytes());
        b[l.rm_ctrl_fd()..l.rm_ctrl_fd() + 4].copy_from_slice(&8i32.to_le_bytes());
        b[l.h_client()..l.h_client() + 4].copy_from_slice(&0xc1d0_0022u32.to_le_bytes());
        b[l.h_memory()..l.h_memory() + 4].copy_from_slice(&0x5c00_0096u32.to_le_bytes());
        assert_eq!(l.max_gpus, max);
        let o = decode(DevKind::Uvm, 9, uvm::MAP_EXTERNAL_ALLOCATION, 0, &b, &NoParams, t);
        assert_eq!(
            o,
            Outcome::Event(Event::UvmMapExternal {
                base: 0x7f43_5200_0000,
                length: 64 << 20,
                offset: 0,
                gpus: smallvec::smallvec![[7; 16]],
                rm_ctrl_fd: 8,
                h_client: 0xc1d0_0022,
                h_memory: 0x5c00_0096
            })
        );
        // rmStatus set: not decoded
        b[l.rm_status()] = 0x1f;
        assert!(matches!(
            decode(DevKind::Uvm, 9, uvm::MAP_EXTERNAL_ALLOCATION, 0, &b, &NoParams, t),
            Outcome::Failed { .. }
        ));
    }
}

#[test]
fn uvm_free_layout_changes_in_590() {
    let t590 = abi::table_for(DriverVersion(590, 48, 1)).unwrap();
    let mut b = vec![0u8; 16];
    b[0..8].copy_from_slice(&0x2000u64.to_le_bytes());
    assert_eq!(
        decode(DevKind::Uvm, 9, uvm::FREE, 0, &b, &NoParams, t590),
        Outcome::Event(Event::UvmFree { base: 0x2000, length: None })
    );
    // 16 bytes on a 580 driver is not the struct the kernel copies: refused.
    assert!(matches!(
        decode(DevKind::Uvm, 9, uvm::FREE, 0, &b, &NoParams, t580()),
        Outcome::Malformed(_)
    ));
}

/// UVM_MAP_EXTERNAL_SPARSE unmaps what the GPU had mapped in its range first: to the map it is an
/// unmap on that GPU (a sparse mapping holds no memory), also when UVM refuses after unmapping.
#[test]
fn a_sparse_map_is_an_unmap_on_its_gpu() {
    let mut p: abi::UvmMapExternalSparseParams = zeroed();
    (p.base, p.length, p.gpu_uuid) = (0x7f00_0020_0000, 0x20_0000, [9; 16]);
    let ev = Event::UvmUnmapExternal { base: 0x7f00_0020_0000, length: 0x20_0000, gpu: [9; 16] };
    assert_eq!(
        decode(DevKind::Uvm, 9, uvm::MAP_EXTERNAL_SPARSE, 0, pod_bytes(&p), &NoParams, t580()),
        Outcome::Event(ev.clone())
    );
    p.rm_status = 0x51;
    assert_eq!(
        decode(DevKind::Uvm, 9, uvm::MAP_EXTERNAL_SPARSE, 0, pod_bytes(&p), &NoParams, t580()),
        Outcome::Event(ev.clone()),
        "refused after the unmap: still unmapped"
    );
    assert!(matches!(
        decode(DevKind::Uvm, 9, uvm::MAP_EXTERNAL_SPARSE, 0, &[0; 16], &NoParams, t580()),
        Outcome::Malformed(_)
    ));
}

#[test]
fn only_503c_controls_are_decoded() {
    let mut c: abi::Nvos54Control = zeroed();
    c.cmd = 0x2080_1303;
    c.params = 0x10;
    c.params_size = 1028;
    let r = abi::nv_ioctl(esc::RM_CONTROL, 32);
    assert_eq!(decode(DevKind::Ctl, 8, r, 0, pod_bytes(&c), &NoParams, t580()), Outcome::Ignored);
    c.cmd = p2p::REGISTER_VIDMEM;
    c.params_size = 32;
    let rv = abi::Nv503cRegisterVidmem {
        h_memory: 5,
        _pad0: 0,
        address: 0x10000,
        size: 0x20000,
        offset: 0,
    };
    let p = Params([(0x10, pod_bytes(&rv).to_vec())].into());
    assert_eq!(
        decode(DevKind::Ctl, 8, r, 0, pod_bytes(&c), &p, t580()),
        Outcome::Event(Event::P2pControl {
            h_client: 0,
            h_object: 0,
            ctrl: P2pCtrl::RegisterVidmem {
                h_memory: 5,
                address: 0x10000,
                size: 0x20000,
                offset: 0
            }
        })
    );
    c.params_size = 31;
    assert!(matches!(
        decode(DevKind::Ctl, 8, r, 0, pod_bytes(&c), &p, t580()),
        Outcome::Malformed(_)
    ));
}
