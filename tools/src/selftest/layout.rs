//! The layout check: `tests/c/selftest_layout.c`, compiled against rdma-core's
//! `<infiniband/verbs.h>` (libibverbs-dev), prints the size of each verbs struct and the offset of
//! each field the self-test uses; the Rust definitions (`ffi::layout_lines`) must print the same.

#[cfg(test)]
mod tests {
    use std::path::Path;
    use std::process::Command;

    #[test]
    fn verbs_structs_match_verbs_h() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        assert!(
            Path::new("/usr/include/infiniband/verbs.h").exists(),
            "<infiniband/verbs.h> is missing: apt-get install libibverbs-dev (CI's .ci/run installs it); the layout cannot be checked"
        );
        let dir = std::env::temp_dir().join(format!("gdrshim-layout-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let exe = dir.join("selftest_layout");
        let out = Command::new("cc")
            .args(["-Wall", "-Werror", "-o"])
            .arg(&exe)
            .arg(root.join("tests/c/selftest_layout.c"))
            .output()
            .expect("cc");
        assert!(out.status.success(), "cc: {}", String::from_utf8_lossy(&out.stderr));
        let out = Command::new(&exe).output().unwrap();
        assert!(out.status.success());
        let c: Vec<String> =
            String::from_utf8(out.stdout).unwrap().lines().map(str::to_string).collect();
        let rust = super::super::ffi::layout_lines();
        assert!(rust.len() > 60, "the Rust side lists {} items", rust.len());
        assert_eq!(
            rust.len(),
            c.len(),
            "the C and Rust lists differ in length:\nC: {c:?}\nRust: {rust:?}"
        );
        let diff: Vec<String> = rust
            .iter()
            .zip(&c)
            .filter(|(r, c)| r != c)
            .map(|(r, c)| format!("Rust `{r}` vs verbs.h `{c}`"))
            .collect();
        assert!(diff.is_empty(), "layouts differ from verbs.h:\n{}", diff.join("\n"));
        assert!(
            c.iter().any(|l| l == "ibv_qp_attr 144"),
            "ibv_qp_attr is 144 bytes on x86-64: {c:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
