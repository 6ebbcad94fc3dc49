//! The `extern "C"` surface. Kept thin: marshal arguments, call the real function, hand the
//! result to the pure core, restore errno, contain panics.
//!
//! Each exported `unsafe extern "C" fn` has exactly the contract of the C function it stands in
//! for (named after it), so they carry no separate `# Safety` sections.
#![allow(clippy::missing_safety_doc)]

pub mod cuda;
pub mod dl;
pub mod fd;
pub mod front;
pub mod ioctl;
pub mod mlx5dv;
pub mod query;
pub mod slots;
pub mod verbs;
