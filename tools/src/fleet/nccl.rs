//! NCCL's decision (`--nccl`): per pair of each round, a two-rank communicator and one send/recv
//! each way through NCCL (libnccl.so.2, loaded at run time, with gdrshim as the job has it), the
//! bytes received checked, and NCCL's own log read for its network connections: the leg passes
//! only where every one is `via NET/…/GDRDMA` (the silent fallback to host staging is the fault).
//! NCCL's log goes to a file of this task's (`NCCL_DEBUG=INFO`, `NCCL_DEBUG_FILE`), set before
//! NCCL is loaded; the lines each pair added are judged with verify-run's own reading.

use crate::selftest::cuda::Cuda;
use crate::verify::net_connections;
use core::ffi::{c_char, c_int, c_void, CStr};
use libloading::Library;
use std::path::PathBuf;

/// `ncclUniqueId`: 128 bytes, passed by value.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct UniqueId(pub [u8; 128]);

type GetId = unsafe extern "C" fn(*mut UniqueId) -> c_int;
type InitRank = unsafe extern "C" fn(*mut *mut c_void, c_int, UniqueId, c_int) -> c_int;
type Xfer =
    unsafe extern "C" fn(*mut c_void, usize, c_int, c_int, *mut c_void, *mut c_void) -> c_int;
type Group = unsafe extern "C" fn() -> c_int;
type Destroy = unsafe extern "C" fn(*mut c_void) -> c_int;
type ErrStr = unsafe extern "C" fn(c_int) -> *const c_char;
type Version = unsafe extern "C" fn(*mut c_int) -> c_int;

/// ncclUint8
const UINT8: c_int = 1;

pub struct Nccl {
    /// Never unloaded: NCCL's threads may outlive a communicator's destruction.
    _lib: std::mem::ManuallyDrop<Library>,
    get_id: GetId,
    init: InitRank,
    send: Xfer,
    recv: Xfer,
    group_start: Group,
    group_end: Group,
    destroy: Destroy,
    err: Option<ErrStr>,
    pub version: String,
    log: PathBuf,
    read: usize,
    /// GPU buffers of its own (`src` holds this node's pattern, `dst` receives the peer's), and
    /// their size: the leg runs whether or not this node's RDMA rig could register memory.
    buf: [u64; 2],
    size: usize,
}

/// Where NCCL writes its log in this task, set in the environment before NCCL is loaded (NCCL
/// reads it once). Call before any thread is started.
pub fn log_to(dir: &std::path::Path) -> PathBuf {
    let f = dir.join(format!("nccl-{}.log", std::process::id()));
    std::env::set_var("NCCL_DEBUG", "INFO");
    std::env::set_var("NCCL_DEBUG_FILE", &f);
    f
}

impl Nccl {
    /// NCCL, and its buffers on `cu`'s GPU (`size` bytes each).
    pub fn load(log: PathBuf, cu: &Cuda, size: usize) -> Result<Nccl, String> {
        let name = std::env::var("GDRSHIM_FLEET_NCCL").unwrap_or_else(|_| "libnccl.so.2".into());
        // SAFETY: loading NCCL runs its initialisers, as any program using NCCL does.
        let lib =
            unsafe { Library::new(&name) }.map_err(|e| format!("{name} cannot be loaded: {e}"))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: NCCL's API symbol with its nccl.h signature (the field's type); valid
                // while `_lib` is held.
                *unsafe { lib.get(concat!($name, "\0").as_bytes()) }
                    .map_err(|e| format!("{name} lacks {}: {e}", $name))?
            };
        }
        let v: Option<Version> = {
            // SAFETY: as above; ncclGetVersion(int *).
            unsafe { lib.get(b"ncclGetVersion\0") }.ok().map(|s| *s)
        };
        let mut code = 0;
        // SAFETY: a valid out-pointer.
        let version = match v.map(|f| unsafe { f(&mut code) }) {
            Some(0) => format!("{}.{}.{}", code / 10000, code / 100 % 100, code % 100),
            _ => "unknown".into(),
        };
        let mut buf = [0u64; 2];
        for b in &mut buf {
            *b = cu
                .alloc(size)
                .map_err(|(c, st)| format!("no GPU memory for NCCL's buffers: {c} -> {st}"))?;
        }
        Ok(Nccl {
            get_id: sym!("ncclGetUniqueId"),
            init: sym!("ncclCommInitRank"),
            send: sym!("ncclSend"),
            recv: sym!("ncclRecv"),
            group_start: sym!("ncclGroupStart"),
            group_end: sym!("ncclGroupEnd"),
            destroy: sym!("ncclCommDestroy"),
            // SAFETY: as above; ncclGetErrorString(ncclResult_t).
            err: unsafe { lib.get(b"ncclGetErrorString\0") }.ok().map(|s| *s),
            _lib: std::mem::ManuallyDrop::new(lib),
            version,
            log,
            read: 0,
            buf,
            size,
        })
    }

    fn check(&self, call: &str, r: c_int) -> Result<(), String> {
        if r == 0 {
            return Ok(());
        }
        let why = match self.err {
            // SAFETY: NCCL returns a static string for any result code.
            Some(f) => unsafe { CStr::from_ptr(f(r)) }.to_string_lossy().into_owned(),
            None => String::new(),
        };
        Err(format!("{call} -> {r} ({why})"))
    }

    /// A new id for a pair's communicator, as hex (the lower rank of the pair makes it).
    pub fn new_id(&self) -> Result<String, String> {
        let mut id = UniqueId([0; 128]);
        // SAFETY: a valid out-pointer to 128 bytes.
        self.check("ncclGetUniqueId", unsafe { (self.get_id)(&mut id) })?;
        Ok(id.0.iter().map(|b| format!("{b:02x}")).collect())
    }

    /// Its buffers released (before the CUDA context goes).
    pub fn free(&mut self, cu: &Cuda) {
        for b in self.buf {
            cu.free(b);
        }
        self.buf = [0; 2];
    }

    /// Fills `src` with this node's pattern (the RDMA rig's, `fill_at`).
    pub fn fill(&self, cu: &Cuda, seed: u64, tag: u64) -> Result<(), String> {
        put(cu, self.buf[0], self.size, seed, tag)
    }

    /// Whether `dst` holds the peer's pattern, every byte.
    pub fn verify(&self, cu: &Cuda, seed: u64, tag: u64) -> Result<(), String> {
        super::link::verify_with(self.size, seed, tag, |off, b| {
            cu.dtoh(b, self.buf[1] + off as u64).map_err(|(c, st)| format!("{c} -> {st}"))
        })
    }

    /// One send of `src` to the peer and one receive into `dst` from it through a two-rank
    /// communicator (`rank` 0 or 1 of it), `dst` poisoned first; what NCCL's log says of its
    /// network connections meanwhile: Ok(the GDRDMA lines) or Err(why not).
    pub fn pair(&mut self, cu: &Cuda, id: &str, rank: c_int, seed: u64) -> Result<String, String> {
        let (src, dst, bytes) = (self.buf[0], self.buf[1], self.size);
        put(cu, dst, bytes, seed, 0xfff0)?;
        let mut raw = UniqueId([0; 128]);
        if id.len() != 256 {
            return Err(format!("a malformed NCCL id: {id}"));
        }
        for (k, b) in raw.0.iter_mut().enumerate() {
            *b = u8::from_str_radix(&id[2 * k..2 * k + 2], 16).map_err(|e| e.to_string())?;
        }
        let stream = cu.stream().map_err(|(c, st)| format!("{c} -> {st}"))?;
        let mut comm = core::ptr::null_mut();
        // SAFETY: a valid out-pointer; the id both ranks hold; 2 ranks.
        let r = self
            .check("ncclCommInitRank", unsafe { (self.init)(&mut comm, 2, raw, rank) })
            .and_then(|()| {
                let peer = 1 - rank;
                // SAFETY: our communicator and stream; src and dst are GPU buffers of `bytes` at least.
                unsafe {
                    self.check("ncclGroupStart", (self.group_start)())?;
                    let s = self.check(
                        "ncclSend",
                        (self.send)(src as *mut c_void, bytes, UINT8, peer, comm, stream),
                    );
                    let v = self.check(
                        "ncclRecv",
                        (self.recv)(dst as *mut c_void, bytes, UINT8, peer, comm, stream),
                    );
                    self.check("ncclGroupEnd", (self.group_end)())?;
                    s.and(v)?;
                }
                cu.sync(stream).map_err(|(c, st)| format!("{c} -> {st}"))
            });
        if !comm.is_null() {
            // SAFETY: our communicator, destroyed once, after its work finished.
            unsafe { (self.destroy)(comm) };
        }
        cu.destroy_stream(stream);
        r?;
        self.judge_log()
    }

    /// The log lines NCCL wrote since the last pair: every network connection via GDRDMA.
    fn judge_log(&mut self) -> Result<String, String> {
        let all = std::fs::read_to_string(&self.log).unwrap_or_default();
        let new = all.get(self.read..).unwrap_or("").to_string();
        self.read = all.len();
        judge(&new)
    }
}

/// `size` bytes of the pattern (seed, tag) written to GPU memory at `gpu`.
fn put(cu: &Cuda, gpu: u64, size: usize, seed: u64, tag: u64) -> Result<(), String> {
    let chunk = size.min(16 << 20);
    let mut b = vec![0u8; chunk];
    for off in (0..size).step_by(chunk) {
        let b = &mut b[..chunk.min(size - off)];
        crate::selftest::host::fill_at(b, seed, tag, off);
        cu.htod(gpu + off as u64, b).map_err(|(c, st)| format!("{c} -> {st}"))?;
    }
    Ok(())
}

/// NCCL's log of one pair: Ok(a GDRDMA line), or Err(the line without GDRDMA, or none at all).
pub fn judge(log: &str) -> Result<String, String> {
    let (gdr, without) = net_connections(log);
    match (gdr.first(), without.first()) {
        (_, Some(l)) => Err(format!(
            "{} of {} network connections without GDRDMA: {}",
            without.len(),
            gdr.len() + without.len(),
            l.trim()
        )),
        (Some(l), None) => {
            Ok(format!("{} network connections via GDRDMA: {}", gdr.len(), l.trim()))
        }
        (None, None) => {
            Err("NCCL's log shows no network connection (NCCL_DEBUG=INFO: no 'via NET/' line)"
                .into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::judge;

    #[test]
    fn a_pair_passes_only_where_every_network_connection_is_gdrdma() {
        let gdr = "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[0] [send] via NET/IB/0/GDRDMA\n";
        let plain = "h:1:1 [0] NCCL INFO Channel 01/0 : 1[0] -> 0[0] [receive] via NET/IB/0\n";
        assert_eq!(
            judge(gdr).unwrap(),
            format!("1 network connections via GDRDMA: {}", gdr.trim())
        );
        let e = judge(&format!("{gdr}{plain}")).unwrap_err();
        assert_eq!(e, format!("1 of 2 network connections without GDRDMA: {}", plain.trim()));
        // 'GDR 1' alone proves nothing
        assert!(judge("h:1:1 [0] NCCL INFO NET/IB : GPU Direct RDMA Enabled ... GDR 1\n")
            .unwrap_err()
            .contains("no network connection"));
    }
}
