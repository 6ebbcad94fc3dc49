//! What the tools' tests share: just enough JSON to check the one shape every command prints.
#![allow(dead_code)] // each test file uses its part

use std::collections::BTreeMap;

/// Just enough JSON to check the shape: objects keep their keys in order.
#[derive(Debug, Clone, PartialEq)]
pub enum J {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<J>),
    Obj(Vec<(String, J)>),
}

impl J {
    pub fn get(&self, k: &str) -> Option<&J> {
        match self {
            J::Obj(v) => v.iter().find(|(n, _)| n == k).map(|(_, j)| j),
            _ => None,
        }
    }
    pub fn keys(&self) -> Vec<&str> {
        match self {
            J::Obj(v) => v.iter().map(|(k, _)| k.as_str()).collect(),
            _ => vec![],
        }
    }
    pub fn str(&self) -> &str {
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
                while self.at < self.s.len()
                    && matches!(self.s[self.at], b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9')
                {
                    self.at += 1;
                }
                J::Num(std::str::from_utf8(&self.s[start..self.at]).unwrap().parse().unwrap())
            }
        }
    }
}

/// The one object of `out` (exactly one line).
pub fn parse(out: &str) -> J {
    assert_eq!(out.lines().count(), 1, "one line of JSON: {out}");
    let mut p = P { s: out.trim_end().as_bytes(), at: 0 };
    let v = p.value();
    assert_eq!(p.at, p.s.len(), "trailing text after the object: {out}");
    v
}

pub const STATUSES: [&str; 5] = ["PASS", "WARN", "FAIL", "INFO", "COULD NOT CHECK"];

/// The result word of an exit code.
pub fn result_word(rc: i32) -> &'static str {
    ["PASS", "FAIL", "COULD NOT CHECK"][rc as usize]
}

/// The shape every command keeps; the words of one vocabulary; `exit` the real exit code and
/// `result` its word; `tool` the command's name. Returns the object.
pub fn check_shape(tool: &str, out: &str, rc: i32) -> J {
    let j = parse(out);
    assert_eq!(
        &j.keys()[..6.min(j.keys().len())],
        ["tool", "version", "checks", "could_not_check", "result", "exit"],
        "{tool}: {out}"
    );
    assert_eq!(j.get("tool").unwrap().str(), tool, "{out}");
    assert_eq!(j.get("version").unwrap().str(), env!("CARGO_PKG_VERSION"));
    assert_eq!(j.get("exit"), Some(&J::Num(rc as f64)), "{tool}: exit is the process's: {out}");
    let want = result_word(rc);
    assert_eq!(j.get("result").unwrap().str(), want, "{tool}: {out}");
    match j.get("could_not_check").unwrap() {
        J::Null => {
            assert_ne!(want, "COULD NOT CHECK", "{tool}: could not check, with no reason: {out}")
        }
        J::Str(s) => assert!(!s.is_empty(), "{tool}"),
        other => panic!("{tool}: could_not_check is {other:?}"),
    }
    let J::Arr(checks) = j.get("checks").unwrap() else {
        panic!("{tool}: checks is no array: {out}")
    };
    for c in checks {
        assert_eq!(&c.keys()[..5], ["id", "status", "summary", "evidence", "fix"], "{tool}: {c:?}");
        assert!(
            STATUSES.contains(&c.get("status").unwrap().str()),
            "{tool}: a word outside the vocabulary: {c:?}"
        );
        let J::Arr(ev) = c.get("evidence").unwrap() else {
            panic!("{tool}: evidence is no array: {c:?}")
        };
        assert!(ev.iter().all(|e| matches!(e, J::Str(_))), "{tool}: {c:?}");
    }
    j
}

/// The statuses counted in a check list, by word.
pub fn counts(j: &J) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    if let Some(J::Arr(checks)) = j.get("checks") {
        for c in checks {
            *m.entry(c.get("status").unwrap().str().to_string()).or_default() += 1;
        }
    }
    m
}

/// `gdrshim-tool ARGS` from the repository's root, as a user runs it: (exit code, stdout, stderr).
pub fn tool(args: &[&str]) -> (i32, String, String) {
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_gdrshim-tool"))
        .current_dir(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(".."))
        .args(args)
        .env_remove("GDRSHIM_TOOL_AS")
        .output()
        .unwrap();
    let s = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (o.status.code().unwrap_or(-1), s(&o.stdout), s(&o.stderr))
}

/// The stand-in libcuda (tests/fake-libcuda.c), built once per test process into a folder named
/// by `tag`.
pub fn fake_libcuda(tag: &str) -> &'static std::path::Path {
    use std::path::{Path, PathBuf};
    static LIB: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    LIB.get_or_init(|| {
        let d = std::env::temp_dir().join(format!("gdrshim-tool-{}-{tag}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let lib = d.join("libcuda.so.1");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fake-libcuda.c");
        let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
        let st = std::process::Command::new(&cc)
            .args(["-shared", "-fPIC", "-O1", "-o"])
            .arg(&lib)
            .arg(&src)
            .status()
            .unwrap_or_else(|e| panic!("{cc}: {e}"));
        assert!(st.success(), "building {}", src.display());
        lib
    })
}

/// `span` consecutive free TCP ports on 127.0.0.1 for a test's listeners, the first returned.
/// In 10000..20000: below Linux's ephemeral range (`ip_local_port_range`) and below the ports the
/// fleet derives for a Slurm step (20000..32000). A port the kernel hands out (bind to 0)
/// and the test then gives up may be taken by any outgoing connection before the program under
/// test listens on it (CI once saw "Address already in use" so); a port below the range is only
/// ever taken by another listener, and the bind below checks there is none now. Each call starts
/// past the last one (tests of one binary run at once) from an offset of this process's id.
pub fn listen_ports(span: u16) -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (low, high) = (10000u32, ephemeral_low.min(20000).saturating_sub(span as u32 + 1));
    assert!(high > low + 1000, "ip_local_port_range starts at {ephemeral_low}: no room below it");
    let width = high - low;
    let start = std::process::id().wrapping_mul(7919);
    for _ in 0..width {
        let at = low + start.wrapping_add(NEXT.fetch_add(span as u32, Ordering::Relaxed)) % width;
        let free = (0..span as u32)
            .all(|k| std::net::TcpListener::bind(("127.0.0.1", (at + k) as u16)).is_ok());
        if free {
            return at as u16;
        }
    }
    panic!("no {span} free ports in {low}..{high}");
}
