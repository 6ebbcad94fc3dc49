//! One JSON shape and one vocabulary for every command's `--json` (issue 31; the README's "The
//! tools' JSON"): `{"tool","version","checks":[{"id","status","summary","evidence":[…],"fix"…}…],
//! "could_not_check","result","exit"…}`, statuses PASS WARN FAIL INFO COULD NOT CHECK, results
//! PASS FAIL COULD NOT CHECK, and `exit` the process's own exit code. An error that stops a
//! command is that object too.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

/// Just enough JSON to check the shape: objects keep their keys in order.
#[derive(Debug, Clone, PartialEq)]
enum J {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    fn get(&self, k: &str) -> Option<&J> {
        match self {
            J::Obj(v) => v.iter().find(|(n, _)| n == k).map(|(_, j)| j),
            _ => None,
        }
    }
    fn keys(&self) -> Vec<&str> {
        match self {
            J::Obj(v) => v.iter().map(|(k, _)| k.as_str()).collect(),
            _ => vec![],
        }
    }
    fn str(&self) -> &str {
        match self {
            J::Str(s) => s,
            other => panic!("not a string: {other:?}"),
        }
    }
}

struct P<'a> {
    s: &'a [u8],
    at: usize,
}

impl P<'_> {
    fn ws(&mut self) {
        while self.at < self.s.len() && self.s[self.at].is_ascii_whitespace() {
            self.at += 1;
        }
    }
    fn eat(&mut self, c: u8) {
        self.ws();
        assert_eq!(self.s.get(self.at), Some(&c), "expected {:?} at {}", c as char, self.at);
        self.at += 1;
    }
    fn string(&mut self) -> String {
        self.eat(b'"');
        let mut out = String::new();
        loop {
            let c = self.s[self.at];
            self.at += 1;
            match c {
                b'"' => return out,
                b'\\' => {
                    let e = self.s[self.at];
                    self.at += 1;
                    match e {
                        b'n' => out.push('\n'),
                        b't' => out.push('\t'),
                        b'r' => out.push('\r'),
                        b'u' => {
                            let h = std::str::from_utf8(&self.s[self.at..self.at + 4]).unwrap();
                            out.push(char::from_u32(u32::from_str_radix(h, 16).unwrap()).unwrap());
                            self.at += 4;
                        }
                        other => out.push(other as char),
                    }
                }
                _ => {
                    // a UTF-8 sequence: copy its bytes whole
                    let start = self.at - 1;
                    let len = if c < 0x80 {
                        1
                    } else if c >= 0xf0 {
                        4
                    } else if c >= 0xe0 {
                        3
                    } else {
                        2
                    };
                    out.push_str(std::str::from_utf8(&self.s[start..start + len]).unwrap());
                    self.at = start + len;
                }
            }
        }
    }
    fn value(&mut self) -> J {
        self.ws();
        match self.s[self.at] {
            b'{' => {
                self.at += 1;
                let mut v = Vec::new();
                self.ws();
                if self.s[self.at] == b'}' {
                    self.at += 1;
                    return J::Obj(v);
                }
                loop {
                    let k = self.string();
                    self.eat(b':');
                    let val = self.value();
                    assert!(!v.iter().any(|(n, _)| *n == k), "key {k} twice");
                    v.push((k, val));
                    self.ws();
                    let c = self.s[self.at];
                    self.at += 1;
                    if c == b'}' {
                        return J::Obj(v);
                    }
                    assert_eq!(c, b',', "at {}", self.at);
                }
            }
            b'[' => {
                self.at += 1;
                let mut v = Vec::new();
                self.ws();
                if self.s[self.at] == b']' {
                    self.at += 1;
                    return J::Arr(v);
                }
                loop {
                    v.push(self.value());
                    self.ws();
                    let c = self.s[self.at];
                    self.at += 1;
                    if c == b']' {
                        return J::Arr(v);
                    }
                    assert_eq!(c, b',', "at {}", self.at);
                }
            }
            b'"' => J::Str(self.string()),
            b'n' => {
                self.at += 4;
                J::Null
            }
            b't' => {
                self.at += 4;
                J::Bool(true)
            }
            b'f' => {
                self.at += 5;
                J::Bool(false)
            }
            _ => {
                let start = self.at;
                while self.at < self.s.len() && matches!(self.s[self.at], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9') {
                    self.at += 1;
                }
                J::Num(std::str::from_utf8(&self.s[start..self.at]).unwrap().parse().unwrap())
            }
        }
    }
}

/// The one object of `out` (exactly one line).
fn parse(out: &str) -> J {
    assert_eq!(out.lines().count(), 1, "one line of JSON: {out}");
    let mut p = P { s: out.trim_end().as_bytes(), at: 0 };
    let v = p.value();
    assert_eq!(p.at, p.s.len(), "trailing text after the object: {out}");
    v
}

const STATUSES: [&str; 5] = ["PASS", "WARN", "FAIL", "INFO", "COULD NOT CHECK"];

/// The shape every command keeps; the words of one vocabulary; `exit` the real exit code.
fn check_shape(tool: &str, out: &str, rc: i32) -> J {
    let j = parse(out);
    assert_eq!(&j.keys()[..6], ["tool", "version", "checks", "could_not_check", "result", "exit"], "{tool}: {out}");
    assert_eq!(j.get("tool").unwrap().str(), tool);
    assert_eq!(j.get("version").unwrap().str(), env!("CARGO_PKG_VERSION"));
    assert_eq!(j.get("exit"), Some(&J::Num(rc as f64)), "{tool}: exit is the process's: {out}");
    let want = ["PASS", "FAIL", "COULD NOT CHECK"][rc as usize];
    assert_eq!(j.get("result").unwrap().str(), want, "{tool}: {out}");
    match j.get("could_not_check").unwrap() {
        J::Null => assert_ne!(want, "COULD NOT CHECK", "{tool}: could not check, with no reason: {out}"),
        J::Str(s) => assert!(!s.is_empty(), "{tool}"),
        other => panic!("{tool}: could_not_check is {other:?}"),
    }
    let J::Arr(checks) = j.get("checks").unwrap() else { panic!("{tool}: checks is no array: {out}") };
    for c in checks {
        assert_eq!(&c.keys()[..5], ["id", "status", "summary", "evidence", "fix"], "{tool}: {c:?}");
        assert!(STATUSES.contains(&c.get("status").unwrap().str()), "{tool}: a word outside the vocabulary: {c:?}");
        let J::Arr(ev) = c.get("evidence").unwrap() else { panic!("{tool}: evidence is no array: {c:?}") };
        assert!(ev.iter().all(|e| matches!(e, J::Str(_))), "{tool}: {c:?}");
    }
    j
}

fn tool(args: &[&str]) -> (i32, String, String) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let o = Command::new(env!("CARGO_BIN_EXE_gdrshim-tool")).current_dir(root).args(args).output().unwrap();
    (o.status.code().unwrap(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn every_command_prints_one_shape_and_one_vocabulary() {
    let mut seen: BTreeMap<&str, Vec<i32>> = BTreeMap::new();
    let runs: &[(&str, &[&str])] = &[
        ("doctor", &["doctor", "--json", "--from", "tests/fixtures/state/rig-4090-ok"]),
        ("doctor", &["doctor", "--json", "--from", "tests/fixtures/state/rig-4090-bad"]),
        ("verify-run", &["verify-run", "--json", "--nccl-log", "tests/fixtures/nccl-logs/h200-allreduce-stock.log"]),
        ("verify-run", &["verify-run", "--json", "--expect-gdr", "--nccl-log", "tests/fixtures/nccl-logs/h200-allreduce-stock.log"]),
        // no libcuda: could not check, with the reason
        ("dmabuf-probe", &["dmabuf-probe", "--json", "--libcuda", "/nonexistent/libcuda.so.1"]),
        // an error that stops a command is the object too
        ("selftest", &["selftest", "--json", "--shim", "/nonexistent/libgdrshim.so"]),
        ("doctor", &["doctor", "--json", "--from", "/nonexistent/state"]),
    ];
    for (name, args) in runs {
        let (rc, out, err) = tool(args);
        assert!((0..=2).contains(&rc), "{args:?}: {err}");
        let j = check_shape(name, &out, rc);
        seen.entry(name).or_default().push(rc);
        if rc == 2 {
            assert!(matches!(j.get("could_not_check"), Some(J::Str(_))), "{args:?}: {out}");
        }
    }
    assert_eq!(seen["verify-run"], [0, 1], "a pass and a fail");
    assert_eq!(seen["doctor"], [0, 1, 2], "ready, not ready, not a state");
    assert_eq!(seen["dmabuf-probe"], [2]);
    let (_, out, _) = tool(&["selftest", "--json", "--shim", "/nonexistent/libgdrshim.so"]);
    let j = parse(&out);
    assert!(j.get("could_not_check").unwrap().str().starts_with("--shim /nonexistent/libgdrshim.so: "), "{out}");
}

#[test]
fn the_text_says_the_same_words() {
    // a check the probe could not make is COULD NOT CHECK in the text as in the JSON
    let (rc, out, _) = tool(&["dmabuf-probe", "--libcuda", "/nonexistent/libcuda.so.1"]);
    assert_eq!(rc, 2);
    assert!(out.contains("could not check here: "), "{out}");
    assert!(!out.contains("COULD-NOT-CHECK") && !out.contains("could_not_check"), "{out}");
}
