//! What the crate's model and property tests share (test builds only).
#![forbid(unsafe_code)]

/// xorshift64: a fixed seed gives the same operations on every run.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// Uniform enough in `0..n` (`n` of 0 counts as 1).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// `GDRSHIM_MODEL_OPS`, or `default`: how many random operations a model test runs.
pub fn model_ops(default: u64) -> u64 {
    std::env::var("GDRSHIM_MODEL_OPS").ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}
