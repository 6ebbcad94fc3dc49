//! 2 MiB granules of GPU VA: the unit the map's cells (`cells`) and the NV503C registrar's
//! registration counts are keyed by, so that both answer a point or a small range in O(1).
#![forbid(unsafe_code)]

use std::ops::RangeInclusive;

/// log2 of the granule: a caching allocator's segments are 2 MiB and larger.
pub const SHIFT: u32 = 21;

/// A range wider than this many granules (128 GiB) is not kept per granule: it is left to the
/// ordered tree behind, which bounds one call's work and memory whatever length it claims.
pub const MAX_SPAN: u64 = 1 << 16;

/// The granule holding `address`.
pub fn of(address: u64) -> u64 {
    address >> SHIFT
}

/// The granules `[start, start + len)` touches (for an empty range, `start`'s), clamped at the
/// top of the address space.
pub fn touched(start: u64, len: u64) -> RangeInclusive<u64> {
    of(start)..=of(start.saturating_add(len.max(1) - 1))
}

/// Whether `span` is narrow enough to be kept per granule ([`MAX_SPAN`]).
pub fn kept(span: &RangeInclusive<u64>) -> bool {
    span.end() - span.start() < MAX_SPAN
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_cover_exactly_the_granules_touched() {
        const G: u64 = 1 << SHIFT;
        assert_eq!(touched(0, G), 0..=0);
        assert_eq!(touched(G - 1, 2), 0..=1);
        assert_eq!(touched(3 * G, 0), 3..=3, "an empty range: its start's granule");
        assert_eq!(touched(u64::MAX - 5, 100), of(u64::MAX)..=of(u64::MAX), "clamped, no overflow");
        assert!(kept(&touched(0, MAX_SPAN * G)));
        assert!(!kept(&touched(0, MAX_SPAN * G + 1)));
    }
}
