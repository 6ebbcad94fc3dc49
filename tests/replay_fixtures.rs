//! The decoder and the map on raw bytes captured on the H200 (driver 580.159.04, CUDA 13.0).

use gdrshim::abi::{self, DriverVersion};
use gdrshim::capture::{parse_line, replay, Record};
use gdrshim::decode::{decode, Event, Outcome, P2pCtrl, ParamReader};
use std::io::Read;

fn fixture(name: &str) -> String {
    let p = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name);
    let mut s = String::new();
    flate2::read::GzDecoder::new(std::fs::File::open(p).unwrap()).read_to_string(&mut s).unwrap();
    s
}

struct Bytes(Option<Vec<u8>>);
impl ParamReader for Bytes {
    fn read(&self, _: u64, len: usize) -> Option<Vec<u8>> {
        self.0.as_ref().filter(|b| b.len() >= len).map(|b| b[..len].to_vec())
    }
}

fn events(text: &str) -> Vec<Event> {
    let t = abi::table_for(DriverVersion(580, 159, 4)).unwrap();
    let mut v = Vec::new();
    for l in text.lines() {
        if let Some(Record::Ioctl(io)) = parse_line(l) {
            match decode(io.dev, io.fd, io.request, io.rc, &io.arg, &Bytes(io.params.map(|p| p.1)), t) {
                Outcome::Event(e) => v.push(e),
                Outcome::Malformed(why) => panic!("malformed on real traffic: {why}: {l:.120}"),
                _ => {}
            }
        }
    }
    v
}

#[test]
fn native_registration_sequence_decodes_as_the_fact_sheet_says() {
    let ev = events(&fixture("alloc-probe.cap.gz"));
    let p2p = ev.iter().filter(|e| matches!(e, Event::P2pAlloc { .. })).collect::<Vec<_>>();
    assert_eq!(p2p.len(), 1, "one 503C per context");
    assert!(matches!(p2p[0], Event::P2pAlloc { flags: 1, .. }), "TYPE_BAR1");
    assert!(ev.iter().any(|e| matches!(e, Event::P2pControl { ctrl: P2pCtrl::RegisterVaSpace { token: 0xfe00, .. }, .. })));
    // cudaMalloc(64 MiB): REGISTER_VIDMEM of a 64 MiB vidmem object, then its UVM map at the same VA.
    let (h, addr) = ev
        .iter()
        .find_map(|e| match e {
            Event::P2pControl { ctrl: P2pCtrl::RegisterVidmem { h_memory, address, size: 0x400_0000, offset: 0 }, .. } => {
                Some((*h_memory, *address))
            }
            _ => None,
        })
        .expect("64 MiB registration");
    assert!(ev.iter().any(|e| matches!(e, Event::Memory { h_memory, class: 0x40, size: Some(0x400_0000), .. } if *h_memory == h)));
    assert!(ev.iter().any(|e| matches!(e, Event::UvmMapExternal { base, length: 0x400_0000, h_memory, gpus, .. } if *base == addr && *h_memory == h && gpus.len() == 1)));
    assert!(ev.iter().any(|e| matches!(e, Event::UvmRegisterGpuVaSpace { .. })));
    assert!(ev.iter().any(|e| matches!(e, Event::Device { device_id: 0, .. })));
}

#[test]
fn every_fixture_replays_without_malformed_or_mismatched() {
    for f in ["alloc-probe.cap.gz", "torch-alloc.cap.gz", "torch-exp.cap.gz", "torch-nccl.cap.gz", "bar1-readback.cap.gz"] {
        let r = replay(&fixture(f));
        assert_eq!((r.malformed, r.bad_lines), (0, 0), "{f}");
        assert!(r.decoded > 100, "{f}: decoded {}", r.decoded);
        assert_eq!(r.tracker.counts.mismatched, 0, "{f}");
        assert!(r.tracker.counts.native > 0, "{f}: the H200 registers natively");
    }
}
