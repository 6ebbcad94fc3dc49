//! NCCL's configuration files, read as NCCL reads them, so that gdrshim's ordering rule and
//! `gdrshim-tool env` count a line `NCCL_NET_FORCE_FLUSH=1` in `/etc/nccl.conf` as NCCL does.
//!
//! NCCL (src/misc/param.cc, `initEnvFunc`, at its first parameter read) reads `$NCCL_CONF_FILE`
//! when that is set and not empty, else `<home>/.nccl.conf`, and then `/etc/nccl.conf`. Each line
//! `NAME=VALUE` is `setenv(NAME, VALUE, 0)`: the process environment always wins, and the first
//! file and line that name a variable win over later ones. NAME is every byte before the first
//! `=` (nothing trimmed), VALUE the rest less the line's end; a line starting with `#` is skipped.
//! Versions differ: up to 2.29 `<home>` is the passwd entry's home of the real uid and a line is
//! all `getline` gives, less `\n`; from 2.30 `<home>` is `$HOME`, and lines come from `fgets`
//! into 4096 bytes (a longer line is read as several), less `\n` and then `\r`.
//!
//! gdrshim cannot know which NCCL the process loads, so it reads the files every way a version
//! could and takes the safe side: a flush counts as forced only if every reading forces it, the
//! flush counts as disabled if any reading disables it.
#![forbid(unsafe_code)]

/// NCCL's variable that turns its GDR flush off.
pub const ENV_NCCL_FLUSH_DISABLE: &str = "NCCL_GDR_FLUSH_DISABLE";
/// NCCL's variable that keeps its GDR flush on from sm_90 on.
pub const ENV_NCCL_FORCE_FLUSH: &str = "NCCL_NET_FORCE_FLUSH";

/// `NCCL_GDR_FLUSH_DISABLE`'s value disables NCCL's flush: NCCL reads it as an integer, and
/// anything but a clean 0 counts as set (the safe side).
pub fn disables_flush(value: &str) -> bool {
    value.trim().parse::<i64>() != Ok(0)
}

/// `NCCL_NET_FORCE_FLUSH`'s value forces NCCL's flush: the other way round, only a clean non-zero
/// integer counts (else GDR is not advertised where it would need that flush).
pub fn forces_flush(value: &str) -> bool {
    value.trim().parse::<i64>().is_ok_and(|n| n != 0)
}

/// The file every NCCL version reads last.
pub const ETC_FILE: &str = "/etc/nccl.conf";
/// The variable that names the user's file instead of `<home>/.nccl.conf`.
pub const ENV_CONF_FILE: &str = "NCCL_CONF_FILE";
/// The most gdrshim reads of one file; a longer one counts as not known past that (the safe side).
pub const READ_LIMIT: usize = 1 << 20;
/// NCCL formats each path into `char[1024]`: a longer one is cut.
const PATH_MAX_NCCL: usize = 1023;
/// NCCL copies a name and a value into `char[1024]` each.
const VALUE_MAX_NCCL: usize = 1023;
/// 2.30's `fgets` buffer.
const FGETS_BUFFER: usize = 4096;

/// How a version cuts a file into lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lines {
    /// Up to 2.29: `getline`, whole lines, only `\n` taken off.
    Whole,
    /// From 2.30: `fgets` into 4096 bytes, `\n` and then `\r` taken off.
    Fgets4096,
}

/// One way a version of NCCL reads the files: which, in order, and how.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reading {
    /// Which versions read this way, for the messages.
    pub versions: &'static str,
    pub files: Vec<String>,
    pub lines: Lines,
}

/// The readings of this process's NCCL, whatever its version. `passwd_home`: the home of the real
/// uid's entry in /etc/passwd; where the uid has none there (NSS from elsewhere), `$HOME` stands
/// in for it (a login sets `$HOME` from that entry).
pub fn readings(
    conf_file: Option<&str>,
    env_home: Option<&str>,
    passwd_home: Option<&str>,
) -> [Reading; 2] {
    let old_home = passwd_home.or(env_home);
    [
        Reading {
            versions: "NCCL up to 2.29",
            files: files(conf_file, old_home),
            lines: Lines::Whole,
        },
        Reading {
            versions: "NCCL 2.30 and later",
            files: files(conf_file, env_home),
            lines: Lines::Fgets4096,
        },
    ]
}

fn files(conf_file: Option<&str>, home: Option<&str>) -> Vec<String> {
    let user = match conf_file.filter(|f| !f.is_empty()) {
        Some(f) => Some(f.to_string()),
        None => home.map(|h| format!("{h}/.nccl.conf")),
    };
    user.map(|p| cut(&p, PATH_MAX_NCCL)).into_iter().chain([ETC_FILE.to_string()]).collect()
}

/// The first `max` bytes of `s` (at a character boundary: a path cut inside a character names
/// no file anyone can create from UTF-8 anyway).
fn cut(s: &str, max: usize) -> String {
    let mut n = s.len().min(max);
    while !s.is_char_boundary(n) {
        n -= 1;
    }
    s[..n].to_string()
}

/// The value the first line naming `name` gives it (empty too: it is set then, and no later
/// line or file changes it), as `lines` cuts the file.
pub fn first_value(text: &[u8], name: &str, lines: Lines) -> Option<Vec<u8>> {
    let mut pieces: Vec<&[u8]> = Vec::new();
    for line in text.split_inclusive(|b| *b == b'\n') {
        match lines {
            Lines::Whole => pieces.push(line),
            // fgets gives at most 4095 bytes at a time
            Lines::Fgets4096 => pieces.extend(line.chunks(FGETS_BUFFER - 1)),
        }
    }
    pieces.into_iter().find_map(|p| named(p, name, lines))
}

fn named(piece: &[u8], name: &str, lines: Lines) -> Option<Vec<u8>> {
    // C strings: a NUL ends the line for every purpose that follows
    let mut line = &piece[..piece.iter().position(|b| *b == 0).unwrap_or(piece.len())];
    if let Some(l) = line.strip_suffix(b"\n") {
        line = l;
    }
    if lines == Lines::Fgets4096 {
        if let Some(l) = line.strip_suffix(b"\r") {
            line = l;
        }
    }
    if line.first() == Some(&b'#') {
        return None;
    }
    let eq = line.iter().position(|b| *b == b'=')?;
    (&line[..eq] == name.as_bytes())
        .then(|| line[eq + 1..].iter().take(VALUE_MAX_NCCL).copied().collect())
}

/// What reading one file gave.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileText {
    /// Not there, or not readable (NCCL skips it too).
    Absent,
    Whole(Vec<u8>),
    /// Longer than [`READ_LIMIT`]: only its beginning.
    Cut(Vec<u8>),
}

/// Where one reading's value of a variable comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The process environment: it always wins.
    Environment,
    /// A line of this file.
    File(String),
    /// This file was too long to read whole, and its beginning does not name the variable.
    Unknown(String),
    /// Nowhere: NCCL's default.
    Default,
}

/// A variable as one reading sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Seen {
    pub origin: Origin,
    pub value: Option<String>,
}

impl Seen {
    /// "1 from /etc/nccl.conf", "unset", …
    pub fn describe(&self) -> String {
        let v = self.value.as_deref().map_or(String::new(), |v| format!("{v:?} "));
        match &self.origin {
            Origin::Environment => format!("{v}from the environment"),
            Origin::File(f) => format!("{v}from {f}"),
            Origin::Unknown(f) => format!("unknown ({f} is over {READ_LIMIT} bytes)"),
            Origin::Default => "unset".to_string(),
        }
    }
}

/// `name` as `reading` sees it, the environment's value `env` first.
fn seen(
    name: &str,
    env: Option<&str>,
    reading: &Reading,
    text: &mut impl FnMut(&str) -> FileText,
) -> Seen {
    if let Some(v) = env {
        return Seen { origin: Origin::Environment, value: Some(v.to_string()) };
    }
    for f in &reading.files {
        let (bytes, whole) = match text(f) {
            FileText::Absent => continue,
            FileText::Whole(b) => (b, true),
            FileText::Cut(b) => (b, false),
        };
        if let Some(v) = first_value(&bytes, name, reading.lines) {
            return Seen {
                origin: Origin::File(f.clone()),
                value: Some(String::from_utf8_lossy(&v).into_owned()),
            };
        }
        if !whole {
            return Seen { origin: Origin::Unknown(f.clone()), value: None };
        }
    }
    Seen { origin: Origin::Default, value: None }
}

/// One reading's answer for the two variables.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReadingAnswer {
    pub reading: Reading,
    pub force_flush: Seen,
    pub flush_disabled: Seen,
}

/// What NCCL's flush variables are for this process, every reading counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FlushSettings {
    /// Every reading forces the flush (`NCCL_NET_FORCE_FLUSH` a non-zero integer).
    pub force_flush: bool,
    /// Some reading disables the flush (`NCCL_GDR_FLUSH_DISABLE` anything but 0), or cannot say.
    pub flush_disabled: bool,
    pub answers: Vec<ReadingAnswer>,
}

fn forced(s: &Seen) -> bool {
    s.value.as_deref().is_some_and(forces_flush)
}

fn disabled(s: &Seen) -> bool {
    matches!(s.origin, Origin::Unknown(_)) || s.value.as_deref().is_some_and(disables_flush)
}

impl FlushSettings {
    /// Reads the files through `text` (each path once): `env` gives the process environment,
    /// `passwd_home` the real uid's home in /etc/passwd.
    pub fn read(
        env: impl Fn(&str) -> Option<String>,
        passwd_home: Option<&str>,
        mut text: impl FnMut(&str) -> FileText,
    ) -> FlushSettings {
        let conf = env(ENV_CONF_FILE);
        let home = env("HOME");
        let force_env = env(ENV_NCCL_FORCE_FLUSH);
        let disable_env = env(ENV_NCCL_FLUSH_DISABLE);
        let mut cache: Vec<(String, FileText)> = Vec::new();
        let mut once = |path: &str| -> FileText {
            if let Some((_, t)) = cache.iter().find(|(p, _)| p == path) {
                return t.clone();
            }
            let t = text(path);
            cache.push((path.to_string(), t.clone()));
            t
        };
        let answers: Vec<ReadingAnswer> = readings(conf.as_deref(), home.as_deref(), passwd_home)
            .into_iter()
            .map(|r| ReadingAnswer {
                force_flush: seen(ENV_NCCL_FORCE_FLUSH, force_env.as_deref(), &r, &mut once),
                flush_disabled: seen(ENV_NCCL_FLUSH_DISABLE, disable_env.as_deref(), &r, &mut once),
                reading: r,
            })
            .collect();
        FlushSettings {
            force_flush: answers.iter().all(|a| forced(&a.force_flush)),
            flush_disabled: answers.iter().any(|a| disabled(&a.flush_disabled)),
            answers,
        }
    }

    /// Where `NCCL_NET_FORCE_FLUSH` comes from: one origin when every reading agrees, else each.
    pub fn force_flush_origin(&self) -> String {
        Self::origin(self.answers.iter().map(|a| (&a.reading, &a.force_flush)))
    }

    /// Where `NCCL_GDR_FLUSH_DISABLE` comes from, as [`FlushSettings::force_flush_origin`].
    pub fn flush_disabled_origin(&self) -> String {
        Self::origin(self.answers.iter().map(|a| (&a.reading, &a.flush_disabled)))
    }

    fn origin<'a>(each: impl Iterator<Item = (&'a Reading, &'a Seen)>) -> String {
        let each: Vec<(&Reading, &Seen)> = each.collect();
        match each.first() {
            Some((_, first)) if each.iter().all(|(_, s)| s == first) => first.describe(),
            _ => each
                .iter()
                .map(|(r, s)| format!("{}: {}", r.versions, s.describe()))
                .collect::<Vec<_>>()
                .join("; "),
        }
    }
}

/// The home of `uid`'s first entry in the text of /etc/passwd (`name:pw:uid:gid:gecos:home:shell`).
pub fn passwd_home(passwd: &[u8], uid: u32) -> Option<String> {
    let text = String::from_utf8_lossy(passwd);
    text.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.len() >= 7 && f[2].parse::<u32>() == Ok(uid)).then(|| f[5].to_string())
    })
}

#[cfg(test)]
mod tests;
