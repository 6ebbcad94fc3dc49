//! What gdrshim's front (the libgdrshim.so that ships, without std), its core and its tools share,
//! each compiled once: the front's interface to the core, libc's symbols found without `dlsym`,
//! the fd table's pages, NVIDIA's device nodes and their names, GDRSHIM_MODE's words, the hooks'
//! assembly stubs for `dlsym`/`dlvsym`; and with `std`, the configuration read from the
//! environment and NCCL's configuration files, and the route rules (the core's and
//! `gdrshim-tool env`'s).
#![cfg_attr(not(feature = "std"), no_std)]

pub mod attach;
pub mod elf;
pub mod fdpages;
pub mod macros;
pub mod mode_word;
pub mod names;
pub mod nodes;

#[cfg(feature = "std")]
pub mod config;
#[cfg(feature = "std")]
pub mod ncclconf;
#[cfg(feature = "std")]
pub mod route;
