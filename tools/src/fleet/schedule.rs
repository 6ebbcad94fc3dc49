//! The rounds: every pair of N nodes exactly once, in rounds of disjoint pairs that run at once
//! (the circle method of round-robin tournaments): N−1 rounds for an even N, N for an odd N, where
//! one node sits out each round. The wall time grows with the rounds, not with the N(N−1)/2 pairs.

/// The rounds for `n` nodes; each pair is (lower, higher).
pub fn rounds(n: usize) -> Vec<Vec<(usize, usize)>> {
    if n < 2 {
        return Vec::new();
    }
    // an odd count gets a phantom node `n`: its partner sits the round out
    let m = if n.is_multiple_of(2) { n } else { n + 1 };
    let k = m - 1; // node k stays fixed; the others turn around it
    (0..k)
        .map(|r| {
            let mut round = Vec::with_capacity(m / 2);
            let mut add = |a: usize, b: usize| {
                if a < n && b < n {
                    round.push((a.min(b), a.max(b)));
                }
            };
            add(r, k);
            for i in 1..m / 2 {
                add((r + i) % k, (r + k - i) % k);
            }
            round.sort_unstable();
            round
        })
        .collect()
}

/// `me`'s partner in `round`, or None where it sits out.
pub fn partner(round: &[(usize, usize)], me: usize) -> Option<usize> {
    round.iter().find_map(|&(a, b)| match me {
        x if x == a => Some(b),
        x if x == b => Some(a),
        _ => None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_pair_once_in_disjoint_rounds_n_minus_1_or_n() {
        for n in 0..=40 {
            let rs = rounds(n);
            let want_rounds = match n {
                0 | 1 => 0,
                n if n % 2 == 0 => n - 1,
                n => n,
            };
            assert_eq!(rs.len(), want_rounds, "n={n}");
            let mut seen = BTreeSet::new();
            for (r, round) in rs.iter().enumerate() {
                let mut busy = BTreeSet::new();
                for &(a, b) in round {
                    assert!(a < b && b < n, "n={n} round {r}: ({a},{b})");
                    assert!(busy.insert(a) && busy.insert(b), "n={n} round {r}: a node twice");
                    assert!(seen.insert((a, b)), "n={n}: ({a},{b}) twice");
                }
                // every node plays, but one node sits out each round when n is odd
                assert_eq!(busy.len(), n - n % 2, "n={n} round {r}");
                assert_eq!(round.len(), n / 2);
            }
            assert_eq!(seen.len(), n * n.saturating_sub(1) / 2, "n={n}: every pair");
            if n % 2 == 1 && n > 1 {
                // each node sits out exactly once
                let out: Vec<usize> = rs
                    .iter()
                    .map(|round| (0..n).find(|&x| partner(round, x).is_none()).unwrap())
                    .collect();
                assert_eq!(out.iter().collect::<BTreeSet<_>>().len(), n, "n={n}: {out:?}");
            }
        }
    }

    #[test]
    fn partners_are_symmetric() {
        let rs = rounds(6);
        for round in &rs {
            for x in 0..6 {
                let p = partner(round, x).unwrap();
                assert_eq!(partner(round, p), Some(x));
                assert_ne!(p, x);
            }
        }
        assert_eq!(rounds(2), vec![vec![(0, 1)]]);
    }
}
