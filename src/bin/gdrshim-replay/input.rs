//! Reading a capture file: plain (`.cap`) or gzip-compressed (`.cap.gz`, as the fixtures ship),
//! told apart by the gzip magic, not the name. A file that is not a capture is rejected with the
//! reason (unreadable, not gzip, a damaged or truncated gzip stream, binary data, a first line
//! that is no capture record, a last record cut off), never replayed into an all-zero summary.
//!
//! The decompression lives here, in the program, not in the library: libgdrshim.so does not link
//! flate2.

use gdrshim::capture::parse_line;
use std::fmt;
use std::io::Read;
use std::path::Path;

/// The two bytes every gzip member starts with (RFC 1952).
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// Why a file is not replayed.
#[derive(Debug, PartialEq, Eq)]
pub enum Rejected {
    /// open or read failed
    Unreadable(String),
    /// named `.gz`, but does not start with the gzip magic
    NotGzip { magic: Vec<u8> },
    /// the gzip stream is damaged (bad header, bad data, checksum mismatch)
    BadGzip(String),
    /// the gzip stream ends early; `records` complete lines came out before it did
    TruncatedGzip { records: usize },
    /// nothing in it
    Empty,
    /// not UTF-8 text: the byte offset of the first bad byte (in the decompressed text)
    Binary { offset: usize },
    /// the first non-empty line is no capture record (`V`, `I`, `A` or `M`)
    NotCapture { first_line: String },
    /// the last line has no line end and is no complete record: the file was cut off there
    Truncated { record: usize },
}

impl fmt::Display for Rejected {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rejected::Unreadable(e) => write!(f, "cannot read it: {e}"),
            Rejected::NotGzip { magic } => {
                let m: Vec<String> = magic.iter().map(|b| format!("{b:02x}")).collect();
                write!(f, "not gzip: bad magic [{}] where a .gz file starts 1f 8b", m.join(" "))
            }
            Rejected::BadGzip(e) => write!(f, "not a valid gzip stream: {e}"),
            Rejected::TruncatedGzip { records } => {
                write!(f, "truncated: the gzip stream ends early, at record {} ({records} complete records before it)", records + 1)
            }
            Rejected::Empty => write!(f, "not a capture: the file is empty"),
            Rejected::Binary { offset } => write!(f, "not a capture: binary data (not UTF-8 text) at byte {offset}"),
            Rejected::NotCapture { first_line } => write!(
                f,
                "not a capture: bad magic: the first line is {first_line:?}, where a capture starts with a record (`V <driver version>`, `I …`, `A …` or `M …`)"
            ),
            Rejected::Truncated { record } => write!(f, "truncated at record {record}: its line has no end and is incomplete"),
        }
    }
}

/// The capture text of `path`, decompressed where it is gzip.
pub fn load(path: &Path) -> Result<String, Rejected> {
    let raw = std::fs::read(path).map_err(|e| Rejected::Unreadable(e.to_string()))?;
    let bytes = if raw.starts_with(&GZIP_MAGIC) {
        gunzip(&raw)?
    } else if path.extension().is_some_and(|e| e == "gz") {
        return Err(Rejected::NotGzip { magic: raw.iter().take(2).copied().collect() });
    } else {
        raw
    };
    check_text(bytes)
}

fn gunzip(raw: &[u8]) -> Result<Vec<u8>, Rejected> {
    let mut out = Vec::new();
    match flate2::read::MultiGzDecoder::new(raw).read_to_end(&mut out) {
        Ok(_) => Ok(out),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
            Err(Rejected::TruncatedGzip { records: out.iter().filter(|&&b| b == b'\n').count() })
        }
        Err(e) => Err(Rejected::BadGzip(e.to_string())),
    }
}

/// Capture text: UTF-8, a record first, and no record cut off at the end.
pub fn check_text(bytes: Vec<u8>) -> Result<String, Rejected> {
    let text = String::from_utf8(bytes)
        .map_err(|e| Rejected::Binary { offset: e.utf8_error().valid_up_to() })?;
    let Some(first) = text.lines().find(|l| !l.trim().is_empty()) else {
        return Err(Rejected::Empty);
    };
    if parse_line(first).is_none() {
        return Err(Rejected::NotCapture { first_line: first.chars().take(60).collect() });
    }
    // The shim writes whole lines; a last line without its end that is no record was cut off.
    if !text.ends_with('\n') {
        let last = text.lines().next_back().unwrap_or_default();
        if parse_line(last).is_none() {
            return Err(Rejected::Truncated { record: text.lines().count() });
        }
    }
    Ok(text)
}

/// The 1-based number and the start of the first line that is no capture record, if any.
pub fn first_bad_line(text: &str) -> Option<(usize, String)> {
    text.lines()
        .enumerate()
        .find(|(_, l)| !l.trim().is_empty() && parse_line(l).is_none())
        .map(|(i, l)| (i + 1, l.chars().take(60).collect()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn gz(b: &[u8]) -> Vec<u8> {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(b).unwrap();
        e.finish().unwrap()
    }

    const CAP: &str = "V 580.159.04\nM start\nA cuMemAlloc_v2 7f0000000000 200000\n";

    #[test]
    fn plain_and_gzip_read_the_same() {
        assert_eq!(check_text(CAP.as_bytes().to_vec()).unwrap(), CAP);
        assert_eq!(gunzip(&gz(CAP.as_bytes())).unwrap(), CAP.as_bytes());
    }

    #[test]
    fn each_kind_of_garbage_has_its_reason() {
        assert_eq!(check_text(Vec::new()), Err(Rejected::Empty));
        assert_eq!(
            check_text(b"V 580.159.04\n\xff\xfe".to_vec()),
            Err(Rejected::Binary { offset: 13 })
        );
        assert!(
            matches!(check_text(b"hello world\n".to_vec()), Err(Rejected::NotCapture { first_line }) if first_line == "hello world")
        );
        // cut in the middle of an I record's hex
        assert_eq!(
            check_text(b"V 580.159.04\nM start\nI c 10 c00846d6 0 00000".to_vec()),
            Err(Rejected::Truncated { record: 3 })
        );
        // a complete last record without its line end is fine
        assert!(check_text(b"V 580.159.04\nM start".to_vec()).is_ok());
        let z = gz(CAP.as_bytes());
        // all the data, the trailer (CRC and length) cut off; then cut into the data too
        assert_eq!(gunzip(&z[..z.len() - 8]), Err(Rejected::TruncatedGzip { records: 3 }));
        assert!(matches!(gunzip(&z[..z.len() - 12]), Err(Rejected::TruncatedGzip { .. })));
        let mut bad = z.clone();
        bad[3] = 0xff; // reserved flag bits
        assert!(matches!(gunzip(&bad), Err(Rejected::BadGzip(_))), "{:?}", gunzip(&bad));
        assert_eq!(first_bad_line("V 1.2.3\n\nZ nonsense\n"), Some((3, "Z nonsense".into())));
        assert_eq!(first_bad_line(CAP), None);
    }

    #[test]
    fn a_gz_name_without_the_magic_is_not_gzip() {
        let d = std::env::temp_dir().join(format!("gdrshim-replay-input-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        let f = d.join("x.cap.gz");
        std::fs::write(&f, CAP).unwrap();
        assert_eq!(load(&f), Err(Rejected::NotGzip { magic: vec![b'V', b' '] }));
        let f2 = d.join("x.cap");
        std::fs::write(&f2, gz(CAP.as_bytes())).unwrap();
        assert_eq!(load(&f2).unwrap(), CAP, "gzip is told by its magic, not its name");
        assert!(matches!(load(&d.join("missing.cap")), Err(Rejected::Unreadable(_))));
        std::fs::remove_dir_all(&d).unwrap();
    }
}
