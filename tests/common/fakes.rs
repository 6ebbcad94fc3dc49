//! The fakes of tests/c, each compiled here and nowhere else: the live fake driver (fakerm.c),
//! the replaying one (fakenv.c), the stateless one (scalefake.c), the fake NIC (fakeverbs.c)
//! and its libmlx5 (fakemlx5.c), the fake libcuda (fakecuda.c). The test binaries build them
//! once, into their scratch folder; tools/tests include this file by its path.
#![allow(dead_code)] // each test binary uses its part

use std::path::{Path, PathBuf};
use std::process::Command;

/// Where the fakes come from (tests/c) and where they go.
pub struct Fakes<'a> {
    pub c: PathBuf,
    pub dir: &'a Path,
}

/// Which libibverbs the fake NIC plays, under which name, how optimised.
#[derive(Clone, Copy)]
pub struct Verbs<'a> {
    /// rdma-core older than 34: no `ibv_reg_dmabuf_mr` (-DNO_DMABUF, fakeverbs-old.map).
    pub old: bool,
    pub soname: &'a str,
    /// -O2 where a benchmark times the calls (tests/common/scale.rs), else -O1.
    pub opt: &'a str,
}

/// rdma-core 34 and later, as libibverbs.so.1.
pub const NEW: Verbs = Verbs { old: false, soname: "libibverbs.so.1", opt: "-O1" };
/// rdma-core older than 34, as libibverbs.so.1.
pub const OLD: Verbs = Verbs { old: true, ..NEW };

impl<'a> Fakes<'a> {
    /// This package's tests/c, built into `dir`.
    pub fn in_dir(dir: &'a Path) -> Self {
        Fakes { c: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/c"), dir }
    }

    fn src(&self, f: &str) -> String {
        self.c.join(f).display().to_string()
    }

    /// A shared library `out` of tests/c/`source`: the flags every fake takes, then `own`, then
    /// the libraries it links. Warnings are errors: a fake that drifts fails here, not in a test.
    fn so(&self, out: &str, source: &str, own: &[&str], libs: &[&str]) {
        if let Some(parent) = Path::new(out).parent() {
            std::fs::create_dir_all(self.dir.join(parent)).unwrap();
        }
        let src = self.src(source);
        let mut args = vec!["-shared", "-fPIC"];
        args.extend_from_slice(own);
        args.extend(["-Wall", "-Werror", "-o", out, &src]);
        args.extend_from_slice(libs);
        let o = Command::new("cc").args(&args).current_dir(self.dir).output().expect("cc");
        assert!(o.status.success(), "cc {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }

    /// The live fake driver (RM, UVM, dma-buf exports), `libfakerm.so`: preloaded after gdrshim.
    pub fn fakerm(&self) {
        self.so("libfakerm.so", "fakerm.c", &["-O1"], &["-ldl", "-lpthread"]);
    }

    /// The fake driver that replays a capture (`FAKENV_CAPTURE`), `libfakenv.so`.
    pub fn fakenv(&self) {
        self.so("libfakenv.so", "fakenv.c", &["-O1"], &["-ldl"]);
    }

    /// The stateless fake driver of the scale rig, `libscalefake.so`.
    pub fn scalefake(&self) {
        self.so("libscalefake.so", "scalefake.c", &["-O2"], &["-ldl"]);
    }

    /// The fake NIC (it plays nvidia-peermem too) as `out`.
    pub fn fakeverbs(&self, out: &str, v: Verbs) {
        let map = if v.old { "fakeverbs-old.map" } else { "fakeverbs.map" };
        let map = format!("-Wl,--version-script={}", self.src(map));
        let soname = format!("-Wl,-soname,{}", v.soname);
        let mut own = vec![v.opt, &map, &soname];
        if v.old {
            own.push("-DNO_DMABUF");
        }
        self.so(out, "fakeverbs.c", &own, &["-ldl", "-lpthread"]);
    }

    /// The fake NIC as a provider of rdma-core's own libibverbs (rigprovider.c with fakeverbs.c),
    /// `rdma-core/librignic-rdmav34.so` (RDMAV_DRIVERS names it `rdma-core/librignic`), and the
    /// lab's sysfs preload that gives it a device (tests/lab/fakesys.c), `rdma-core/fakesys.so`.
    pub fn rdma_core_nic(&self) {
        let lab = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/lab");
        let (lab_dir, map) = (
            format!("-I{}", lab.display()),
            format!("-Wl,--version-script={}", self.src("rigprovider.map")),
        );
        let fakeverbs = self.src("fakeverbs.c");
        self.so(
            "rdma-core/librignic-rdmav34.so",
            "rigprovider.c",
            &["-O1", &lab_dir, &map],
            &[&fakeverbs, "-l:libibverbs.so.1", "-ldl", "-lpthread"],
        );
        let fakelab = lab.join("fakelab.c").display().to_string();
        let o = Command::new("cc")
            .args(["-shared", "-fPIC", "-O1", "-Wall", "-Werror", "-o", "rdma-core/fakesys.so"])
            .arg(lab.join("fakesys.c"))
            .args([&fakelab, "-ldl", "-lpthread"])
            .current_dir(self.dir)
            .output()
            .expect("cc");
        assert!(o.status.success(), "cc fakesys.c: {}", String::from_utf8_lossy(&o.stderr));
    }

    /// libmlx5 as `out`, beside a fake libibverbs (the devx umem registrations).
    pub fn fakemlx5(&self, out: &str) {
        let map = format!("-Wl,--version-script={}", self.src("fakemlx5.map"));
        self.so(out, "fakemlx5.c", &["-O1", &map, "-Wl,-soname,libmlx5.so.1"], &["-ldl"]);
    }

    /// The fake libcuda, `libcuda.so.1`. -Bsymbolic: like the real libcuda, its own function
    /// addresses are its own, not interposed.
    pub fn fakecuda(&self) {
        self.so(
            "libcuda.so.1",
            "fakecuda.c",
            &["-O1", "-Wl,-Bsymbolic", "-Wl,-soname,libcuda.so.1"],
            &["-ldl"],
        );
    }
}
