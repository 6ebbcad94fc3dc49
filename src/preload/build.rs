//! Link options of libgdrshim.so that lower what it costs every process it is preloaded into.
//!
//! It does not bind the hooks' own names inside the library (`-Bsymbolic-functions` would save
//! 26 symbol lookups per exec, about 15 000 of the loader's instructions, but no measurable time):
//! the hook table compares what `dlsym` finds with the address of the exported name, which must
//! stay the process's global definition when another interposer is ahead of gdrshim (review).
//!
//! It starts each segment on a page of its own in the file (`-z separate-loadable-segments`).
//! Otherwise the writable segments begin wherever the code ended within its last page, and the
//! loader's relocation writes (a copy-on-write page fault each page) can spill onto one more page
//! than they fill: 63.7 minor faults per exec of /bin/true against 62.7 with the flag. The file
//! grows by the padding (about 8 KiB), which is never read.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,separate-loadable-segments");
}
