//! gdrshim's own capture format (`GDRSHIM_CAPTURE=path`): one line per finished NVIDIA ioctl with
//! its raw argument bytes and the embedded parameter bytes, plus the CUDA user allocations. It is
//! what the committed H200 fixtures are made of, and what the replay tool and the tests feed back
//! through the same decoder and map as the live shim.
//!
//! ```text
//! V 580.159.04                                   driver version
//! I <dev> <fd> <request-hex> <rc> <arg-hex> [P <ptr-offset> <params-hex>]
//! A <api> <ptr-hex> <len-hex>                    a user allocation returned by CUDA
//! M <free text>                                  a mark written by the program
//! ```
#![forbid(unsafe_code)]

use crate::abi::{self, AbiTable, DriverVersion};
use crate::counters::Snapshot;
use crate::decode::{self, DevKind, Outcome, ParamReader};
use crate::tracker::{NativeAnswer, Notice, Tracker, Verdict};
use core::mem::size_of;
use std::fmt::Write as _;

pub fn hex(b: &[u8]) -> String {
    let mut s = String::with_capacity(b.len() * 2);
    for x in b {
        let _ = write!(s, "{x:02x}");
    }
    s
}

pub fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect()
}

/// One `I` line.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IoctlRecord {
    pub dev: DevKind,
    pub fd: i32,
    pub request: u64,
    pub rc: i32,
    pub arg: Vec<u8>,
    /// Offset in `arg` of the parameter pointer, and the bytes it pointed to after the call.
    pub params: Option<(usize, Vec<u8>)>,
}

impl IoctlRecord {
    pub fn line(&self) -> String {
        let mut s = format!(
            "I {} {} {:x} {} {}",
            self.dev.tag(),
            self.fd,
            self.request,
            self.rc,
            hex(&self.arg)
        );
        if let Some((off, p)) = &self.params {
            let _ = write!(s, " P {off} {}", hex(p));
        }
        s
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Version(String),
    Ioctl(IoctlRecord),
    Alloc { api: String, ptr: u64, len: u64 },
    Mark(String),
}

pub fn parse_line(line: &str) -> Option<Record> {
    let line = line.trim_end();
    let (tag, rest) = line.split_once(' ').unwrap_or((line, ""));
    match tag {
        "V" => Some(Record::Version(rest.trim().to_string())),
        "M" => Some(Record::Mark(rest.to_string())),
        "A" => {
            let mut it = rest.split_whitespace();
            let api = it.next()?.to_string();
            let ptr = u64::from_str_radix(it.next()?, 16).ok()?;
            let len = u64::from_str_radix(it.next()?, 16).ok()?;
            Some(Record::Alloc { api, ptr, len })
        }
        "I" => {
            let mut it = rest.split_whitespace();
            let dev = DevKind::parse(it.next()?)?;
            let fd = it.next()?.parse().ok()?;
            let request = u64::from_str_radix(it.next()?, 16).ok()?;
            let rc = it.next()?.parse().ok()?;
            let arg = unhex(it.next()?)?;
            let params = match it.next() {
                Some("P") => Some((it.next()?.parse().ok()?, unhex(it.next()?)?)),
                Some(_) => return None,
                None => None,
            };
            Some(Record::Ioctl(IoctlRecord { dev, fd, request, rc, arg, params }))
        }
        _ => None,
    }
}

/// Where the parameter pointer of an RM call sits, and how many bytes gdrshim captures behind it.
pub fn params_spec(dev: DevKind, request: u64, arg: &[u8], t: &AbiTable) -> Option<(usize, usize)> {
    if dev == DevKind::Uvm || abi::ioc_type(request) != abi::NV_IOCTL_MAGIC {
        return None;
    }
    use core::mem::offset_of;
    match abi::ioc_nr(request) {
        abi::esc::RM_ALLOC if arg.len() == size_of::<abi::Nvos21Alloc>() => {
            let a = abi::read_pod::<abi::Nvos21Alloc>(arg)?;
            Some((
                offset_of!(abi::Nvos21Alloc, p_alloc_parms),
                decode::alloc_params_len(a.h_class, t)?,
            ))
        }
        abi::esc::RM_ALLOC if arg.len() == size_of::<abi::Nvos64Alloc>() => {
            let a = abi::read_pod::<abi::Nvos64Alloc>(arg)?;
            Some((
                offset_of!(abi::Nvos64Alloc, p_alloc_parms),
                decode::alloc_params_len(a.h_class, t)?,
            ))
        }
        abi::esc::RM_CONTROL if arg.len() == size_of::<abi::Nvos54Control>() => {
            let c = abi::read_pod::<abi::Nvos54Control>(arg)?;
            let size = c.params_size as usize;
            (size > 0 && size <= 4096).then_some((offset_of!(abi::Nvos54Control, params), size))
        }
        _ => None,
    }
}

struct Recorded<'a>(Option<&'a [u8]>);
impl ParamReader for Recorded<'_> {
    fn read(&self, _ptr: u64, len: usize) -> Option<Vec<u8>> {
        self.0.filter(|b| b.len() >= len).map(|b| b[..len].to_vec())
    }
}

/// The result of replaying a capture through the decoder, the map and the shadow oracle.
pub struct Replay {
    pub tracker: Tracker,
    pub version: Option<DriverVersion>,
    pub ioctls: u64,
    pub decoded: u64,
    pub failed: u64,
    pub malformed: u64,
    pub bad_lines: u64,
    /// User allocations the DMA-BUF route would export exactly (what the inbox RDMA stack
    /// registers), and those it would refuse.
    pub dmabuf_planned: u64,
    pub dmabuf_unplanned: u64,
    /// Human-readable report, one line per user allocation and per notable event.
    pub report: Vec<String>,
}

/// Replays capture text. The driver version comes from the `V` line; without one (or for a branch
/// with no table) nothing is decoded, exactly as in the live shim.
pub fn replay(text: &str) -> Replay {
    let mut r = Replay {
        tracker: Tracker::new(),
        version: None,
        ioctls: 0,
        decoded: 0,
        failed: 0,
        malformed: 0,
        bad_lines: 0,
        dmabuf_planned: 0,
        dmabuf_unplanned: 0,
        report: Vec::new(),
    };
    let mut table: Option<&'static AbiTable> = None;
    // A program writes its mark after the step it names: the lines since the last mark are held
    // and reported after the mark that labels them.
    let mut held: Vec<String> = Vec::new();
    let mut marks = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let Some(rec) = parse_line(line) else {
            r.bad_lines += 1;
            continue;
        };
        match rec {
            Record::Version(v) => {
                r.version = DriverVersion::parse(&v);
                table = r.version.and_then(abi::table_for);
                if table.is_none() {
                    r.report.push(format!("driver {v}: no verified ABI table, nothing decoded"));
                }
            }
            Record::Mark(m) => {
                r.report.push(format!("# {m}"));
                r.report.append(&mut held);
                marks += 1;
            }
            Record::Ioctl(io) => {
                r.ioctls += 1;
                let Some(t) = table else { continue };
                let params = Recorded(io.params.as_ref().map(|(_, b)| b.as_slice()));
                match decode::decode(io.dev, io.fd, io.request, io.rc, &io.arg, &params, t) {
                    Outcome::Event(ev) => {
                        r.decoded += 1;
                        for n in r.tracker.apply(&ev) {
                            held.push(notice_line(&n));
                        }
                    }
                    Outcome::Failed { .. } => r.failed += 1,
                    Outcome::Malformed(_) => r.malformed += 1,
                    Outcome::Ignored => {}
                }
            }
            Record::Alloc { api, .. } if api == "cuMemMap" => {
                // Early captures recorded VMM ranges at cuMemMap; libcuda maps them (and registers
                // them natively) only at cuMemSetAccess, which is the user allocation now.
                held.push("# cuMemMap record from an early capture: not a user allocation (see cuMemSetAccess)".into());
            }
            Record::Alloc { api, ptr, len } => {
                let v = r.tracker.user_allocation(ptr, len);
                held.push(verdict_line(&api, ptr, len, &v));
                // the DMA-BUF route's answer for the same allocation
                match r.tracker.dmabuf_plan(ptr, len) {
                    Ok(p) => {
                        r.dmabuf_planned += 1;
                        held.push(format!(
                            "  dma-buf: would export {} piece(s), {:#x} bytes from {:#x}",
                            p.spans.len(),
                            p.total,
                            p.base
                        ));
                    }
                    Err(m) => {
                        r.dmabuf_unplanned += 1;
                        held.push(format!("  dma-buf: would export nothing: {m}"));
                    }
                }
            }
        }
    }
    if marks > 0 && !held.is_empty() {
        r.report.push(AFTER_THE_LAST_MARK.into());
    }
    r.report.append(&mut held);
    for t in r.tracker.finish() {
        r.report.push(format!("unpredicted native registration still live at exit: {t}"));
    }
    r
}

/// The label of what a capture's program did after its last mark.
pub const AFTER_THE_LAST_MARK: &str = "# (after the last mark)";

pub fn notice_line(n: &Notice) -> String {
    match n {
        Notice::NativeRegistrationPresent => {
            "libcuda registers third-party P2P natively on this GPU (its own 503C traffic seen)"
                .into()
        }
        Notice::Unpredicted(t) => {
            format!("unpredicted native registration {t}: no user allocation covered it")
        }
        Notice::DmabufMismatch { ptr, size, native, predicted } => {
            format!("dma-buf of [{ptr:#x}, +{size:#x}): libcuda exported {native}, the map predicts {predicted}")
        }
        Notice::UnknownUvmFree { base } => {
            format!("UVM_FREE of a range never seen created at {base:#x}: dropped every mapping continuing from it")
        }
    }
}

pub fn verdict_line(api: &str, ptr: u64, len: u64, v: &Verdict) -> String {
    match v {
        Verdict::Uncovered(miss) => format!("{api} [{ptr:#x}, +{len:#x}) pass0 miss: {miss}"),
        Verdict::Covered(pieces) => {
            let mut s = format!("{api} [{ptr:#x}, +{len:#x}) pass0 hit:");
            for (t, a) in pieces {
                let _ = write!(s, " would REGISTER_VIDMEM {t}");
                match a {
                    NativeAnswer::Matched => s.push_str(" = native"),
                    NativeAnswer::Mismatched(n) => {
                        let _ = write!(s, " != native {n}");
                    }
                    NativeAnswer::None => s.push_str(" (no native registration)"),
                }
            }
            s
        }
    }
}

/// The summary counters of a replay, in the same `key=value` form as the live shim's exit line.
pub fn summary(r: &Replay) -> Snapshot {
    let mut s = Snapshot::new();
    s.counts([
        ("ioctls", r.ioctls),
        ("decoded", r.decoded),
        ("failed", r.failed),
        ("malformed", r.malformed),
    ])
    .counts(r.tracker.counts.pairs())
    .add("map_entries", r.tracker.map.entries() as u64)
    .add("dmabuf_planned", r.dmabuf_planned)
    .add("dmabuf_unplanned", r.dmabuf_unplanned);
    s
}

/// [`summary`] as its line.
pub fn summary_fields(r: &Replay) -> String {
    summary(r).line()
}

/// Nanoseconds per ioctl that the live shim's decode + map update costs, measured by replaying
/// pre-parsed records `rounds` times (parsing excluded), for the benchmark in the results.
pub fn bench_decode_apply(text: &str, rounds: u32) -> Option<(u64, f64)> {
    let mut version = None;
    let mut recs = Vec::new();
    for l in text.lines() {
        match parse_line(l) {
            Some(Record::Version(v)) => version = DriverVersion::parse(&v),
            Some(Record::Ioctl(io)) => recs.push(io),
            _ => {}
        }
    }
    let t = abi::table_for(version?)?;
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        let mut tr = Tracker::new();
        for io in &recs {
            let params = Recorded(io.params.as_ref().map(|(_, b)| b.as_slice()));
            if let Outcome::Event(ev) =
                decode::decode(io.dev, io.fd, io.request, io.rc, &io.arg, &params, t)
            {
                std::hint::black_box(tr.apply(&ev));
            }
        }
        std::hint::black_box(&tr);
    }
    let n = recs.len() as u64 * rounds as u64;
    Some((n, start.elapsed().as_nanos() as f64 / n as f64))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let io = IoctlRecord {
            dev: DevKind::Gpu(3),
            fd: 12,
            request: 0xc030462b,
            rc: 0,
            arg: vec![1, 2, 255],
            params: Some((16, vec![0xab])),
        };
        assert_eq!(parse_line(&io.line()), Some(Record::Ioctl(io.clone())));
        let io2 = IoctlRecord { params: None, dev: DevKind::Uvm, ..io };
        assert_eq!(parse_line(&io2.line()), Some(Record::Ioctl(io2)));
        assert_eq!(
            parse_line("A cuMemAlloc_v2 7f00 1000"),
            Some(Record::Alloc { api: "cuMemAlloc_v2".into(), ptr: 0x7f00, len: 0x1000 })
        );
        assert_eq!(parse_line("I c 8 zz 0 00"), None);
        assert_eq!(parse_line("I c 8 c0 0 0"), None);
        assert_eq!(parse_line("X"), None);
    }

    #[test]
    fn replay_without_a_version_decodes_nothing() {
        let r = replay("I c 8 c010462a 0 00000000000000000000000000000000\n");
        assert_eq!((r.ioctls, r.decoded), (1, 0));
        let r = replay("V 600.1.1\nI c 8 c0104629 0 00000000000000000000000000000000\n");
        assert_eq!((r.ioctls, r.decoded), (1, 0));
        let r = replay("V 580.159.04\nI c 8 c0104629 0 00000000000000000000000000000000\n");
        assert_eq!((r.ioctls, r.decoded), (1, 1));
    }
}
