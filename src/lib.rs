//! gdrshim's core: from the NVIDIA driver traffic of the process it keeps an exact map from GPU
//! virtual address to the RM memory behind it, and registers exactly that memory for GPUDirect
//! RDMA where libcuda does not: by NV503C (for nvidia-peermem) or as a dma-buf, whichever route
//! the machine supports. Built as `libgdrshim-core.so` (src/preload), which the front
//! (`libgdrshim.so`, src/front) loads at the process's first GPU touch.
//!
//! Its modules form layers whose arrows only go down (`tests/layers.rs` holds the ranks and
//! docs/architecture.md draws them): the ABI facts ([`abi`]) and the leaves ([`sys`], [`fd`]);
//! the pure core, free of `unsafe` ([`config`], [`route`], [`decode`], [`vamap`], [`tracker`],
//! [`advertise`], [`fresh`], [`registrar`], [`counters`], [`capture`], [`state`]); then the
//! runtime: the real functions ([`real`]), the fd table ([`fdtable`]), private files ([`files`]),
//! the log ([`log`]), whether the hooks act ([`activation`]), our own RM calls ([`rm`]), the queue
//! and its helper thread ([`pipeline`]), the runtime itself ([`shim`]) and the `extern "C"`
//! entry points ([`hooks`]).

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod abi;
pub mod activation;
pub mod advertise;
pub mod capture;
pub use gdrshim_common::config;
pub mod counters;
pub mod decode;
pub mod fd;
pub mod fdtable;
pub mod files;
pub mod fresh;
pub mod hooks;
pub mod log;
pub mod pipeline;
pub mod real;
pub mod registrar;
pub mod rm;
pub use gdrshim_common::route;
pub mod shim;
pub mod state;
pub mod sys;
#[cfg(test)]
mod testkit;
pub mod tracker;
pub mod vamap;

#[cfg(test)]
mod model_test;
