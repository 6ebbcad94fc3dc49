//! Hostile input for the decoders, the tracker behind them, the capture parser and the env
//! parser: random and mutated bytes, never a panic, never a read past what the request encodes
//! (the decoder only ever sees a slice of exactly that length, so a read past it would panic).
//! Seeds are the ioctls of the H200 captures. `GDRSHIM_FUZZ_ITERS` sets the number of decoder
//! inputs (default 10 000 000; CI runs the default).

use gdrshim::capture::{parse_line, Record};
use gdrshim::config::Config;
use gdrshim::decode::{self, DevKind, Outcome, ParamReader};
use gdrshim::tracker::Tracker;
use std::io::Read;

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// Parameter memory that is sometimes unreadable and otherwise random (or the recorded bytes).
struct RandomParams {
    seed: std::cell::Cell<u64>,
    recorded: Option<Vec<u8>>,
}
impl ParamReader for RandomParams {
    fn read(&self, _ptr: u64, len: usize) -> Option<Vec<u8>> {
        let mut r = Rng(self.seed.get() | 1);
        self.seed.set(r.next());
        match r.below(4) {
            0 => None,
            1 => self.recorded.clone().filter(|p| p.len() == len),
            _ => Some((0..len).map(|_| r.next() as u8).collect()),
        }
    }
}

fn seeds() -> Vec<gdrshim::capture::IoctlRecord> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
    let mut out = Vec::new();
    for name in ["alloc-probe.cap.gz", "torch-nccl.cap.gz"] {
        let mut s = String::new();
        flate2::read::GzDecoder::new(std::fs::File::open(dir.join(name)).unwrap())
            .read_to_string(&mut s)
            .unwrap();
        out.extend(s.lines().filter_map(|l| match parse_line(l) {
            Some(Record::Ioctl(io)) => Some(io),
            _ => None,
        }));
    }
    out
}

#[test]
fn decoders_and_tracker_survive_random_and_mutated_input() {
    let iters: u64 =
        std::env::var("GDRSHIM_FUZZ_ITERS").ok().and_then(|v| v.parse().ok()).unwrap_or(10_000_000);
    let table =
        gdrshim::abi::table_for(gdrshim::abi::DriverVersion::parse("580.159.04").unwrap()).unwrap();
    let seeds = seeds();
    assert!(seeds.len() > 1000, "seeds from the captures");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut tracker = Tracker::new();
    let (mut events, mut malformed, mut other) = (0u64, 0u64, 0u64);
    let mut buf = Vec::with_capacity(16 << 10);
    for i in 0..iters {
        let s = &seeds[rng.below(seeds.len() as u64) as usize];
        let (dev, request) = match rng.below(16) {
            // a request word nobody sent: random number, size and direction bits
            0 => (
                [DevKind::Ctl, DevKind::Uvm, DevKind::Gpu(0)][rng.below(3) as usize],
                rng.next() & 0xffff_ffff,
            ),
            _ => (s.dev, s.request),
        };
        let want = decode::arg_len(dev, request, table);
        buf.clear();
        buf.extend_from_slice(&s.arg);
        // mutate: a few random bytes, a random 32-bit word (handles, classes, sizes, statuses)
        for _ in 0..rng.below(4) {
            if !buf.is_empty() {
                let at = rng.below(buf.len() as u64) as usize;
                buf[at] = rng.next() as u8;
            }
        }
        if buf.len() >= 4 && rng.below(2) == 0 {
            let at = rng.below(buf.len() as u64 - 3) as usize & !3;
            let w =
                [0u32, 1, u32::MAX, 0x503c, 0x80, 0x2000, rng.next() as u32][rng.below(7) as usize];
            buf[at..at + 4].copy_from_slice(&w.to_le_bytes());
        }
        // the length: usually what the request encodes, sometimes not (the hook never does that,
        // the decoder must still refuse it cleanly)
        let len = match (want, rng.below(8)) {
            (Some(n), 0) => rng.below(n as u64 + 64) as usize,
            (Some(n), _) => n,
            (None, _) => rng.below(512) as usize,
        };
        buf.resize(len, 0);
        let params = RandomParams {
            seed: std::cell::Cell::new(rng.next()),
            recorded: s.params.as_ref().map(|p| p.1.clone()),
        };
        let rc = if rng.below(32) == 0 { -1 } else { 0 };
        match decode::decode(dev, s.fd, request, rc, &buf, &params, table) {
            Outcome::Event(ev) => {
                events += 1;
                // the map and object tree take whatever the decoder lets through
                let _ = tracker.apply(&ev);
                if i % 200_000 == 0 {
                    tracker = Tracker::new();
                }
            }
            Outcome::Malformed(_) => malformed += 1,
            _ => other += 1,
        }
    }
    eprintln!("fuzz: {iters} decoder inputs: {events} events applied, {malformed} malformed, {other} failed/ignored");
    assert_eq!(events + malformed + other, iters);
    assert!(events > iters / 10, "the mutations must still reach the decoders' event paths");
    assert!(malformed > 0, "wrong lengths must be seen as malformed");
}

#[test]
fn capture_lines_and_env_values_of_any_bytes() {
    let mut rng = Rng(42);
    let alphabet: Vec<char> =
        " IVAMucg0123456789abcdefxP\t\n%=-+.:\u{1b}\u{0}é😀/".chars().collect();
    let vars = [
        "GDRSHIM_MODE",
        "GDRSHIM_LOG_LEVEL",
        "GDRSHIM_LOG_FILE",
        "GDRSHIM_CAPTURE",
        "GDRSHIM_SUMMARY",
        "GDRSHIM_EAGER",
        "GDRSHIM_TIMING",
        "GDRSHIM_ADVERTISE_GDR",
        "GDRSHIM_TEST_HIDE_GDR",
        "NCCL_GDR_FLUSH_DISABLE",
        "NCCL_NET_FORCE_FLUSH",
    ];
    for _ in 0..200_000 {
        let n = rng.below(80) as usize;
        let s: String =
            (0..n).map(|_| alphabet[rng.below(alphabet.len() as u64) as usize]).collect();
        let _ = parse_line(&s);
        let _ = parse_line(&format!("I ctl 3 c020462a 0 {}", s));
        let var = vars[(n % vars.len()).min(vars.len() - 1)];
        let (c, warnings) = Config::from_env(|k| (k == var).then(|| s.clone()));
        // a GDRSHIM_MODE of garbage never turns registration on (register is the default otherwise)
        if var == "GDRSHIM_MODE" && c.mode == gdrshim::config::Mode::Register {
            assert!(matches!(s.trim().to_ascii_lowercase().as_str(), "register" | "on"), "{s:?}");
        }
        assert!(warnings.len() <= 1);
    }
}
