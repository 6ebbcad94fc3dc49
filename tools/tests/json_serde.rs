//! Every command's JSON read by serde_json, a strict reader (no NaN, no trailing comma, escapes as
//! JSON has them): it reads what the order-keeping reader of the shape tests reads, keys in the
//! same order, and what it reads it writes back and reads again the same. The typed models each
//! round-trip byte for byte in the tool's own tests (`json::round_trip`).

mod common;

use common::{tool, J};
use serde::de::{Deserializer, MapAccess, SeqAccess, Visitor};
use serde::ser::{SerializeMap, SerializeSeq, Serializer};
use serde::{Deserialize, Serialize};

/// serde's view of the shape tests' value: objects keep their keys in order.
impl<'de> Deserialize<'de> for J {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<J, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = J;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("JSON")
            }
            fn visit_unit<E>(self) -> Result<J, E> {
                Ok(J::Null)
            }
            fn visit_bool<E>(self, b: bool) -> Result<J, E> {
                Ok(J::Bool(b))
            }
            fn visit_u64<E>(self, n: u64) -> Result<J, E> {
                Ok(J::Num(n as f64))
            }
            fn visit_i64<E>(self, n: i64) -> Result<J, E> {
                Ok(J::Num(n as f64))
            }
            fn visit_f64<E>(self, n: f64) -> Result<J, E> {
                Ok(J::Num(n))
            }
            fn visit_str<E>(self, s: &str) -> Result<J, E> {
                Ok(J::Str(s.to_string()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut a: A) -> Result<J, A::Error> {
                let mut v = Vec::new();
                while let Some(x) = a.next_element()? {
                    v.push(x);
                }
                Ok(J::Arr(v))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<J, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = m.next_entry()? {
                    v.push(e);
                }
                Ok(J::Obj(v))
            }
        }
        d.deserialize_any(V)
    }
}

impl Serialize for J {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            J::Null => s.serialize_unit(),
            J::Bool(b) => s.serialize_bool(*b),
            J::Num(n) => s.serialize_f64(*n),
            J::Str(t) => s.serialize_str(t),
            J::Arr(v) => {
                let mut q = s.serialize_seq(Some(v.len()))?;
                for x in v {
                    q.serialize_element(x)?;
                }
                q.end()
            }
            J::Obj(v) => {
                let mut m = s.serialize_map(Some(v.len()))?;
                for (k, x) in v {
                    m.serialize_entry(k, x)?;
                }
                m.end()
            }
        }
    }
}

/// `text` read by serde_json as the shape tests read `shape_view`, written and read back the same.
fn reads_and_round_trips(what: &str, text: &str, shape_view: &J) {
    let strict: J = serde_json::from_str(text).unwrap_or_else(|e| panic!("{what}: {e}: {text}"));
    assert_eq!(&strict, shape_view, "{what}: serde_json and the shape reader differ");
    serde_json::from_str::<serde_json::Value>(text).unwrap();
    let again = serde_json::to_string(&strict).unwrap();
    assert_eq!(serde_json::from_str::<J>(&again).unwrap(), strict, "{what}: {again}");
}

#[test]
fn every_commands_json_is_read_by_serde_json_and_round_trips() {
    let dir = std::env::temp_dir().join(format!("gdrshim-json-serde-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("rel/lib")).unwrap();
    for f in ["lib/libgdrshim.so", "lib/libgdrshim-core.so"] {
        std::fs::write(dir.join("rel").join(f), f).unwrap();
    }
    let rel = dir.join("rel").display().to_string();
    let spec = dir.join("gdrshim.json").display().to_string();
    let ok = "tests/fixtures/state/rig-4090-ok";
    let bad = "tests/fixtures/state/rig-4090-bad";
    let log = "tests/fixtures/nccl-logs/h200-allreduce-stock.log";
    let runs: &[&[&str]] = &[
        &["doctor", "--from", ok],
        &["doctor", "--from", bad],
        &["doctor", "--from", "/nonexistent/state"],
        &["verify-run", "--nccl-log", log],
        &["verify-run", "--expect-gdr", "--nccl-log", log],
        &["dmabuf-probe", "--libcuda", "/nonexistent/libcuda.so.1"],
        &["selftest", "--shim", "/nonexistent/libgdrshim.so"],
        &["env"],
        &["env", "GDRSHIM_MODE=sure", "GDRSHIM_ROUTE=dmabuf"],
        &["version"],
        &["report", "--from", ok],
        &["report", "--from", bad, "--private"],
        &["cdi", "--from", ok, "--release", &rel, "--out", &spec],
        &["cdi", "--from", "tests/fixtures/state/no-nic", "--release", &rel],
        // no launcher: a fleet of this one task
        &["fleet", "--size", "64K"],
    ];
    for args in runs {
        let (rc, out, err) = tool(&[args, &["--json"][..]].concat());
        assert!((0..=2).contains(&rc), "{args:?}: {err}");
        let shape = common::check_shape(args[0], &out, rc);
        reads_and_round_trips(&format!("{args:?}"), out.trim_end(), &shape);
    }
    // the spec file (pretty, several lines), as the CDI consumers read it
    let text = std::fs::read_to_string(&spec).unwrap();
    let shape = common::parse(&text.split_whitespace().collect::<Vec<_>>().join(" "));
    reads_and_round_trips("the CDI spec", &text, &shape);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_strict_reader_refuses_what_is_no_json() {
    // the check above can fail: what the hand-made JSON could once print is refused
    for bad in [
        r#"{"gbps":NaN}"#,
        r#"{"a":1,}"#,
        r#"{"a":"tab	inside"}"#,
        r#"{"a":007}"#,
        r#"{"a":1} {"b":2}"#,
    ] {
        assert!(serde_json::from_str::<J>(bad).is_err(), "{bad}");
    }
}
