//! NCCL's receive-side flush: the files NCCL reads (the record's `nccl-conf`: the recorder's
//! environment, its passwd home and each file, in hex), where `NCCL_NET_FORCE_FLUSH` comes from
//! (read as the shim reads it, gdrshim-common's `ncclconf`), and whether a GPU that needs the
//! flush forced (the record's `gpu-facts`: the release's `gdrshim-tool gpu-facts`) has it.

use crate::gpu_facts::{parse_facts_line, Facts};
use crate::machine::State;
use crate::ncclconf::{self, FileText, FlushSettings};
use crate::report::{Check, Report, Status};
use std::collections::BTreeMap;

/// The recorded environment, passwd home and files.
#[derive(Default)]
struct Recorded {
    env: BTreeMap<String, String>,
    passwd_home: Option<String>,
    files: BTreeMap<String, Option<Vec<u8>>>,
}

fn unhex(h: &str) -> Option<Vec<u8>> {
    if !h.len().is_multiple_of(2) {
        return None;
    }
    (0..h.len()).step_by(2).map(|i| u8::from_str_radix(h.get(i..i + 2)?, 16).ok()).collect()
}

fn text(h: &str) -> Option<String> {
    unhex(h).map(|b| String::from_utf8_lossy(&b).into_owned())
}

fn parse_record(t: &str) -> Recorded {
    let mut r = Recorded::default();
    for l in t.lines() {
        let w: Vec<&str> = l.splitn(3, ' ').collect();
        match w.as_slice() {
            ["env", name, v] => {
                if let Some(v) = text(v) {
                    r.env.insert(name.to_string(), v);
                }
            }
            ["passwd-home", v] => r.passwd_home = text(v),
            ["file", p, "absent"] => {
                if let Some(p) = text(p) {
                    r.files.insert(p, None);
                }
            }
            ["file", p, v] => {
                if let (Some(p), Some(v)) = (text(p), unhex(v)) {
                    r.files.insert(p, Some(v));
                }
            }
            _ => {}
        }
    }
    r
}

/// GPU `i`'s facts from the record of `gdrshim-tool gpu-facts` (its `gpu.N` evidence lines).
fn gpus(t: &str) -> Vec<Facts> {
    t.lines().filter(|l| l.contains("needs_forced_flush=")).filter_map(parse_facts_line).collect()
}

pub(super) fn nccl(st: &State, r: &mut Report) {
    let conf = st.item("nccl-conf");
    let Some(t) = conf.ok() else {
        r.push(
            Check::new("nccl.conf", Status::Info, "NCCL's configuration files were not recorded: where NCCL_NET_FORCE_FLUSH comes from cannot be said")
                .evidence(conf.why_not("nccl-conf")),
        );
        return;
    };
    let rec = parse_record(t);
    let settings = FlushSettings::read(
        |k| rec.env.get(k).cloned(),
        rec.passwd_home.as_deref(),
        |p| match rec.files.get(p) {
            Some(Some(b)) if b.len() > ncclconf::READ_LIMIT => {
                FileText::Cut(b[..ncclconf::READ_LIMIT].to_vec())
            }
            Some(Some(b)) => FileText::Whole(b.clone()),
            _ => FileText::Absent,
        },
    );
    let mut files: Vec<&String> = Vec::new();
    for a in &settings.answers {
        files.extend(a.reading.files.iter().filter(|f| !files.contains(f)).collect::<Vec<_>>());
    }
    let mut c = Check::new(
        "nccl.conf",
        Status::Info,
        format!(
            "NCCL reads {}; NCCL_NET_FORCE_FLUSH: {}; NCCL_GDR_FLUSH_DISABLE: {}",
            files.iter().map(|f| f.as_str()).collect::<Vec<_>>().join(", "),
            settings.force_flush_origin(),
            settings.flush_disabled_origin()
        ),
    );
    for f in &files {
        c = c.evidence(match rec.files.get(*f) {
            Some(Some(b)) => format!("{f}: {} bytes", b.len()),
            _ => format!("{f}: not there"),
        });
    }
    r.push(c);
    let facts = st.item("gpu-facts");
    let Some(t) = facts.any().filter(|t| !gpus(t).is_empty()) else {
        r.push(
            Check::new("nccl.flush", Status::Info, "no GPU facts recorded (gdrshim-tool gpu-facts): whether a GPU needs NCCL's flush forced cannot be said")
                .evidence(facts.why_not("gpu-facts")),
        );
        return;
    };
    let need: Vec<String> = gpus(t)
        .iter()
        .enumerate()
        .filter(|(_, g)| g.needs_forced_flush() == Some(true))
        .map(|(i, g)| {
            let (a, b) = g.compute_capability.unwrap_or_default();
            format!(
                "GPU {i} (sm_{a}{b}, GPU_DIRECT_RDMA_WRITES_ORDERING {} below OWNER)",
                g.writes_ordering.unwrap_or_default()
            )
        })
        .collect();
    let c = if need.is_empty() {
        Check::new("nccl.flush", Status::Pass, "no GPU here needs NCCL's flush forced (below sm_90 NCCL flushes itself; from sm_90 these GPUs order remote writes)")
    } else if settings.flush_disabled {
        Check::new("nccl.flush", Status::Warn, format!("{} needs NCCL's flush, and NCCL_GDR_FLUSH_DISABLE is set ({}): gdrshim will not tell NCCL that GDR works", need.join(", "), settings.flush_disabled_origin()))
            .fix("unset NCCL_GDR_FLUSH_DISABLE (or remove its line from the file named)")
    } else if settings.force_flush {
        Check::new(
            "nccl.flush",
            Status::Pass,
            format!(
                "{} needs NCCL's flush forced, and has it: NCCL_NET_FORCE_FLUSH {}",
                need.join(", "),
                settings.force_flush_origin()
            ),
        )
    } else {
        Check::new("nccl.flush", Status::Warn, format!("{} needs NCCL's flush forced and lacks it (NCCL_NET_FORCE_FLUSH: {}): gdrshim keeps GPUDirect RDMA off for NCCL there", need.join(", "), settings.force_flush_origin()))
            .fix("a line NCCL_NET_FORCE_FLUSH=1 in /etc/nccl.conf (scripts/deploy.sh and the .deb write it on such a node), or NCCL_NET_FORCE_FLUSH=1 in the job (gdr-env.sh sets it)")
    };
    r.push(c);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> String {
        s.bytes().map(|b| format!("{b:02x}")).collect()
    }

    const SM120: &str = "INFO gpu.0  sm_120 …\n     | sm=120 writes_ordering=0 needs_forced_flush=1\nRESULT: PASS\n";

    fn judge(conf: &str, facts: &str) -> Report {
        let st = State::from_pairs(&[("nccl-conf", conf), ("gpu-facts", facts)]);
        let mut r = Report::default();
        nccl(&st, &mut r);
        r
    }

    #[test]
    fn the_flush_from_the_file_passes_and_its_lack_warns_with_the_fix() {
        let with = format!(
            "env HOME {}\npasswd-home {}\nfile {} absent\nfile {} {}\n",
            hex("/root"),
            hex("/root"),
            hex("/root/.nccl.conf"),
            hex("/etc/nccl.conf"),
            hex("# added by gdrshim 0.3.0\nNCCL_NET_FORCE_FLUSH=1\n")
        );
        let r = judge(&with, SM120);
        let c = r.get("nccl.conf").unwrap();
        assert!(c.summary.starts_with("NCCL reads /root/.nccl.conf, /etc/nccl.conf; NCCL_NET_FORCE_FLUSH: \"1\" from /etc/nccl.conf"), "{c:?}");
        assert_eq!(c.evidence, ["/root/.nccl.conf: not there", "/etc/nccl.conf: 48 bytes"]);
        let f = r.get("nccl.flush").unwrap();
        assert_eq!(f.status, Status::Pass, "{f:?}");
        assert!(
            f.summary.contains("GPU 0 (sm_120") && f.summary.contains("from /etc/nccl.conf"),
            "{f:?}"
        );
        // the job's own 0 from the recorder's environment wins over the file
        let env0 = format!("env NCCL_NET_FORCE_FLUSH {}\n{with}", hex("0"));
        let f = judge(&env0, SM120).get("nccl.flush").cloned().unwrap();
        assert_eq!(f.status, Status::Warn);
        assert!(
            f.summary.contains("\"0\" from the environment") && f.fix.contains("/etc/nccl.conf"),
            "{f:?}"
        );
        // no file at all
        let none = format!("env HOME {}\nfile {} absent\n", hex("/root"), hex("/etc/nccl.conf"));
        let f = judge(&none, SM120).get("nccl.flush").cloned().unwrap();
        assert_eq!(f.status, Status::Warn);
        assert!(f.summary.contains("lacks it (NCCL_NET_FORCE_FLUSH: unset)"), "{f:?}");
        // an RTX 4090 or an H200 needs nothing
        let h200 = "| sm=90 writes_ordering=100 needs_forced_flush=0\n| sm=89 writes_ordering=0 needs_forced_flush=0\n";
        assert_eq!(judge(&none, h200).get("nccl.flush").unwrap().status, Status::Pass);
    }

    #[test]
    fn what_was_not_recorded_is_said() {
        let st = State::from_pairs(&[]);
        let mut r = Report::default();
        nccl(&st, &mut r);
        assert_eq!(r.get("nccl.conf").unwrap().status, Status::Info);
        let r = judge("", "# not run: gdrshim-tool is not installed\n");
        let f = r.get("nccl.flush").unwrap();
        assert_eq!(f.status, Status::Info);
        assert!(f.evidence[0].contains("gdrshim-tool is not installed"), "{f:?}");
        assert_eq!(unhex("4e3d31"), Some(b"N=1".to_vec()));
        assert_eq!(unhex("4e3"), None);
    }
}
