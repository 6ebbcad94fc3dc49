//! libgdrshim.so. Everything is in the gdrshim crate (this folder); linking it is enough, since a cdylib
//! exports the `#[no_mangle]` hooks of the crates it links.

#![forbid(unsafe_code)]

extern crate gdrshim_core;
