//! libgdrshim.so. Everything is in the gdrshim crate (this folder); linking it is enough, since a cdylib
//! exports the `#[no_mangle]` hooks of the crates it links.

#![forbid(unsafe_code)]

extern crate gdrshim_core;

/// The map's large tables on huge pages (gdrshim's `sys::HugeTables`).
#[global_allocator]
static ALLOCATOR: gdrshim_core::sys::HugeTables = gdrshim_core::sys::HugeTables;
