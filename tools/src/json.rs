//! How the tools write JSON: each output is a typed model (`report::JsonReport` and the keys of a
//! command's own) that serde_json serializes on one line, keys in the model's order. Numbers with
//! a fraction have three decimals, as the text prints them (`69.350`); an object whose keys come
//! from data (the shim's counters, a node's versions) keeps them in the order found.
#![forbid(unsafe_code)]

use serde::de::{Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeMap, Serializer};
use serde::{Deserialize, Serialize};
use std::io;

/// serde_json's compact form, floats with three decimals; one that is not finite is `null` (JSON
/// has no NaN), as serde_json writes it.
struct ThreeDecimals;

impl serde_json::ser::Formatter for ThreeDecimals {
    fn write_f64<W: ?Sized + io::Write>(&mut self, w: &mut W, v: f64) -> io::Result<()> {
        if v.is_finite() {
            write!(w, "{v:.3}")
        } else {
            w.write_all(b"null")
        }
    }
    fn write_f32<W: ?Sized + io::Write>(&mut self, w: &mut W, v: f32) -> io::Result<()> {
        self.write_f64(w, f64::from(v))
    }
}

/// `v` as one line of JSON.
pub fn to_line<T: Serialize>(v: &T) -> String {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, ThreeDecimals);
    // serde_json refuses only a map key that is not a string, and a model's keys are its field
    // names or an `Ordered`'s strings; writing into a Vec cannot fail
    v.serialize(&mut ser).expect("the tools' JSON models have string keys only");
    String::from_utf8_lossy(&out).into_owned()
}

/// An object whose keys come from data, in the order found (serde_json's own map sorts them).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Ordered<V>(pub Vec<(String, V)>);

impl<V: Serialize> Serialize for Ordered<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut m = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            m.serialize_entry(k, v)?;
        }
        m.end()
    }
}

impl<'de, V: Deserialize<'de>> Deserialize<'de> for Ordered<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Entries<V>(std::marker::PhantomData<V>);
        impl<'de, V: Deserialize<'de>> Visitor<'de> for Entries<V> {
            type Value = Ordered<V>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<Ordered<V>, A::Error> {
                let mut v = Vec::new();
                while let Some(e) = m.next_entry()? {
                    v.push(e);
                }
                Ok(Ordered(v))
            }
        }
        d.deserialize_map(Entries(std::marker::PhantomData))
    }
}

/// Parses `line` as the model `T` and writes it again: the same line when the model holds every
/// key in the order written, and numbers as written (what the tests of each output check).
#[cfg(test)]
pub fn round_trip<T: Serialize + serde::de::DeserializeOwned>(line: &str) -> String {
    let model: T = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
    to_line(&model)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_have_three_decimals_and_nan_is_null() {
        #[derive(Serialize, Deserialize)]
        struct M {
            a: f64,
            b: Vec<f64>,
            c: Option<f64>,
            n: u64,
            s: String,
        }
        let m = M {
            a: 69.35,
            b: vec![0.0, 1.0 / 3.0, f64::NAN, f64::INFINITY],
            c: None,
            n: 7,
            s: "q\"\n\u{1}é".into(),
        };
        let line = to_line(&m);
        assert_eq!(
            line,
            r#"{"a":69.350,"b":[0.000,0.333,null,null],"c":null,"n":7,"s":"q\"\n\u0001é"}"#
        );
        serde_json::from_str::<serde_json::Value>(&line).unwrap();
    }

    #[test]
    fn ordered_objects_keep_their_order_both_ways() {
        let o = Ordered(vec![("zeta".to_string(), 1u64), ("alpha".into(), 2), ("mid".into(), 3)]);
        let line = to_line(&o);
        assert_eq!(line, r#"{"zeta":1,"alpha":2,"mid":3}"#);
        assert_eq!(serde_json::from_str::<Ordered<u64>>(&line).unwrap(), o);
        assert_eq!(round_trip::<Ordered<u64>>(&line), line);
        // a model that sorts its keys does not give the same line back: the check can fail
        assert_ne!(to_line(&serde_json::from_str::<serde_json::Value>(&line).unwrap()), line);
    }
}
