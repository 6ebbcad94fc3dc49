//! Link options of libgdrshim.so that lower what it costs every process it is preloaded into.
//!
//! It binds the library's references to its own functions inside the library
//! (`-Bsymbolic-functions`).
//!
//! The hooks are exported under libc's, libibverbs' and libcuda's names, and the library refers
//! to some of them itself (std's `open64`, `close` and `fcntl`; the hooks that `dlsym` hands
//! out). Left preemptible, each such reference is a symbol lookup the dynamic loader makes in
//! every process the library is preloaded into, GPU or not: 26 of them, about 15 000 of the
//! loader's instructions per exec (docs/results, callgrind's count of /bin/true). Preloaded, the
//! library comes right after the program in the lookup order, so those lookups found these very
//! definitions unless the program defines the name itself; then our own calls now reach our hook,
//! which forwards to the next definition, as it does for every other caller.
//!
//! It also starts each segment on a page of its own in the file (`-z separate-loadable-segments`).
//! Otherwise the writable segments begin wherever the code ended within its last page, and the
//! loader's relocation writes (a copy-on-write page fault each page) can spill onto one more page
//! than they fill: 63.7 minor faults per exec of /bin/true against 62.7 with the flag. The file
//! grows by the padding (about 8 KiB), which is never read.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-Bsymbolic-functions");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-z,separate-loadable-segments");
}
