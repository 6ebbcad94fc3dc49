//! gdrshim-tool: `doctor`, `verify-run` and `dmabuf-probe` (see each module).
//! Exit codes: 0 pass, 1 fail, 2 unusable input or usage error.

mod dmabuf;
mod doctor;
mod report;
mod routes;
mod verify;

use std::path::PathBuf;
use std::process::ExitCode;

const USAGE: &str = "usage:
  gdrshim-tool doctor --from SAVED_STATE_FOLDER [--json]
  gdrshim-tool verify-run --nccl-log FILE [--shim-log FILE]... [--perftest-log FILE] [--kernel-log FILE]
                          [--expect-gdr] [--expect-p2p] [--gpu-sm N] [--exit-code N] [--json]
  gdrshim-tool dmabuf-probe [--size BYTES] [--device N]
  gdrshim-tool version";

fn read(path: &str) -> Result<String, String> {
    std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).map_err(|e| format!("cannot read {path}: {e}"))
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args) {
        Ok(code) => ExitCode::from(code),
        Err(msg) => {
            eprintln!("gdrshim-tool: {msg}");
            ExitCode::from(2)
        }
    }
}

fn run(args: &[String]) -> Result<u8, String> {
    let Some(cmd) = args.first() else { return Err(USAGE.to_string()) };
    let mut json = false;
    let mut it = args[1..].iter();
    let next = |name: &str, it: &mut std::slice::Iter<String>| it.next().cloned().ok_or(format!("{name} needs a value"));
    match cmd.as_str() {
        "version" => {
            println!("gdrshim-tool {}", env!("CARGO_PKG_VERSION"));
            Ok(0)
        }
        "doctor" => {
            let mut from = None;
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--from" => from = Some(PathBuf::from(next("--from", &mut it)?)),
                    "--json" => json = true,
                    _ => return Err(format!("doctor: unknown argument {a}\n{USAGE}")),
                }
            }
            let from = from.ok_or("doctor needs --from FOLDER (scripts/doctor records the live machine first)")?;
            let st = doctor::State::from_dir(&from).map_err(|e| e.to_string())?;
            let r = doctor::doctor(&st);
            print!("{}", if json { r.json() + "\n" } else { r.text() });
            Ok(if r.failed() { 1 } else { 0 })
        }
        "verify-run" => {
            let mut inp = verify::Inputs::default();
            let mut have_nccl = false;
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--nccl-log" => {
                        inp.nccl_log = read(&next(a, &mut it)?)?;
                        have_nccl = true
                    }
                    "--shim-log" => inp.shim_logs.push(read(&next(a, &mut it)?)?),
                    "--perftest-log" => inp.perftest_log = Some(read(&next(a, &mut it)?)?),
                    "--kernel-log" => inp.kernel_log = Some(read(&next(a, &mut it)?)?),
                    "--expect-gdr" => inp.expect_gdr = true,
                    "--expect-p2p" => inp.expect_p2p = true,
                    "--gpu-sm" => inp.gpu_sm = Some(next(a, &mut it)?.parse().map_err(|_| "--gpu-sm takes a number such as 89")?),
                    "--exit-code" => inp.exit_code = Some(next(a, &mut it)?.parse().map_err(|_| "--exit-code takes a number")?),
                    "--json" => json = true,
                    _ => return Err(format!("verify-run: unknown argument {a}\n{USAGE}")),
                }
            }
            if !have_nccl {
                return Err("verify-run needs --nccl-log FILE".into());
            }
            verify::usable(&inp.nccl_log)?;
            let r = verify::verify(&inp);
            print!("{}", if json { r.json() + "\n" } else { r.text() });
            if !json {
                println!("{}", if r.failed() { "RESULT: FAIL" } else { "RESULT: PASS" });
            }
            Ok(if r.failed() { 1 } else { 0 })
        }
        "dmabuf-probe" => {
            let mut size: usize = 2 << 20;
            let mut device = 0;
            while let Some(a) = it.next() {
                match a.as_str() {
                    "--size" => size = next(a, &mut it)?.parse().map_err(|_| "--size takes bytes")?,
                    "--device" => device = next(a, &mut it)?.parse().map_err(|_| "--device takes a number")?,
                    _ => return Err(format!("dmabuf-probe: unknown argument {a}\n{USAGE}")),
                }
            }
            let r = dmabuf::probe(size, device);
            print!("{}", r.text());
            Ok(if r.failed() { 1 } else { 0 })
        }
        _ => Err(USAGE.to_string()),
    }
}
