//! What the QP steps and the registration steps share: page-aligned host memory, the per-run
//! pattern and its comparison, the regions a QP addresses, and the completion wait.

use super::ffi::*;
use std::time::{Duration, Instant};

/// Page-aligned host memory (anonymous mmap).
pub struct HostBuf {
    p: *mut u8,
    len: usize,
}

impl HostBuf {
    pub fn new(len: usize) -> Option<HostBuf> {
        // SAFETY: an anonymous private mapping; unmapped in Drop.
        let p = unsafe {
            libc::mmap(
                core::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        (p != libc::MAP_FAILED).then_some(HostBuf { p: p.cast(), len })
    }
    pub fn addr(&self) -> u64 {
        self.p as u64
    }
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: our mapping of len bytes, alive while self is. The NIC writes it only while a
        // work request we posted runs, and we read it only after its completion.
        unsafe { core::slice::from_raw_parts(self.p, self.len) }
    }
    pub fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as above, and &mut self is the only Rust view.
        unsafe { core::slice::from_raw_parts_mut(self.p, self.len) }
    }
}

impl Drop for HostBuf {
    fn drop(&mut self) {
        // SAFETY: the mapping made in new(), unmapped once.
        unsafe { libc::munmap(self.p.cast(), self.len) };
    }
}

/// The per-run pattern: 8-byte words of splitmix64 over (run seed, transfer, 4 KiB page, word),
/// so every page of every transfer of every run differs.
pub fn fill(buf: &mut [u8], seed: u64, tag: u64) {
    fill_at(buf, seed, tag, 0);
}

/// The pattern's bytes from `offset` (a multiple of 8) on: a long buffer filled piece by piece.
pub fn fill_at(buf: &mut [u8], seed: u64, tag: u64, offset: usize) {
    for (k, w) in buf.chunks_mut(8).enumerate() {
        let j = offset / 8 + k;
        let page = (j * 8 / 4096) as u64;
        let mut z = seed ^ (tag << 48) ^ (page << 20) ^ (j as u64 & 511);
        z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^= z >> 31;
        let b = z.to_le_bytes();
        w.copy_from_slice(&b[..w.len()]);
    }
}

/// None: equal; else (first differing offset, bytes that differ).
pub fn compare(got: &[u8], want: &[u8]) -> Option<(usize, usize)> {
    let first = got.iter().zip(want).position(|(a, b)| a != b)?;
    Some((first, got[first..].iter().zip(&want[first..]).filter(|(a, b)| a != b).count()))
}

/// One memory region as the QP addresses it.
#[derive(Clone, Copy)]
pub struct Region {
    pub addr: u64,
    pub lkey: u32,
    pub rkey: u32,
}

pub struct Regions {
    pub gsrc: Region,
    pub gdst: Region,
    pub hsrc: Region,
    pub hdst: Region,
}

/// Polls until `want` completions arrived or `limit` passed without one. After 50 µs without a
/// completion it yields the CPU between polls, after 1 ms it sleeps 50 µs between them: a
/// completion that takes that long is not waiting for this core, and where the cores are all
/// busy (tasks sharing a machine) the thread that answers it may need this one. (A 4 MiB chunk
/// at 4 GB/s completes within 1 ms: only links already slower than that wait longer.)
const SPIN: Duration = Duration::from_micros(50);
const NAP_AFTER: Duration = Duration::from_millis(1);
const NAP: Duration = Duration::from_micros(50);

pub fn wait_completions(
    poll: PollCq,
    cq: *mut IbvCqHead,
    want: usize,
    limit: Duration,
) -> Result<(), (String, String)> {
    let mut got = 0;
    let mut last = Instant::now();
    let mut wc = [IbvWc::default(); 16];
    while got < want {
        // SAFETY: our CQ and a buffer of 16 work completions, as we say.
        let n = unsafe { poll(cq, 16, wc.as_mut_ptr()) };
        if n < 0 {
            return Err((
                format!("ibv_poll_cq -> {n}"),
                "the CQ is in error (overrun or a driver fault; dmesg)".into(),
            ));
        }
        for w in &wc[..n as usize] {
            if w.status != 0 {
                let call = format!(
                    "ibv_poll_cq: wr_id {} status {} ({}) vendor_err {:#x}",
                    w.wr_id,
                    wc_status_name(w.status),
                    w.status,
                    w.vendor_err
                );
                return Err((call, wc_cause(w.status).into()));
            }
        }
        if n > 0 {
            got += n as usize;
            last = Instant::now();
        } else if last.elapsed() > SPIN && last.elapsed() <= limit {
            if last.elapsed() > NAP_AFTER {
                std::thread::sleep(NAP);
            } else {
                std::thread::yield_now();
            }
        } else if last.elapsed() > limit {
            return Err((
                format!("ibv_poll_cq: {got} of {want} completions, none for {} s", limit.as_secs()),
                "the QP hangs: the port went down, or the HCA lost its PCIe path (dmesg)".into(),
            ));
        }
    }
    Ok(())
}

fn wc_cause(s: u32) -> &'static str {
    match s {
        10 => "remote access error: the NIC could not reach the target memory through its MR (for GPU memory: the BAR mapping behind the registration is gone or not the registered pages; IOMMU/ACS blocked the peer access)",
        4 | 8 => "local protection/access error: the NIC could not read or write the local MR's memory (for GPU memory: the registration does not cover it)",
        12 => "transport retries exhausted: the QP got no answer from itself (wrong GID/LID or GID type, RoCE v2 without an IP on the netdev, port down, MTU)",
        13 => "RNR retries exhausted: nothing was posted to receive (a tool bug)",
        5 => "flushed: an earlier work request failed and the QP went to the error state",
        _ => "see the status; dmesg for the HCA driver's message",
    }
}
