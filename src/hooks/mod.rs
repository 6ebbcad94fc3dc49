//! The `extern "C"` surface. Kept thin: marshal arguments, call the real function, hand the
//! result to the pure core, restore errno, contain panics.
//!
//! Each exported `unsafe extern "C" fn` has exactly the contract of the C function it stands in
//! for (named after it), so they carry no separate `# Safety` sections.
#![allow(clippy::missing_safety_doc)]

pub mod caller;
pub mod cuda;
pub mod cuda_ctx;
pub mod cuda_gdr;
pub mod decision;
pub mod dl;
pub mod fd;
pub mod front;
pub mod ioctl;
pub mod mlx5dv;
pub mod query;
pub mod slots;
pub mod verbs;
pub mod within;

#[cfg(test)]
mod tests {
    /// docs/registration-entry-points.md: its "hooked" rows are exactly what the hooks wrap, at
    /// those versions, and its "not hooked" rows are not wrapped.
    #[test]
    fn the_documented_entry_points_are_the_hooked_ones() {
        let doc = include_str!("../../docs/registration-entry-points.md");
        let mut hooked = Vec::new();
        let mut rows = 0;
        for l in doc.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let (name, version, status) = (cells[1].trim_matches('`'), cells[2], cells[4]);
            let wrapped = super::verbs::by_symbol(name.as_bytes(), Some(version.as_bytes()))
                .is_some()
                || super::mlx5dv::by_symbol(name.as_bytes(), Some(version.as_bytes())).is_some();
            match status {
                "hooked" => {
                    assert!(wrapped, "{name}@{version} is documented as hooked");
                    hooked.push((name, version));
                }
                "not hooked" => assert!(!wrapped, "{name}@{version} is documented as not hooked"),
                other => panic!("{name}: status {other:?}"),
            }
            rows += 1;
        }
        assert!(rows > 30, "the table was read: {rows} rows");
        let mut code: Vec<(&str, &str)> =
            super::verbs::HOOKED.iter().chain(super::mlx5dv::HOOKED).copied().collect();
        hooked.sort();
        code.sort();
        assert_eq!(hooked, code, "the documented hooked entry points and the code's");
    }
}
