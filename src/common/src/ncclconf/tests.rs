use super::*;
use std::collections::HashMap;

const F: &str = "NCCL_NET_FORCE_FLUSH";

fn both(text: &[u8]) -> [Option<String>; 2] {
    [Lines::Whole, Lines::Fgets4096]
        .map(|l| first_value(text, F, l).map(|v| String::from_utf8(v).unwrap()))
}

#[test]
fn a_line_is_name_equals_value_as_nccl_cuts_it() {
    assert_eq!(both(b"NCCL_NET_FORCE_FLUSH=1\n"), [Some("1".into()), Some("1".into())]);
    // no newline at the end; the first '=' only; an empty value is a value
    assert_eq!(both(b"NCCL_NET_FORCE_FLUSH=1=2"), [Some("1=2".into()), Some("1=2".into())]);
    assert_eq!(both(b"NCCL_NET_FORCE_FLUSH=\nNCCL_NET_FORCE_FLUSH=1\n")[0].as_deref(), Some(""));
    // nothing trimmed: these name other variables
    for t in [
        &b" NCCL_NET_FORCE_FLUSH=1"[..],
        b"NCCL_NET_FORCE_FLUSH =1",
        b"export NCCL_NET_FORCE_FLUSH=1",
    ] {
        assert_eq!(both(t), [None, None], "{:?}", String::from_utf8_lossy(t));
    }
    // a comment line is skipped, a comment after a value is the value
    assert_eq!(both(b"#NCCL_NET_FORCE_FLUSH=1\n"), [None, None]);
    assert_eq!(both(b"NCCL_NET_FORCE_FLUSH=1 # on\n")[1].as_deref(), Some("1 # on"));
    assert!(!forces_flush("1 # on"), "not a clean integer: not counted as forced");
    // the first line naming it wins
    assert_eq!(
        both(b"X=2\nNCCL_NET_FORCE_FLUSH=0\nNCCL_NET_FORCE_FLUSH=1\n")[0].as_deref(),
        Some("0")
    );
    // a NUL ends the line as C reads it
    assert_eq!(both(b"NCCL_NET_FORCE_FLUSH=1\0junk\n")[0].as_deref(), Some("1"));
    assert_eq!(both(b"NCCL_NET_\0FORCE_FLUSH=1\n"), [None, None]);
}

#[test]
fn the_versions_differ_on_carriage_returns_and_long_lines() {
    // up to 2.29 "\r" stays in the value; 2.30 takes it off (both force: " 1\r" trims to 1)
    assert_eq!(both(b"NCCL_NET_FORCE_FLUSH=1\r\n"), [Some("1\r".into()), Some("1".into())]);
    // 2.30 reads a line over 4095 bytes as several: its rest can name a variable
    let mut long = b"X=".to_vec();
    long.extend(std::iter::repeat_n(b'a', 4093));
    long.extend(b"NCCL_NET_FORCE_FLUSH=1\n");
    assert_eq!(both(&long), [None, Some("1".into())]);
    // values are cut at 1023 bytes
    let mut v = b"NCCL_NET_FORCE_FLUSH=".to_vec();
    v.extend(std::iter::repeat_n(b'7', 2000));
    assert_eq!(both(&v)[0].as_ref().unwrap().len(), 1023);
}

#[test]
fn which_files_each_version_reads() {
    let [old, new] = readings(None, Some("/home/u"), Some("/home/pw"));
    assert_eq!(old.files, ["/home/pw/.nccl.conf", "/etc/nccl.conf"]);
    assert_eq!(new.files, ["/home/u/.nccl.conf", "/etc/nccl.conf"]);
    let [old, new] = readings(Some("/tmp/c"), Some("/home/u"), Some("/home/pw"));
    assert_eq!(
        (old.files.clone(), new.files),
        (vec!["/tmp/c".to_string(), ETC_FILE.into()], old.files)
    );
    // an empty NCCL_CONF_FILE is no file: the home's
    assert_eq!(readings(Some(""), Some("/h"), None)[1].files[0], "/h/.nccl.conf");
    // no passwd entry: $HOME stands in; no HOME either: /etc/nccl.conf alone
    assert_eq!(readings(None, Some("/h"), None)[0].files[0], "/h/.nccl.conf");
    assert_eq!(readings(None, None, None)[1].files, ["/etc/nccl.conf"]);
    assert_eq!(readings(None, None, Some("/pw"))[1].files, ["/etc/nccl.conf"]);
    // NCCL's char[1024]
    let p = "/x".repeat(600);
    assert_eq!(readings(Some(&p), None, None)[0].files[0].len(), 1023);
}

struct Machine {
    env: HashMap<&'static str, &'static str>,
    files: HashMap<&'static str, FileText>,
}

impl Machine {
    fn new(env: &[(&'static str, &'static str)], files: &[(&'static str, &str)]) -> Machine {
        Machine {
            env: env.iter().copied().collect(),
            files: files
                .iter()
                .map(|(p, t)| (*p, FileText::Whole(t.as_bytes().to_vec())))
                .collect(),
        }
    }
    fn settings(&self, passwd_home: Option<&str>) -> FlushSettings {
        let mut asked = Vec::new();
        let s = FlushSettings::read(
            |k| self.env.get(k).map(|v| v.to_string()),
            passwd_home,
            |p| {
                asked.push(p.to_string());
                self.files.get(p).cloned().unwrap_or(FileText::Absent)
            },
        );
        let mut unique = asked.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(asked.len(), unique.len(), "each file read once: {asked:?}");
        s
    }
}

#[test]
fn the_file_forces_the_flush_and_the_environment_wins() {
    let etc = [("/etc/nccl.conf", "# site\nNCCL_NET_FORCE_FLUSH=1\n")];
    let s = Machine::new(&[("HOME", "/h")], &etc).settings(Some("/h"));
    assert!(s.force_flush && !s.flush_disabled);
    assert_eq!(s.force_flush_origin(), "\"1\" from /etc/nccl.conf");
    // the job's own 0 wins, an empty one too (NCCL's default then)
    for v in ["0", ""] {
        let s = Machine::new(&[("HOME", "/h"), (F, v)], &etc).settings(Some("/h"));
        assert!(!s.force_flush, "{v:?}");
        assert!(s.force_flush_origin().ends_with("from the environment"));
    }
    // no file: not forced
    let s = Machine::new(&[("HOME", "/h")], &[]).settings(Some("/h"));
    assert!(!s.force_flush && !s.flush_disabled);
    assert_eq!(s.force_flush_origin(), "unset");
    // the user's file comes first
    let s =
        Machine::new(&[("HOME", "/h")], &[("/h/.nccl.conf", "NCCL_NET_FORCE_FLUSH=0\n"), etc[0]])
            .settings(Some("/h"));
    assert!(!s.force_flush);
    assert_eq!(s.force_flush_origin(), "\"0\" from /h/.nccl.conf");
    // NCCL_CONF_FILE replaces it
    let s = Machine::new(
        &[("HOME", "/h"), ("NCCL_CONF_FILE", "/tmp/c")],
        &[("/h/.nccl.conf", "NCCL_NET_FORCE_FLUSH=0\n"), ("/tmp/c", "NCCL_NET_FORCE_FLUSH=2\n")],
    )
    .settings(Some("/h"));
    assert!(s.force_flush);
}

#[test]
fn where_versions_could_disagree_the_safe_side() {
    // $HOME and the passwd home differ, and only one of them says 0: not forced
    let files = [
        ("/home/pw/.nccl.conf", "NCCL_NET_FORCE_FLUSH=0\n"),
        ("/etc/nccl.conf", "NCCL_NET_FORCE_FLUSH=1\n"),
    ];
    let s = Machine::new(&[("HOME", "/elsewhere")], &files).settings(Some("/home/pw"));
    assert!(!s.force_flush);
    let o = s.force_flush_origin();
    assert!(
        o.contains("NCCL up to 2.29: \"0\" from /home/pw/.nccl.conf")
            && o.contains("NCCL 2.30 and later: \"1\" from /etc/nccl.conf"),
        "{o}"
    );
    // a flush disabled by either home's file counts
    let files = [("/home/pw/.nccl.conf", "NCCL_GDR_FLUSH_DISABLE=1\n")];
    let s = Machine::new(&[("HOME", "/elsewhere")], &files).settings(Some("/home/pw"));
    assert!(s.flush_disabled);
    assert!(s.flush_disabled_origin().contains("NCCL up to 2.29: \"1\" from /home/pw/.nccl.conf"));
    let s = Machine::new(&[("HOME", "/elsewhere"), ("NCCL_GDR_FLUSH_DISABLE", "0")], &files)
        .settings(Some("/home/pw"));
    assert!(!s.flush_disabled, "the environment's 0 wins over every file");
    // a file too long to read whole that does not name it in its beginning: unknown
    let mut m = Machine::new(&[("HOME", "/h")], &[("/etc/nccl.conf", "NCCL_NET_FORCE_FLUSH=1\n")]);
    m.files.insert("/h/.nccl.conf", FileText::Cut(b"A=1\n".to_vec()));
    let s = m.settings(Some("/h"));
    assert!(!s.force_flush && s.flush_disabled);
    assert!(
        s.force_flush_origin().starts_with("unknown (/h/.nccl.conf"),
        "{}",
        s.force_flush_origin()
    );
    // "\r\n" lines force in both versions (strtoll stops at the "\r"; ours trims it)
    let s = Machine::new(&[], &[("/etc/nccl.conf", "NCCL_NET_FORCE_FLUSH=1\r\n")]).settings(None);
    assert!(s.force_flush);
}

#[test]
fn the_home_of_a_uid_in_etc_passwd() {
    let p = b"root:x:0:0:root:/root:/bin/bash\nu:x:1000:1000:U,,,:/home/u:/bin/sh\nv:x:1000:1:dup:/other:/bin/sh\n";
    assert_eq!(passwd_home(p, 0).as_deref(), Some("/root"));
    assert_eq!(passwd_home(p, 1000).as_deref(), Some("/home/u"), "the first entry wins");
    assert_eq!(passwd_home(p, 5), None);
    assert_eq!(passwd_home(b"broken:1000\n", 1000), None);
}
