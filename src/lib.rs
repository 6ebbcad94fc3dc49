//! gdrshim: an LD_PRELOAD library that keeps an exact map from GPU virtual address to the RM
//! memory behind it, built from the NVIDIA driver traffic of the process, and (in later stages)
//! registers exactly that memory for GPUDirect RDMA where libcuda does not.
//!
//! Layers: [`abi`] (raw ABI), [`decode`] (ioctl → event), [`vamap`] and [`tracker`] (the pure
//! core), [`capture`] (our capture format and replay), and the thin `extern "C"` hooks.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod abi;
pub mod advertise;
pub mod born;
pub mod capture;
pub mod config;
pub mod counters;
pub mod decode;
pub mod fd;
pub mod fdtable;
pub mod files;
pub mod gate;
pub mod hooks;
pub mod log;
pub mod pipeline;
pub mod real;
pub mod registrar;
pub mod rm;
pub mod route;
pub mod shim;
pub mod sys;
#[cfg(test)]
mod testkit;
pub mod tracker;
pub mod vamap;

#[cfg(test)]
mod model_test;
