//! The `extern "C"` surface. Kept thin: marshal arguments, call the real function, hand the
//! result to the pure core, restore errno, contain panics.

pub mod cuda;
pub mod dl;
pub mod fd;
pub mod ioctl;
pub mod query;
pub mod slots;
pub mod verbs;
