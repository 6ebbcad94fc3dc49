//! Links the unwinder statically into libgdrshim.so.
//!
//! std asks the linker for the unwinder as `-lgcc_s`, a shared library the dynamic loader then
//! maps in every process the shim is preloaded into, GPU or not (`ls`, shells, compilers of a
//! job). A static archive of that name first on the search path makes the linker take libgcc's
//! static unwinder (`libgcc_eh.a`, built position-independent for exactly this use) instead.
//! Measured on /bin/true spawned in a loop: 1.28× the time under a minimal C preload library with
//! libgcc_s.so.1, 1.11× without it (docs/results). The unwinder's symbols stay local (only the
//! hooks are exported), so the program's own unwinder is untouched.
//!
//! Without a C compiler that knows its libgcc_eh.a the build falls back to the shared unwinder.
//!
//! It also keeps the shim's hooks out of the dynamic symbol table of this package's programs
//! (gdrshim-replay). They link the rlib, whose hooks are named like libc's functions (`open`,
//! `ioctl`, `dlsym`…); GNU ld exports a program's definition of any symbol a shared library it
//! links against also defines, so that the library's callers reach it. A tool would then hand its
//! hooks to every library it loads. A version script that makes every symbol of the programs
//! local stops that; libgdrshim.so's exports (its own version script, from rustc) are untouched.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let bins_map = out_dir.join("bins-export-nothing.map");
    std::fs::write(&bins_map, "{\n  local: *;\n};\n").expect("OUT_DIR is writable");
    println!("cargo:rustc-link-arg-bins=-Wl,--version-script={}", bins_map.display());
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let found = Command::new(&cc)
        .arg("-print-file-name=libgcc_eh.a")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim().to_string()))
        .filter(|p| p.is_absolute() && p.is_file());
    let Some(eh) = found else {
        println!("cargo:warning=no libgcc_eh.a from `{cc} -print-file-name`: libgdrshim.so will need libgcc_s.so.1");
        return;
    };
    let out = out_dir.join("static-unwind");
    std::fs::create_dir_all(&out).expect("OUT_DIR is writable");
    std::fs::copy(&eh, out.join("libgcc_s.a")).expect("copy libgcc_eh.a");
    println!("cargo:rustc-link-search=native={}", out.display());
}
