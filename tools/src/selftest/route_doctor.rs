//! Step 1's doctor: the doctor's checks of the route the shim took (`route.dmabuf` or
//! `route.nv503c`, and `route.choice`), over this machine's state as `scripts/gdr-state-record`
//! records it now (`record`), or over a state saved earlier (`--state DIR`).

use super::findings::Findings;
use crate::doctor;
use crate::machine::State;
use crate::report::{Check, Status};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The recorder of this release (`bin/../scripts`) or of this source tree
/// (`target/release/../../scripts`).
fn recorder() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    let dir = exe.parent()?;
    [dir.join("../scripts/gdr-state-record"), dir.join("../../scripts/gdr-state-record")]
        .into_iter()
        .find(|p| p.is_file())
}

/// Records this machine into a folder of our own under the temporary directory; (that folder,
/// the save inside it).
pub fn record() -> Result<(PathBuf, PathBuf), String> {
    let script = recorder()
        .ok_or("scripts/gdr-state-record was not found next to this program (../scripts)")?;
    let root = std::env::temp_dir().join(format!("gdrshim-selftest-state-{}", std::process::id()));
    std::fs::create_dir(&root).map_err(|e| format!("cannot make {}: {e}", root.display()))?;
    // the recorder's tools (nvidia-smi…) run without the shim: they are not under test
    let out = Command::new("bash")
        .arg(&script)
        .arg("save")
        .arg(&root)
        .env_remove("LD_PRELOAD")
        .output()
        .map_err(|e| format!("cannot run {}: {e}", script.display()))?;
    let saved = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !out.status.success() || !saved.is_dir() {
        let _ = std::fs::remove_dir_all(&root);
        return Err(format!(
            "{} save failed: {}",
            script.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok((root, saved))
}

fn line(c: &Check) -> String {
    let mut s = c.summary.clone();
    if let Some(e) = c.evidence.first() {
        s.push_str(&format!(" ({e})"));
    }
    s
}

/// The doctor's verdict on `route` (the one the shim took; None: it took none).
pub fn route_checks(state: Option<&Path>, route: Option<&str>, r: &mut Findings) {
    let (own, dir) = match state {
        Some(d) => (None, d.to_path_buf()),
        None => match record() {
            Ok((root, saved)) => (Some(root), saved),
            Err(why) => {
                r.not_checked(
                    1,
                    "route.doctor",
                    why,
                    "run scripts/doctor, or give --state DIR saved by scripts/gdr-state-record",
                );
                return;
            }
        },
    };
    let checks = State::from_dir(&dir).map(|st| doctor::route_checks(&st));
    if let Some(root) = own {
        let _ = std::fs::remove_dir_all(root); // ours: made by record()
    }
    let checks = match checks {
        Ok(c) => c,
        Err(e) => {
            r.not_checked(
                1,
                "route.doctor",
                format!("cannot read the state {}: {e}", dir.display()),
                "give --state a folder saved by scripts/gdr-state-record save",
            );
            return;
        }
    };
    let call = format!(
        "scripts/doctor's route checks over {}",
        if state.is_some() {
            dir.display().to_string()
        } else {
            "this machine, just recorded".into()
        }
    );
    let wanted = route.map(|r| format!("route.{r}"));
    for c in &checks {
        let judged = c.id == "route.choice" || Some(&c.id) == wanted.as_ref() || route.is_none();
        if !judged {
            continue; // the route not taken: the doctor says what it lacks
        }
        let fix = if c.fix.is_empty() { "see scripts/doctor".to_string() } else { c.fix.clone() };
        match c.status {
            Status::Fail => r.fail(1, &c.id, line(c), &call, fix),
            // the doctor's WARN on a route is "cannot work here, but the other one does": for the
            // route the shim took, that is a contradiction worth a FAIL
            Status::Warn if Some(&c.id) == wanted.as_ref() => r.fail(1, &c.id, line(c), &call, fix),
            // the route not taken, or what could not be judged: the doctor's own word
            other => r.add(
                1,
                &c.id,
                other,
                line(c),
                &call,
                if other == Status::Pass { String::new() } else { fix },
            ),
        }
    }
}
