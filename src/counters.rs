//! Every count gdrshim keeps, with one way out: a [`Snapshot`] of `(name, value)` pairs in the
//! order the exit summary prints them. The summary line, the replay's line and
//! `gdrshim_counters` are all read from it, so a new count is a field and its pair where the
//! count lives (`ShadowCounts::pairs`, `RegCounts::pairs`, the runtime's stats).
#![forbid(unsafe_code)]

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Value {
    N(u64),
    S(String),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::N(n) => write!(f, "{n}"),
            Value::S(s) => f.write_str(s),
        }
    }
}

impl From<u64> for Value {
    fn from(n: u64) -> Value {
        Value::N(n)
    }
}
impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::S(s.to_string())
    }
}
impl From<String> for Value {
    fn from(s: String) -> Value {
        Value::S(s)
    }
}

#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    pairs: Vec<(&'static str, Value)>,
}

impl Snapshot {
    pub fn new() -> Snapshot {
        Snapshot::default()
    }

    pub fn add(&mut self, name: &'static str, v: impl Into<Value>) -> &mut Snapshot {
        debug_assert!(!self.pairs.iter().any(|(n, _)| *n == name), "{name} twice");
        self.pairs.push((name, v.into()));
        self
    }

    pub fn counts(
        &mut self,
        pairs: impl IntoIterator<Item = (&'static str, u64)>,
    ) -> &mut Snapshot {
        for (n, v) in pairs {
            self.add(n, v);
        }
        self
    }

    /// A count by name (`None`: absent, or not a number).
    pub fn get(&self, name: &str) -> Option<u64> {
        self.pairs.iter().find(|(n, _)| *n == name).and_then(|(_, v)| match v {
            Value::N(n) => Some(*n),
            Value::S(_) => None,
        })
    }

    pub fn pairs(&self) -> &[(&'static str, Value)] {
        &self.pairs
    }

    /// `name=value name=value …`, as the summary prints it.
    pub fn line(&self) -> String {
        let mut s = String::new();
        for (i, (n, v)) in self.pairs.iter().enumerate() {
            if i > 0 {
                s.push(' ');
            }
            s.push_str(n);
            s.push('=');
            s.push_str(&v.to_string());
        }
        s
    }
}

/// `struct gdrshim_counters` in `include/gdrshim.h`; new fields only ever go at the end. Each
/// field is the summary's count of the same name.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GdrshimCounters {
    pub nv_ioctls: u64,
    pub native: u64,
    pub matched: u64,
    pub mismatched: u64,
    pub unpredicted: u64,
    pub pass0_hits: u64,
    pub pass0_misses: u64,
    pub registered: u64,
    pub unregistered: u64,
    pub rm_errors: u64,
    pub live_registrations: u64,
    pub host_mrs: u64,
    pub stood_aside: u64,
    // added after 0.2.0: the DMA-BUF route's buffers and bytes
    pub dmabuf_exports: u64,
    pub dmabuf_reused: u64,
    pub dmabuf_buffers: u64,
    pub registered_bytes: u64,
    pub registered_peak_bytes: u64,
    pub exported_bytes: u64,
    pub exported_peak_bytes: u64,
    // added after 0.2.0: the BAR1 of the GPUs exported on
    pub bar1_bytes: u64,
    pub bar1_static: u64,
}
const FIELDS: usize = 22;
const _: () = assert!(core::mem::size_of::<GdrshimCounters>() == FIELDS * 8);

impl GdrshimCounters {
    /// The header's counters from a snapshot (a count it lacks is `u64::MAX`: unknown).
    pub fn from_snapshot(s: &Snapshot) -> GdrshimCounters {
        let g = |n: &str| s.get(n).unwrap_or(u64::MAX);
        GdrshimCounters {
            nv_ioctls: g("nv_ioctls"),
            native: g("native"),
            matched: g("matched"),
            mismatched: g("mismatched"),
            unpredicted: g("unpredicted"),
            pass0_hits: g("pass0_hits"),
            pass0_misses: g("pass0_misses"),
            registered: g("registered"),
            unregistered: g("unregistered"),
            rm_errors: g("rm_errors"),
            live_registrations: g("live_registrations"),
            host_mrs: g("host_mrs"),
            stood_aside: g("stood_aside"),
            dmabuf_exports: g("dmabuf_exports"),
            dmabuf_reused: g("dmabuf_reused"),
            dmabuf_buffers: g("dmabuf_buffers"),
            registered_bytes: g("registered_bytes"),
            registered_peak_bytes: g("registered_peak_bytes"),
            exported_bytes: g("exported_bytes"),
            exported_peak_bytes: g("exported_peak_bytes"),
            bar1_bytes: g("bar1_bytes"),
            bar1_static: g("bar1_static"),
        }
    }

    /// The C struct's bytes (for the copy into the caller's struct).
    pub fn to_bytes(&self) -> [u8; FIELDS * 8] {
        let mut b = [0u8; FIELDS * 8];
        let f = [
            self.nv_ioctls,
            self.native,
            self.matched,
            self.mismatched,
            self.unpredicted,
            self.pass0_hits,
            self.pass0_misses,
            self.registered,
            self.unregistered,
            self.rm_errors,
            self.live_registrations,
            self.host_mrs,
            self.stood_aside,
            self.dmabuf_exports,
            self.dmabuf_reused,
            self.dmabuf_buffers,
            self.registered_bytes,
            self.registered_peak_bytes,
            self.exported_bytes,
            self.exported_peak_bytes,
            self.bar1_bytes,
            self.bar1_static,
        ];
        for (i, v) in f.iter().enumerate() {
            b[i * 8..i * 8 + 8].copy_from_slice(&v.to_ne_bytes());
        }
        b
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_snapshot_is_the_summary_line_and_the_c_counters() {
        let mut s = Snapshot::new();
        s.add("mode", "shadow").counts([("nv_ioctls", 7), ("native", 2), ("matched", 2)]);
        assert_eq!(s.line(), "mode=shadow nv_ioctls=7 native=2 matched=2");
        assert_eq!(s.get("mode"), None);
        let c = GdrshimCounters::from_snapshot(&s);
        assert_eq!((c.nv_ioctls, c.native, c.matched, c.registered), (7, 2, 2, u64::MAX));
        assert_eq!(&c.to_bytes()[8..16], &2u64.to_ne_bytes());
        s.counts([("exported_peak_bytes", 0x40_0000)]);
        let c = GdrshimCounters::from_snapshot(&s);
        assert_eq!(
            &c.to_bytes()[19 * 8..20 * 8],
            &0x40_0000u64.to_ne_bytes(),
            "exported_peak_bytes, after the older fields"
        );
        s.counts([("bar1_bytes", 256 << 20), ("bar1_static", 0)]);
        let c = GdrshimCounters::from_snapshot(&s);
        assert_eq!(
            &c.to_bytes()[20 * 8..],
            &[(256u64 << 20).to_ne_bytes(), 0u64.to_ne_bytes()].concat()[..],
            "the BAR1 fields, at the end"
        );
    }
}
