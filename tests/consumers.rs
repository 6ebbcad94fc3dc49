//! Consumers out of the box (issue 28): what a program that asks CUDA about GPUDirect RDMA gets
//! with gdrshim preloaded and nothing else set, what each switch turns down, the write-ordering
//! rule of sm_90 and later, and `cuMemCreate`'s `gpuDirectRDMACapable` retry. The real
//! libgdrshim.so with the live fake driver (fakerm.c), rdma-core's own libibverbs with the fake
//! NIC (fakeverbs.c) its provider (tests/c/rigprovider.c), and the fake libcuda (fakecuda.c:
//! `FAKECUDA_ATTRS` sets a GPU's attributes, `FAKECUDA_CREATE` what its `cuMemCreate` refuses),
//! reached through `cuGetProcAddress` as cudart and NCCL reach it.

use std::collections::HashMap;
use std::path::Path;
use std::process::Command;
use std::sync::OnceLock;

mod common;
use common::fakes::Fakes;
use common::Env;

fn env() -> &'static Env {
    static E: OnceLock<Env> = OnceLock::new();
    E.get_or_init(|| {
        let e = common::build("consumers");
        let c = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c");
        let src = |f: &str| c.join(f).to_str().unwrap().to_string();
        let f = Fakes::in_dir(&e.dir);
        f.fakerm();
        f.rdma_core_nic();
        f.fakecuda();
        common::cc(&e, &["-O1", "-Wall", "-Werror", "-o", "routes", &src("routes.c"), "-ldl"]);
        e
    })
}

/// The machine: the DMA-BUF route (a dma-buf capable GPU, rdma-core with `ibv_reg_dmabuf_mr`),
/// or the NV503C route (nvidia-peermem, no dma-buf capability).
#[derive(Clone, Copy)]
enum Machine {
    Dmabuf,
    Nv503c,
}

/// `routes ARGS` with gdrshim preloaded and only the variables in `vars` set (no GDRSHIM_MODE
/// unless given: the default is what is tested); returns (stdout line, stderr).
fn run(tag: &str, m: Machine, args: &[&str], vars: &[(&str, &str)]) -> (String, String) {
    let e = env();
    let dev = e.dir.join(format!("dev-{tag}"));
    let _ = std::fs::remove_dir_all(&dev);
    common::fakedev::fake_dev(
        &dev,
        &["nvidiactl", "nvidia-uvm", "nvidia0", "nvidia1"],
        matches!(m, Machine::Nv503c),
    );
    // rdma-core's libibverbs, the fake NIC its provider on the lab's device (common::rig)
    let (rc, sysfs) = (e.dir.join("rdma-core"), dev.join("sysfs"));
    let mut c = Command::new(e.dir.join("routes"));
    c.args(args)
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env(
            "LD_PRELOAD",
            common::rig::rdma_core_preload(e, &[&e.shim, &e.dir.join("libfakerm.so")]),
        )
        .env("RDMAV_DRIVERS", rc.join("librignic"))
        .env("FAKEWIRE_SYSFS", &sysfs)
        .env("SYSFS_PATH", sysfs.join("sys"))
        .env("GDRSHIM_TEST_DEV_DIR", &dev)
        .env("GDRSHIM_LOG_LEVEL", "info")
        .env("FAKERM_DMABUF_CAPABLE", if matches!(m, Machine::Dmabuf) { "1" } else { "0" })
        .env("FAKE_LIBCUDA", e.dir.join("libcuda.so.1"))
        .envs(vars.iter().copied());
    if common::via_front() {
        c.env("GDRSHIM_TEST_VIA_FRONT", "1");
    }
    let out = c.output().unwrap();
    let (o, err) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert_eq!(out.status.code(), Some(0), "{o}\n{err}");
    let line = o
        .lines()
        .find(|l| l.starts_with("routes "))
        .unwrap_or_else(|| panic!("{o}\n{err}"))
        .to_string();
    (line, err)
}

fn field<'a>(line: &'a str, key: &str) -> &'a str {
    line.split_whitespace()
        .find_map(|kv| kv.strip_prefix(key).and_then(|v| v.strip_prefix('=')))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
}

/// (116, 110, 124) as the program read them.
fn attrs(tag: &str, m: Machine, vars: &[(&str, &str)]) -> ((String, String, String), String) {
    let (line, err) = run(tag, m, &["attrs"], vars);
    assert_eq!(field(&line, "r"), "0", "{line}\n{err}");
    ((field(&line, "a116").into(), field(&line, "a110").into(), field(&line, "a124").into()), err)
}

fn t(a: &str, b: &str, c: &str) -> (String, String, String) {
    (a.into(), b.into(), c.into())
}

fn summary(text: &str) -> HashMap<String, String> {
    let line = text
        .lines()
        .find(|l| l.starts_with("gdrshim: summary "))
        .unwrap_or_else(|| panic!("no summary in {text}"));
    line["gdrshim: summary ".len()..]
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn ld_preload_alone_gives_stock_nccl_gdr() {
    let (a, err) = attrs("zero-dmabuf", Machine::Dmabuf, &[]);
    assert_eq!(a, t("1", "1", "1"), "{err}");
    assert_eq!(summary(&err)["mode"], "register", "{err}");
    assert!(
        err.contains(
            "cuDeviceGetAttribute(GPU_DIRECT_RDMA_SUPPORTED, device 0): driver says 0, answered 1"
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED, device 0): driver says 0, answered 1"
        ),
        "{err}"
    );
    // NV503C: no dma-buf to serve, GDR still
    let (a, err) = attrs("zero-nv503c", Machine::Nv503c, &[]);
    assert_eq!(a, t("1", "1", "0"), "{err}");
    assert!(!err.contains("WARN"), "nothing to warn of: {err}");
}

#[test]
fn each_switch_turns_it_down() {
    for mode in ["shadow", "trace", "off"] {
        let (a, err) = attrs(&format!("mode-{mode}"), Machine::Dmabuf, &[("GDRSHIM_MODE", mode)]);
        assert_eq!(a, t("0", "0", "0"), "GDRSHIM_MODE={mode}: {err}");
        assert!(
            !err.contains("not advertised"),
            "a mode that registers nothing was chosen, no line: {err}"
        );
    }
    // asked for explicitly in a mode that cannot: one line says why
    let (a, err) = attrs(
        "shadow-asked",
        Machine::Dmabuf,
        &[("GDRSHIM_MODE", "shadow"), ("GDRSHIM_ADVERTISE_GDR", "1")],
    );
    assert_eq!(a, t("0", "0", "0"), "{err}");
    assert_eq!(err.matches("not advertised: gdrshim registers nothing here").count(), 1, "{err}");
    // the GDR gate alone is turned down; dma-bufs and VMM memory are still served
    let (a, err) = attrs("adv-0", Machine::Dmabuf, &[("GDRSHIM_ADVERTISE_GDR", "0")]);
    assert_eq!(a, t("0", "1", "1"), "{err}");
    assert!(!err.contains("not advertised"), "{err}");
}

#[test]
fn a_disabled_nccl_flush_is_refused_with_the_fix() {
    let (a, err) = attrs(
        "noflush",
        Machine::Dmabuf,
        &[("NCCL_GDR_FLUSH_DISABLE", "1"), ("NCCL_NET_FORCE_FLUSH", "1")],
    );
    assert_eq!(a.0, "0", "{err}");
    assert_eq!(
        err.matches("unset NCCL_GDR_FLUSH_DISABLE").count(),
        1,
        "one line naming the fix: {err}"
    );
    // NCCL's own reading of 0 is "not disabled"
    let (a, err) = attrs("flush0", Machine::Dmabuf, &[("NCCL_GDR_FLUSH_DISABLE", "0")]);
    assert_eq!(a.0, "1", "{err}");
}

#[test]
fn a_datacenter_gpu_is_left_alone() {
    let native = [("FAKECUDA_ATTRS", "116=1,110=1,124=1,75=9,76=0,118=100")];
    let (a, err) = attrs("native", Machine::Dmabuf, &native);
    assert_eq!(a, t("1", "1", "1"), "{err}");
    assert_eq!(summary(&err)["gdr_answers"], "0", "nothing answered differently: {err}");
}

#[test]
fn sm90_and_later_need_native_ordering_or_a_forced_flush() {
    let case = |tag: &str, gpu: &str, force: Option<&str>| {
        let mut vars = vec![("FAKECUDA_ATTRS", gpu)];
        if let Some(f) = force {
            vars.push(("NCCL_NET_FORCE_FLUSH", f));
        }
        let (a, err) = attrs(tag, Machine::Dmabuf, &vars);
        (a.0, err)
    };
    // RTX 4090 (sm_89): NCCL flushes received data itself, whatever the ordering
    assert_eq!(case("o-89-0", "75=8,76=9,118=0", None).0, "1");
    assert_eq!(case("o-89-100", "75=8,76=9,118=100", None).0, "1");
    // RTX 5090 class (sm_120) without native ordering: refused, one line with the fix
    let (v, err) = case("o-120-0", "75=12,76=0,118=0,117=1", None);
    assert_eq!(v, "0", "{err}");
    let line =
        err.lines().find(|l| l.contains("not advertised")).unwrap_or_else(|| panic!("{err}"));
    assert!(
        line.contains("sm_120")
            && line.contains("GPU_DIRECT_RDMA_WRITES_ORDERING 0 (NONE)")
            && line.contains("NCCL_NET_FORCE_FLUSH=1"),
        "{line}"
    );
    assert_eq!(err.matches("not advertised").count(), 1, "{err}");
    // ... given with the forced flush; a value NCCL might read otherwise is not taken as one
    assert_eq!(case("o-120-0-force", "75=12,76=0,118=0", Some("1")).0, "1");
    assert_eq!(case("o-120-0-force0", "75=12,76=0,118=0", Some("0")).0, "0");
    assert_eq!(case("o-120-0-forcex", "75=12,76=0,118=0", Some("yes")).0, "0");
    // OWNER: the GPU orders the writes for itself
    let (v, err) = case("o-120-100", "75=12,76=0,118=100,117=1", None);
    assert_eq!(v, "1", "{err}");
    assert!(
        err.contains("answered 1: gdrshim registers GPU memory for verbs here")
            && err.contains("(sm_120, GPU_DIRECT_RDMA_WRITES_ORDERING 100 (OWNER), FLUSH_WRITES_OPTIONS 0x1 HOST)"),
        "the facts it decided on: {err}"
    );
}

#[test]
fn nccls_configuration_file_counts_as_nccl_reads_it() {
    // an RTX 5090 class GPU without native ordering, and a file NCCL reads (NCCL_CONF_FILE's,
    // read before /etc/nccl.conf, which must not name the variable on this machine)
    let etc = std::fs::read_to_string("/etc/nccl.conf").unwrap_or_default();
    assert!(
        !etc.lines().any(|l| l.starts_with("NCCL_NET_FORCE_FLUSH=")),
        "this machine's /etc/nccl.conf names NCCL_NET_FORCE_FLUSH: the cases below cannot be told apart here"
    );
    let dir = env().dir.join("nccl-conf");
    std::fs::create_dir_all(&dir).unwrap();
    let conf = dir.join("nccl.conf");
    std::fs::write(&conf, "# the site's\nNCCL_DEBUG=WARN\nNCCL_NET_FORCE_FLUSH=1\n").unwrap();
    let gpu = "75=12,76=0,118=0,117=1";
    let case = |tag: &str, file: &Path, force: Option<&str>| {
        let mut vars = vec![("FAKECUDA_ATTRS", gpu), ("NCCL_CONF_FILE", file.to_str().unwrap())];
        if let Some(f) = force {
            vars.push(("NCCL_NET_FORCE_FLUSH", f));
        }
        let (a, err) = attrs(tag, Machine::Dmabuf, &vars);
        (a.0, err)
    };
    // the file alone: 116 answered 1, and the log says where the flush came from
    let (v, err) = case("conf-1", &conf, None);
    assert_eq!(v, "1", "{err}");
    assert!(!err.contains("not advertised"), "{err}");
    assert!(
        err.contains(&format!(
            "NCCL_NET_FORCE_FLUSH: \"1\" from {} (counted as forced: yes)",
            conf.display()
        )),
        "{err}"
    );
    // the environment's 0 wins over the file's 1, as in NCCL (setenv without overwrite)
    let (v, err) = case("conf-env0", &conf, Some("0"));
    assert_eq!(v, "0", "{err}");
    assert!(err.contains("NCCL_NET_FORCE_FLUSH: \"0\" from the environment"), "{err}");
    assert!(
        err.contains("a line NCCL_NET_FORCE_FLUSH=1 in /etc/nccl.conf (deploy.sh writes it)"),
        "{err}"
    );
    // no file: refused, as before
    let (v, err) = case("conf-none", &dir.join("absent.conf"), None);
    assert_eq!(v, "0", "{err}");
    assert_eq!(err.matches("not advertised").count(), 1, "{err}");
    // a file line NCCL reads as another variable's (a space before '=') forces nothing
    let spaced = dir.join("spaced.conf");
    std::fs::write(&spaced, "NCCL_NET_FORCE_FLUSH =1\n").unwrap();
    assert_eq!(case("conf-spaced", &spaced, None).0, "0");
}

/// `(r, calls, flag_after, prop_same, handle, errno)` of one cuMemCreate with the flag.
fn vmm(
    tag: &str,
    create: &str,
    ask: bool,
    vars: &[(&str, &str)],
) -> (HashMap<String, String>, String) {
    let args: &[&str] = if ask { &["vmm", "ask"] } else { &["vmm"] };
    vmm_args(tag, create, args, vars)
}

fn vmm_args(
    tag: &str,
    create: &str,
    args: &[&str],
    vars: &[(&str, &str)],
) -> (HashMap<String, String>, String) {
    let mut v = vec![("FAKECUDA_CREATE", create)];
    v.extend_from_slice(vars);
    let (line, err) = run(tag, Machine::Dmabuf, args, &v);
    let m = ["a110", "r", "calls", "flag_after", "prop_same", "handle", "errno"]
        .iter()
        .map(|k| (k.to_string(), field(&line, k).to_string()))
        .collect();
    (m, err)
}

#[test]
fn cumemcreate_is_retried_without_the_flag_only_when_libcuda_refuses_only_that() {
    let get = |m: &HashMap<String, String>, k: &str| m[k].clone();
    // libcuda accepts: one call, unchanged
    let (m, err) = vmm("vmm-accept", "accept", true, &[]);
    assert_eq!(
        (get(&m, "a110"), get(&m, "r"), get(&m, "calls")),
        ("1".into(), "0".into(), "1".into()),
        "{err}"
    );
    // libcuda refuses the flag alone: one retry without it, the memory made; the caller's struct untouched
    let (m, err) = vmm("vmm-flag", "flag", true, &[]);
    assert_eq!(
        (get(&m, "r"), get(&m, "calls"), get(&m, "flag_after"), get(&m, "prop_same")),
        ("0".into(), "2".into(), "1".into(), "1".into()),
        "{err}"
    );
    assert_eq!(get(&m, "handle"), "0x204000", "{err}");
    assert_eq!(get(&m, "errno"), "4242", "errno kept: {err}");
    assert!(
        err.contains("libcuda refused gpuDirectRDMACapable (801)")
            && err.contains("created without it"),
        "{err}"
    );
    // refused for another reason: no retry, the original error
    let (m, err) = vmm("vmm-oom", "oom", true, &[]);
    assert_eq!((get(&m, "r"), get(&m, "calls")), ("2".into(), "1".into()), "{err}");
    // refused with and without the flag: the retry fails, the original error stands
    let (m, err) = vmm("vmm-all", "all", true, &[]);
    assert_eq!(
        (get(&m, "r"), get(&m, "calls"), get(&m, "handle")),
        ("801".into(), "2".into(), "0".into()),
        "{err}"
    );
    assert!(err.contains("the original error 801 stands"), "{err}");
    // 110 never answered 1 in this process (not asked; or shadow mode): never retried
    let (m, err) = vmm("vmm-noask", "flag", false, &[]);
    assert_eq!((get(&m, "r"), get(&m, "calls")), ("801".into(), "1".into()), "{err}");
    // a flag value gdrshim does not know: untouched, one line naming it
    let (m, err) = vmm_args("vmm-flag2", "flag", &["vmm", "ask", "2"], &[]);
    assert_eq!(
        (get(&m, "r"), get(&m, "calls"), get(&m, "flag_after")),
        ("801".into(), "1".into(), "2".into()),
        "{err}"
    );
    assert_eq!(
        err.matches("gpuDirectRDMACapable=2, a value gdrshim does not know").count(),
        1,
        "{err}"
    );
    let (m, err) = vmm("vmm-shadow", "flag", true, &[("GDRSHIM_MODE", "shadow")]);
    assert_eq!(
        (get(&m, "a110"), get(&m, "r"), get(&m, "calls")),
        ("0".into(), "801".into(), "1".into()),
        "{err}"
    );
}
