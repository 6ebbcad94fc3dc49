//! Checks and their report, one form for every command: each check says PASS, WARN, FAIL, INFO
//! (seen, not judged) or COULD NOT CHECK, the evidence that decided it, and for anything short of
//! PASS what to do (`fix`, the one place for the advice); the text ends with one `RESULT:` line
//! that says what the JSON's `result` and `could_not_check` say.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt::Write as _;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Status {
    Pass,
    Info,
    Warn,
    /// The check could not be made here (no libcuda, no GPU, no HCA, a log with no entries…):
    /// never a pass; the command exits 2 unless a check FAILs.
    CouldNotCheck,
    Fail,
}

/// Every status, in the order the closing line counts them.
pub const STATUSES: [Status; 5] =
    [Status::Pass, Status::Warn, Status::Fail, Status::Info, Status::CouldNotCheck];

impl Status {
    pub fn word(self) -> &'static str {
        match self {
            Status::Pass => "PASS",
            Status::Info => "INFO",
            Status::Warn => "WARN",
            Status::CouldNotCheck => COULD_NOT_CHECK,
            Status::Fail => "FAIL",
        }
    }
}

/// In the JSON as in the text: its word.
impl Serialize for Status {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.word())
    }
}

impl<'de> Deserialize<'de> for Status {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let w = String::deserialize(d)?;
        STATUSES.into_iter().find(|s| s.word() == w).ok_or_else(|| {
            serde::de::Error::custom(format!(
                "{w:?} is no status (PASS, WARN, FAIL, INFO, {COULD_NOT_CHECK})"
            ))
        })
    }
}

/// One check; in the JSON its five keys in this order, then any of its command's own
/// ([`JsonCheck`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Check {
    pub id: String,
    pub status: Status,
    /// One line: what was found.
    pub summary: String,
    /// The line(s) of input, or the call, that decided it.
    pub evidence: Vec<String>,
    /// What to do about it (empty on PASS).
    pub fix: String,
}

impl Check {
    pub fn new(id: &str, status: Status, summary: impl Into<String>) -> Check {
        Check {
            id: id.to_string(),
            status,
            summary: summary.into(),
            evidence: Vec::new(),
            fix: String::new(),
        }
    }
    pub fn evidence(mut self, line: impl Into<String>) -> Check {
        let l: String = line.into();
        self.evidence.push(l.trim_end().chars().take(300).collect());
        self
    }
    pub fn fix(mut self, f: impl Into<String>) -> Check {
        self.fix = f.into();
        self
    }
}

#[derive(Default, Debug)]
pub struct Report {
    pub checks: Vec<Check>,
    /// Why what the command is for could not be checked here (no driver, no GPU, no libcuda…):
    /// then, unless a check FAILs, the verdict is "could not check", exit 2, never a pass.
    pub unchecked: Option<String>,
}

impl Report {
    pub fn push(&mut self, c: Check) {
        self.checks.push(c);
    }
    pub fn failed(&self) -> bool {
        self.checks.iter().any(|c| c.status == Status::Fail)
    }
    /// Marks the report "could not check" with the reason (the first reason given is kept).
    pub fn could_not_check(&mut self, why: impl Into<String>) {
        self.unchecked.get_or_insert_with(|| why.into());
    }
    /// Why something could not be checked: the reason given, else the first COULD NOT CHECK check.
    pub fn unchecked_reason(&self) -> Option<String> {
        self.unchecked.clone().or_else(|| {
            self.checks
                .iter()
                .find(|c| c.status == Status::CouldNotCheck)
                .map(|c| format!("{}: {}", c.id, c.summary))
        })
    }
    /// 1 when a check failed, else 2 when something could not be checked here, else 0.
    pub fn exit_code(&self) -> u8 {
        if self.failed() {
            1
        } else if self.unchecked_reason().is_some() {
            2
        } else {
            0
        }
    }
    #[cfg(test)]
    pub fn get(&self, id: &str) -> Option<&Check> {
        self.checks.iter().find(|c| c.id == id)
    }

    /// One check's lines: `STATUS  LABEL  summary`, its evidence, its fix. `label` is the id (the
    /// self-test puts its step before it).
    pub fn check_lines(&self, s: &mut String, c: &Check, label: &str) {
        let w = self.checks.iter().map(|c| c.status.word().len()).max().unwrap_or(4);
        let _ = writeln!(s, "{:<w$} {label:<28} {}", c.status.word(), c.summary);
        for e in &c.evidence {
            let _ = writeln!(s, "{:<w$} {:<28} | {e}", "", "");
        }
        if !c.fix.is_empty() {
            let _ = writeln!(s, "{:<w$} {:<28} fix: {}", "", "", c.fix);
        }
    }

    /// The closing line: `RESULT: WORD (N checks: a PASS, b WARN, c FAIL, d INFO, e COULD NOT
    /// CHECK)`, then `; could not check here: why` when something could not be checked.
    pub fn closing_line(&self) -> String {
        let counts: Vec<String> = STATUSES
            .iter()
            .map(|st| {
                format!("{} {}", self.checks.iter().filter(|c| c.status == *st).count(), st.word())
            })
            .collect();
        let n = self.checks.len();
        let mut line = format!(
            "RESULT: {} ({n} check{}: {})",
            result_word(self.exit_code()),
            if n == 1 { "" } else { "s" },
            counts.join(", ")
        );
        if let Some(why) = self.unchecked_reason() {
            let _ = write!(line, "; could not check here: {why}");
        }
        line.push('\n');
        line
    }

    pub fn text(&self) -> String {
        let mut s = String::new();
        for c in &self.checks {
            self.check_lines(&mut s, c, &c.id);
        }
        s + &self.closing_line()
    }

    /// The report as the tools' one JSON object ([`JsonReport`]), no keys of the command's own.
    pub fn json(&self, tool: &str) -> String {
        let m: PlainJson = self.json_model(tool, |_| NoKeys {}, NoKeys {});
        crate::json::to_line(&m)
    }

    /// The JSON object with keys of a command's own: `check_keys(i)` after check i's five, `own`
    /// after `exit`.
    pub fn json_with<C: Serialize, K: Serialize>(
        &self,
        tool: &str,
        check_keys: impl Fn(usize) -> C,
        own: K,
    ) -> String {
        crate::json::to_line(&self.json_model(tool, check_keys, own))
    }

    /// The model [`Report::json_with`] writes.
    pub fn json_model<C, K>(
        &self,
        tool: &str,
        check_keys: impl Fn(usize) -> C,
        own: K,
    ) -> JsonReport<C, K> {
        let exit = self.exit_code();
        JsonReport {
            tool: tool.to_string(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            checks: self
                .checks
                .iter()
                .enumerate()
                .map(|(i, c)| JsonCheck { check: c.clone(), own: check_keys(i) })
                .collect(),
            could_not_check: self.unchecked_reason(),
            result: result_word(exit).to_string(),
            exit,
            own,
        }
    }

    /// Prints the report as text or as the one JSON object; returns the exit code.
    pub fn print(&self, tool: &str, json: bool) -> u8 {
        print!("{}", if json { self.json(tool) + "\n" } else { self.text() });
        self.exit_code()
    }
}

/// The words of a verdict, in the text and in the JSON alike: a check is PASS, WARN, FAIL, INFO
/// (seen, not judged) or COULD NOT CHECK; a result is PASS, FAIL or COULD NOT CHECK.
pub const COULD_NOT_CHECK: &str = "COULD NOT CHECK";

/// The result word of an exit code (0 PASS, 1 FAIL, 2 COULD NOT CHECK).
pub fn result_word(exit: u8) -> &'static str {
    match exit {
        0 => "PASS",
        1 => "FAIL",
        _ => COULD_NOT_CHECK,
    }
}

/// The one JSON object every command prints with `--json` (the README's "Every command"): the six
/// keys every object has, in this order, then the keys of the command's own (`own`, flattened:
/// the README's table names them). Each check is its five keys, then its command's own (`C`).
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct JsonReport<C, K> {
    pub tool: String,
    pub version: String,
    pub checks: Vec<JsonCheck<C>>,
    /// null, or why something could not be checked (the text's "could not check here").
    pub could_not_check: Option<String>,
    /// PASS, FAIL or COULD NOT CHECK: [`result_word`] of `exit`.
    pub result: String,
    pub exit: u8,
    #[serde(flatten)]
    pub own: K,
}

/// A check in the JSON: [`Check`]'s five keys, then its command's own (the self-test's `step`, a
/// fleet culprit's `kind`, `nodes`, `rail`).
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct JsonCheck<C> {
    #[serde(flatten)]
    pub check: Check,
    #[serde(flatten)]
    pub own: C,
}

/// No keys of a command's own.
#[derive(Debug, PartialEq, Serialize, Deserialize)]
pub struct NoKeys {}

/// The model of a command that adds no keys (doctor, verify-run, dmabuf-probe, env, version, an
/// error that stops a command).
pub type PlainJson = JsonReport<NoKeys, NoKeys>;

/// Writes `text` to a file beside `out` and renames it into place: a reader never sees it half
/// written.
pub fn write_whole(out: &std::path::Path, text: &str) -> std::io::Result<()> {
    let name = out.file_name().ok_or_else(|| std::io::Error::other("not a file name"))?;
    let tmp = out.with_file_name(format!(".{}.{}.tmp", name.to_string_lossy(), std::process::id()));
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, out).inspect_err(|_| {
        let _ = std::fs::remove_file(&tmp);
    })
}

/// `--out FILE` of a command that makes a file (`report`, `cdi`): `text` written whole, and the
/// check `<command>.written` that says where.
pub fn write_out(
    r: &mut Report,
    command: &str,
    out: &std::path::Path,
    text: &str,
) -> Result<(), String> {
    write_whole(out, text).map_err(|e| format!("cannot write --out {}: {e}", out.display()))?;
    r.push(Check::new(
        &format!("{command}.written"),
        Status::Pass,
        format!("written to {}", out.display()),
    ));
    Ok(())
}

/// Removes terminal escape sequences (nvidia-smi underlines its table headers).
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars().peekable();
    while let Some(c) = it.next() {
        if c == '\u{1b}' {
            if it.peek() == Some(&'[') {
                it.next();
                for d in it.by_ref() {
                    if d.is_ascii_alphabetic() {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    #[test]
    fn json_escapes_and_result() {
        let mut r = Report::default();
        r.push(Check::new("a", Status::Pass, "q\"\n\u{1}").evidence("x\\y"));
        assert_eq!(
            r.json("t"),
            concat!(
                r#"{"tool":"t","version":""#,
                env!("CARGO_PKG_VERSION"),
                r#"","checks":[{"id":"a","status":"PASS","summary":"q\"\n\u0001","evidence":["x\\y"],"fix":""}],"could_not_check":null,"result":"PASS","exit":0}"#
            )
        );
        r.push(Check::new("b", Status::Fail, "no"));
        assert!(r.json("t").ends_with("\"result\":\"FAIL\",\"exit\":1}"));
        assert!(r.failed());
    }
    #[test]
    fn exit_codes_and_the_closing_line() {
        let mut r = Report::default();
        r.push(Check::new("a", Status::Pass, "yes"));
        assert_eq!(r.exit_code(), 0);
        assert!(
            r.text().ends_with(
                "RESULT: PASS (1 check: 1 PASS, 0 WARN, 0 FAIL, 0 INFO, 0 COULD NOT CHECK)\n"
            ),
            "{}",
            r.text()
        );
        r.could_not_check("no libcuda");
        r.could_not_check("a second reason is not kept");
        assert_eq!(r.exit_code(), 2);
        assert!(
            r.text().ends_with(
                "RESULT: COULD NOT CHECK (1 check: 1 PASS, 0 WARN, 0 FAIL, 0 INFO, 0 COULD NOT CHECK); could not check here: no libcuda\n"
            ),
            "{}",
            r.text()
        );
        assert!(
            r.json("t").ends_with(
                ",\"could_not_check\":\"no libcuda\",\"result\":\"COULD NOT CHECK\",\"exit\":2}"
            ),
            "{}",
            r.json("t")
        );
        // a failure found is a failure, whatever could not be checked; the reason is said in
        // the text as in the JSON
        r.push(Check::new("b", Status::Fail, "no"));
        assert_eq!(r.exit_code(), 1);
        assert!(
            r.text().ends_with(
                "RESULT: FAIL (2 checks: 1 PASS, 0 WARN, 1 FAIL, 0 INFO, 0 COULD NOT CHECK); could not check here: no libcuda\n"
            ),
            "{}",
            r.text()
        );
        assert!(
            r.json("t")
                .ends_with(",\"could_not_check\":\"no libcuda\",\"result\":\"FAIL\",\"exit\":1}"),
            "{}",
            r.json("t")
        );
    }
    #[test]
    fn a_check_that_could_not_be_made_is_the_reason_when_none_was_given() {
        let mut r = Report::default();
        r.push(Check::new("a", Status::Pass, "yes"));
        r.push(
            Check::new("kernel.xid", Status::CouldNotCheck, "the log has no entries")
                .fix("give the run's kernel log"),
        );
        assert_eq!(r.exit_code(), 2);
        let t = r.text();
        assert!(t.contains("COULD NOT CHECK kernel.xid"), "{t}");
        assert!(
            t.contains("                fix: give the run's kernel log"),
            "the fix under the summary, aligned: {t}"
        );
        assert!(t.ends_with("; could not check here: kernel.xid: the log has no entries\n"), "{t}");
        assert!(
            r.json("t").contains("\"could_not_check\":\"kernel.xid: the log has no entries\""),
            "{}",
            r.json("t")
        );
        // WARN and INFO change nothing: a pass with a warning is a pass
        let mut r = Report::default();
        r.push(Check::new("a", Status::Warn, "hm"));
        r.push(Check::new("b", Status::Info, "seen"));
        assert_eq!(r.exit_code(), 0);
    }
    #[test]
    fn every_status_and_result_parses_back_to_the_same_line() {
        let mut r = Report::default();
        for (i, st) in STATUSES.into_iter().enumerate() {
            r.push(
                Check::new(&format!("c{i}"), st, format!("{} \"quoted\" \t tab", st.word()))
                    .evidence("line 1")
                    .evidence("ünïcode \u{7f} \u{8}")
                    .fix(if st == Status::Pass { "" } else { "do this" }),
            );
        }
        r.could_not_check("no GPU");
        let line = r.json("doctor");
        assert_eq!(crate::json::round_trip::<PlainJson>(&line), line);
        let m: PlainJson = serde_json::from_str(&line).unwrap();
        assert_eq!(m, r.json_model("doctor", |_| NoKeys {}, NoKeys {}));
        assert_eq!(
            (m.exit, m.result.as_str(), m.checks[2].check.status),
            (1, "FAIL", Status::Fail)
        );
        // a word that is no status is refused, not read as another
        let bad = line.replacen("\"status\":\"WARN\"", "\"status\":\"WARNING\"", 1);
        assert!(serde_json::from_str::<PlainJson>(&bad)
            .unwrap_err()
            .to_string()
            .contains("is no status"));
        // the version's object: no checks
        let v = Report::default().json("version");
        assert_eq!(
            v,
            format!(
                "{{\"tool\":\"version\",\"version\":\"{}\",\"checks\":[],\"could_not_check\":null,\"result\":\"PASS\",\"exit\":0}}",
                env!("CARGO_PKG_VERSION")
            )
        );
        assert_eq!(crate::json::round_trip::<PlainJson>(&v), v);
    }
    #[test]
    fn ansi() {
        assert_eq!(strip_ansi("\u{1b}[4mGPU0\tCPU\u{1b}[0m"), "GPU0\tCPU");
    }
}
