//! The verbs calls beyond ibv_reg_mr through the real libgdrshim.so on the fake machine (see
//! tests/routes.rs): libmlx5's devx umems on both routes, and ibv_reg_mr_ex. The umems' programs
//! run on rdma-core's own libibverbs with the fake NIC its provider, but their libmlx5 is the
//! stand-in (tests/c/fakemlx5.c): rdma-core's libmlx5 answers devx only on an mlx5 device. The
//! ibv_reg_mr_ex program runs on the fake NIC as the libibverbs (tests/c/fakeverbs.c): rdma-core
//! 44 has no ibv_reg_mr_ex (IBVERBS_1.15).

use std::sync::OnceLock;

mod common;
use common::rig::{self, find_line, summary, Rig};
use common::Env;

fn env() -> &'static Env {
    static E: OnceLock<Env> = OnceLock::new();
    E.get_or_init(|| rig::build("routes-devx", &["routes"]))
}

/// `routes ARGS` on a fresh fake machine; returns (exit code, stdout, stderr).
fn routes(tag: &str, rig: &Rig, args: &[&str], extra: &[(&str, &str)]) -> (i32, String, String) {
    rig::routes(env(), tag, rig, args, extra, None)
}

/// mlx5dv_devx_umem_reg/_reg_ex on GPU memory, DMA-BUF route: the fake libmlx5 is asked
/// reg_ex with MLX5DV_UMEM_MASK_DMABUF and a buffer that is exactly that memory (checked page by
/// page), the caller's page sizes kept; while it lives the umem's own reference to the buffer
/// and gdrshim's one fd of it (kept for every MR over the same pieces) are open, none after. Host memory, a miss, an unknown mask bit and the program's own
/// dma-buf pass through untouched; errno is the caller's.
#[test]
fn devx_umems_on_the_dmabuf_route_are_dmabuf_umems_of_exactly_the_memory() {
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    let (code, out, err) = routes("umem-dmabuf", &rig, &["umem"], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    let what = format!("{out}\n{err}");
    assert_eq!(
        find_line(&out, &err, "umem1 ok"),
        "umem1 ok=1 errno=4242 legacy=0 ex=1 mask=0x1 pgsz=0xfffffffffffff000 regs=0 bufs=2",
        "{what}"
    );
    assert_eq!(find_line(&out, &err, "umem1 after"), "umem1 after regs=0 bufs=0", "{what}");
    assert_eq!(
        find_line(&out, &err, "umem2"),
        "umem2 ok=1 errno=4242 mask=0x1 pgsz=0xffffffffffff0000 regs=0 caller_mask=0",
        "{what}"
    );
    assert_eq!(find_line(&out, &err, "umem host"), "umem host ok=1 legacy=1 ex=0", "{what}");
    assert_eq!(find_line(&out, &err, "umem miss"), "umem miss ok=0 errno=14 ex=0 regs=0", "{what}");
    assert_eq!(
        find_line(&out, &err, "umem unknown"),
        "umem unknown ok=0 errno=95 mask=0x20",
        "{what}"
    );
    assert_eq!(find_line(&out, &err, "umem own"), "umem own ok=0 errno=9", "{what}");
    assert!(out.contains("routes umem ok buffers_left=0 failures=0"), "{what}");
    assert!(
        err.contains(
            "mlx5dv_devx_umem_reg addr=0x7f0000010000 len=0x40000 pass0 hit: exported 1 piece(s)"
        ),
        "{what}"
    );
    assert_eq!(
        err.matches("comp_mask bits 0x20 unknown to gdrshim").count(),
        1,
        "one line names it: {what}"
    );
    let s = summary(&err);
    assert_eq!(
        (s["dmabuf_exports"].as_str(), s["dmabuf_live"].as_str(), s["rm_errors"].as_str()),
        ("2", "0", "0"),
        "{what}"
    );
}

/// The same calls on the NV503C route: the memory is registered with RM before the provider's
/// call (the fake NIC finds it) and unregistered at mlx5dv_devx_umem_dereg.
#[test]
fn devx_umems_on_the_nv503c_route_hold_a_registration_until_dereg() {
    let rig = Rig { peermem: true, capable: false, new_verbs: true };
    let (code, out, err) = routes("umem-nv", &rig, &["umem"], &[]);
    assert_eq!(code, 0, "{out}\n{err}");
    let what = format!("{out}\n{err}");
    assert_eq!(
        find_line(&out, &err, "umem1 ok"),
        "umem1 ok=1 errno=4242 legacy=1 ex=0 mask=0 pgsz=0 regs=1 bufs=0",
        "{what}"
    );
    assert_eq!(find_line(&out, &err, "umem1 after"), "umem1 after regs=0 bufs=0", "{what}");
    assert_eq!(
        find_line(&out, &err, "umem2"),
        "umem2 ok=1 errno=4242 mask=0 pgsz=0xffffffffffff0000 regs=1 caller_mask=0",
        "{what}"
    );
    assert_eq!(find_line(&out, &err, "umem host"), "umem host ok=1 legacy=1 ex=0", "{what}");
    assert_eq!(find_line(&out, &err, "umem miss"), "umem miss ok=0 errno=14 ex=0 regs=0", "{what}");
    assert_eq!(
        find_line(&out, &err, "umem unknown"),
        "umem unknown ok=0 errno=95 mask=0x20",
        "{what}"
    );
    assert!(out.contains("routes umem ok buffers_left=0 failures=0"), "{what}");
    let s = summary(&err);
    assert_eq!(
        (s["registered"].as_str(), s["unregistered"].as_str(), s["live_registrations"].as_str()),
        ("2", "2", "0"),
        "{what}"
    );
}

/// A provider that refuses the dma-buf umem: the original call is delegated untouched and fails
/// as without gdrshim, errno the provider's, no buffer left.
#[test]
fn a_refused_dmabuf_umem_leaves_the_call_as_it_was() {
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    let (code, out, err) =
        routes("umem-refused", &rig, &["umem"], &[("FAKEMLX5_DMABUF_FAIL", "95")]);
    let what = format!("{out}\n{err}");
    assert_eq!(code, 0, "{what}");
    assert_eq!(
        find_line(&out, &err, "umem1 ok"),
        "umem1 ok=0 errno=14 legacy=1 ex=1 mask=0x1 pgsz=0xfffffffffffff000 regs=0 bufs=0",
        "{what}"
    );
    assert!(out.contains("routes umem ok buffers_left=0"), "{what}");
    assert!(
        err.contains("mlx5dv_devx_umem_reg_ex refused the export")
            && err.contains("delegating the original call"),
        "{what}"
    );
}

/// ibv_reg_mr_ex of GPU memory on the DMA-BUF route stays ibv_reg_mr_ex: the address becomes the
/// buffer (FD, FD_OFFSET, IOVA) and the DMA handle goes with it; a mask bit gdrshim does not
/// know leaves the call untouched, with one line naming it.
#[test]
fn reg_mr_ex_keeps_every_mask_bit_it_does_not_convert() {
    let rig = Rig { peermem: false, capable: true, new_verbs: true };
    // rdma-core 44 has no ibv_reg_mr_ex: the fake NIC is the libibverbs here
    let (code, out, err) = rig::routes_on_fake_verbs(env(), "mrex", &rig, &["mrex"], &[]);
    let what = format!("{out}\n{err}");
    assert_eq!(code, 0, "{what}");
    assert_eq!(
        find_line(&out, &err, "mrex dmah"),
        "mrex dmah ok=1 errno=4242 addr_shown=1 mask=0x1d dmah=0xd0a4",
        "{what}"
    );
    assert_eq!(
        find_line(&out, &err, "mrex unknown"),
        "mrex unknown ok=0 errno=95 mask=0x42",
        "{what}"
    );
    assert!(out.contains("routes mrex ok buffers_left=0 failures=0"), "{what}");
    assert_eq!(err.matches("comp_mask bits 0x40 unknown to gdrshim").count(), 1, "{what}");
}
