//! The verdict on synthetic fleets: each fault named exactly, a clean fleet with none, and the
//! "no false culprit" rule over many random fleets (a small deterministic generator: the same
//! fleets on every run, thousands of them).

use super::model::{Culprit, Fact, Kind, Leg, Op, Outcome, Rail, Task};
use super::run::{facts_to_send, merge, node_index};
use super::schedule::rounds;
use super::verdict::culprits;
use std::collections::BTreeSet;

fn node(i: usize, rails: usize) -> Task {
    Task {
        rank: i,
        node: format!("n{i}"),
        rails: (0..rails)
            .map(|r| Rail {
                rail: r,
                gpu: format!("GPU {r}"),
                nic: format!("mlx5_{r}"),
                port_gbps: Some(100.0),
                path: "dmabuf".into(),
                loopback: "PASS".into(),
            })
            .collect(),
        facts: Vec::new(),
        versions: vec![("gdrshim".into(), "0.2.0".into()), ("driver".into(), "570.86".into())],
    }
}

/// Every leg of every pair the schedule runs, each with the outcome `f(rail, src, dst, op)`.
fn legs(n: usize, rails: usize, f: impl Fn(usize, usize, usize, Op) -> Outcome) -> Vec<Leg> {
    let mut v = Vec::new();
    for round in rounds(n) {
        for (a, b) in round {
            for rail in 0..rails {
                for (s, d) in [(a, b), (b, a)] {
                    for op in [Op::Write, Op::Read] {
                        let outcome = f(rail, s, d, op);
                        let gbps = (outcome != Outcome::NotRun).then_some(90.0);
                        v.push(Leg {
                            rail,
                            src: s,
                            dst: d,
                            op,
                            outcome,
                            gbps,
                            lat_us: Some(3.0),
                            detail: outcome.word().into(),
                        });
                    }
                }
            }
        }
    }
    v
}

fn named(cs: &[Culprit]) -> BTreeSet<(String, Vec<String>, Option<usize>)> {
    cs.iter().map(|c| (c.kind.word().to_string(), c.nodes.clone(), c.rail)).collect()
}

fn one(kind: Kind, nodes: &[&str], rail: Option<usize>) -> (String, Vec<String>, Option<usize>) {
    (kind.word().to_string(), nodes.iter().map(|s| s.to_string()).collect(), rail)
}

#[test]
fn a_clean_fleet_has_no_culprit() {
    for n in 1..=9 {
        let nodes: Vec<Task> = (0..n).map(|i| node(i, 2)).collect();
        let l = legs(n, 2, |_, _, _, _| Outcome::Ok);
        assert!(culprits(&nodes, &l).is_empty(), "n={n}");
    }
}

#[test]
fn a_dead_link_is_the_link_and_a_dead_node_is_the_node() {
    let nodes: Vec<Task> = (0..4).map(|i| node(i, 1)).collect();
    let dead = |a: usize, b: usize| {
        move |_r: usize, s: usize, d: usize, _o: Op| {
            if (s.min(d), s.max(d)) == (a, b) {
                Outcome::Error
            } else {
                Outcome::Ok
            }
        }
    };
    let cs = culprits(&nodes, &legs(4, 1, dead(1, 2)));
    assert_eq!(named(&cs), [one(Kind::Link, &["n1", "n2"], Some(0))].into(), "{cs:#?}");
    assert!(
        cs[0].check.evidence.iter().any(|e| e.contains("WRITE n1→n2: error")),
        "{:?}",
        cs[0].check.evidence
    );
    assert!(!cs[0].check.summary.contains("these two alone"));
    // every link of n3 fails: n3, not its three links
    let cs = culprits(
        &nodes,
        &legs(4, 1, |_, s, d, _| if s == 3 || d == 3 { Outcome::Error } else { Outcome::Ok }),
    );
    assert_eq!(named(&cs), [one(Kind::Node, &["n3"], None)].into(), "{cs:#?}");
    assert!(cs[0].check.summary.contains("its only rail"));
    // two nodes alone: the link, said so
    let two: Vec<Task> = (0..2).map(|i| node(i, 1)).collect();
    let cs = culprits(&two, &legs(2, 1, |_, _, _, _| Outcome::Corrupt));
    assert_eq!(named(&cs), [one(Kind::Link, &["n0", "n1"], Some(0))].into());
    assert!(cs[0].check.summary.contains("these two alone"), "{}", cs[0].check.summary);
}

#[test]
fn one_rail_of_one_node_is_its_nic_and_every_rail_is_the_node() {
    let nodes: Vec<Task> = (0..5).map(|i| node(i, 3)).collect();
    let cs = culprits(
        &nodes,
        &legs(
            5,
            3,
            |r, s, d, _| if r == 1 && (s == 2 || d == 2) { Outcome::Slow } else { Outcome::Ok },
        ),
    );
    assert_eq!(named(&cs), [one(Kind::NicPort, &["n2"], Some(1))].into(), "{cs:#?}");
    assert!(cs[0].check.summary.starts_with("mlx5_1 of n2 (rail 1)"), "{}", cs[0].check.summary);
    let cs = culprits(
        &nodes,
        &legs(5, 3, |_, s, d, _| if s == 4 || d == 4 { Outcome::Error } else { Outcome::Ok }),
    );
    assert_eq!(named(&cs), [one(Kind::Node, &["n4"], None)].into(), "{cs:#?}");
    // every link of every node: the fleet, once per rail, and no node
    let cs = culprits(
        &nodes,
        &legs(5, 3, |r, _, _, _| if r == 0 { Outcome::Error } else { Outcome::Ok }),
    );
    assert_eq!(
        named(&cs),
        [one(Kind::Fleet, &["n0", "n1", "n2", "n3", "n4"], Some(0))].into(),
        "{cs:#?}"
    );
}

#[test]
fn a_nodes_fact_takes_its_links_and_no_peer_is_blamed() {
    // n1 has no gdrshim: it could not register, every leg with it did not run
    let mut nodes: Vec<Task> = (0..4).map(|i| node(i, 1)).collect();
    nodes[1].facts.push(Fact::new(
        Kind::Shim,
        None,
        true,
        "gdrshim is not loaded on n1".into(),
        vec![],
        "preload it".into(),
    ));
    nodes[1].versions[0].1 = "missing".into();
    let cs = culprits(
        &nodes,
        &legs(4, 1, |_, s, d, _| if s == 1 || d == 1 { Outcome::NotRun } else { Outcome::Ok }),
    );
    assert_eq!(named(&cs), [one(Kind::Shim, &["n1"], None)].into(), "{cs:#?}");
    // a PCIe path fact accounts for slow links, not for corrupt ones
    let mut nodes: Vec<Task> = (0..4).map(|i| node(i, 1)).collect();
    nodes[2].facts.push(Fact::new(
        Kind::PciePath,
        Some(0),
        false,
        "GPU 0 ↔ mlx5_0 is SYS".into(),
        vec![],
        String::new(),
    ));
    let cs = culprits(
        &nodes,
        &legs(4, 1, |_, s, d, _| if s == 2 || d == 2 { Outcome::Slow } else { Outcome::Ok }),
    );
    assert_eq!(named(&cs), [one(Kind::PciePath, &["n2"], Some(0))].into(), "{cs:#?}");
    let cs =
        culprits(
            &nodes,
            &legs(4, 1, |_, s, d, _| {
                if (s.min(d), s.max(d)) == (0, 2) {
                    Outcome::Corrupt
                } else {
                    Outcome::Ok
                }
            }),
        );
    assert_eq!(
        named(&cs),
        [one(Kind::PciePath, &["n2"], Some(0)), one(Kind::Link, &["n0", "n2"], Some(0))].into(),
        "{cs:#?}"
    );
}

#[test]
fn versions_name_the_minority_or_the_skew() {
    let mut nodes: Vec<Task> = (0..4).map(|i| node(i, 1)).collect();
    nodes[3].versions[0].1 = "0.1.9".into();
    nodes[0].versions[1].1 = "575.51".into();
    let cs = culprits(&nodes, &legs(4, 1, |_, _, _, _| Outcome::Ok));
    assert_eq!(
        named(&cs),
        [one(Kind::Shim, &["n3"], None), one(Kind::VersionSkew, &["n0"], None)].into(),
        "{cs:#?}"
    );
    let shim = cs.iter().find(|c| c.kind == Kind::Shim).unwrap();
    assert_eq!(shim.check.summary, "gdrshim 0.1.9 on n3, 0.2.0 on the 3 other node(s)");
    // two against two: no majority, so no node is named alone
    nodes[2].versions[0].1 = "0.1.9".into();
    let cs = culprits(&nodes, &legs(4, 1, |_, _, _, _| Outcome::Ok));
    let skew = cs.iter().find(|c| c.check.summary.starts_with("gdrshim")).unwrap();
    assert_eq!((skew.kind, skew.nodes.len()), (Kind::VersionSkew, 4), "{skew:#?}");
}

#[test]
fn nccl_without_gdrdma_is_named_per_pair_or_per_node() {
    let nodes: Vec<Task> = (0..4).map(|i| node(i, 1)).collect();
    let mut l = legs(4, 1, |_, _, _, _| Outcome::Ok);
    for (a, b) in rounds(4).concat() {
        let bad = a == 3 || b == 3;
        let outcome = if bad { Outcome::Error } else { Outcome::Ok };
        l.push(Leg {
            rail: 0,
            src: a,
            dst: b,
            op: Op::Nccl,
            outcome,
            gbps: None,
            lat_us: None,
            detail: "via NET/IB/0".into(),
        });
    }
    let cs = culprits(&nodes, &l);
    assert_eq!(named(&cs), [one(Kind::Nccl, &["n3"], None)].into(), "{cs:#?}");
}

/// splitmix64: the same "random" fleets on every run.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// Random fleets of 3 to 12 nodes, 1 to 3 rails: some bad nodes (at most N−2, so that two good
/// nodes at least pass with each other), bad NICs, bad links and nodes with a blocking fact, each
/// with a random failure. Where the truth is one the links cannot show (a good node none of whose
/// links passes) the fleet is drawn again. The culprits must be exactly the truth.
#[test]
fn no_false_culprit_on_random_fleets() {
    let mut rng = Rng(39);
    let bad_kinds = [Outcome::Error, Outcome::Corrupt, Outcome::Slow];
    let mut checked = 0;
    while checked < 3000 {
        let n = 3 + rng.below(10);
        let rails = 1 + rng.below(3);
        let mut nodes: Vec<Task> = (0..n).map(|i| node(i, rails)).collect();
        let pick =
            |rng: &mut Rng, k: usize| -> BTreeSet<usize> { (0..k).map(|_| rng.below(n)).collect() };
        let k = rng.below(n - 1);
        let bad_nodes = pick(&mut rng, k);
        let k = rng.below(2);
        let blocked: BTreeSet<usize> = pick(&mut rng, k).difference(&bad_nodes).copied().collect();
        let bad_nics: BTreeSet<(usize, usize)> =
            (0..rng.below(3)).map(|_| (rng.below(n), rng.below(rails))).collect();
        let bad_links: BTreeSet<(usize, usize, usize)> = (0..rng.below(4))
            .map(|_| (rng.below(n), rng.below(n), rng.below(rails)))
            .filter(|(a, b, _)| a != b)
            .map(|(a, b, r)| (a.min(b), a.max(b), r))
            .collect();
        let how = bad_kinds[rng.below(3)];
        for &x in &blocked {
            nodes[x].facts.push(Fact::new(
                Kind::DmaBuf,
                None,
                true,
                "no dma-buf".into(),
                vec![],
                String::new(),
            ));
        }
        let out = |r: usize, s: usize, d: usize| -> Outcome {
            let (a, b) = (s.min(d), s.max(d));
            if blocked.contains(&a) || blocked.contains(&b) {
                Outcome::NotRun
            } else if bad_nodes.contains(&a)
                || bad_nodes.contains(&b)
                || bad_nics.contains(&(a, r))
                || bad_nics.contains(&(b, r))
                || bad_links.contains(&(a, b, r))
            {
                how
            } else {
                Outcome::Ok
            }
        };
        // the truth as the links can show it: a node whose NICs are bad on every rail is a bad node
        let mut truth_nodes = bad_nodes.clone();
        for x in 0..n {
            if !blocked.contains(&x) && (0..rails).all(|r| bad_nics.contains(&(x, r))) {
                truth_nodes.insert(x);
            }
        }
        let good: Vec<usize> =
            (0..n).filter(|x| !truth_nodes.contains(x) && !blocked.contains(x)).collect();
        let nic_bad = |x: usize, r: usize| truth_nodes.contains(&x) || bad_nics.contains(&(x, r));
        // identifiable: on each rail, every healthy end passes with a peer, and two peers at least
        let ok = (0..rails).all(|r| {
            let healthy: Vec<usize> = good.iter().copied().filter(|&x| !nic_bad(x, r)).collect();
            healthy.len() >= 2
                && healthy
                    .iter()
                    .all(|&x| healthy.iter().any(|&y| y != x && out(r, x, y) == Outcome::Ok))
        });
        if !ok {
            continue;
        }
        checked += 1;
        let l = legs(n, rails, |r, s, d, _| out(r, s, d));
        let got = named(&culprits(&nodes, &l));
        let mut want = BTreeSet::new();
        for &x in &blocked {
            want.insert(one(Kind::DmaBuf, &[&format!("n{x}")], None));
        }
        for &x in &truth_nodes {
            want.insert(one(Kind::Node, &[&format!("n{x}")], None));
        }
        for &(x, r) in &bad_nics {
            if !truth_nodes.contains(&x) && !blocked.contains(&x) {
                want.insert(one(Kind::NicPort, &[&format!("n{x}")], Some(r)));
            }
        }
        for &(a, b, r) in &bad_links {
            let clear = |x: usize| !nic_bad(x, r) && !blocked.contains(&x);
            if clear(a) && clear(b) {
                want.insert(one(Kind::Link, &[&format!("n{a}"), &format!("n{b}")], Some(r)));
            }
        }
        assert_eq!(
            got, want,
            "n={n} rails={rails} bad nodes {bad_nodes:?} blocked {blocked:?} nics {bad_nics:?} links {bad_links:?} {how:?}"
        );
    }
}

/// The legs `mark_slow` marks, as (src, dst, op).
fn slow_after(l: &mut [Leg], min_bw: u32, min_median: u32) -> BTreeSet<(usize, usize, Op)> {
    super::verdict::mark_slow(l, |_, _| Some(100.0), min_bw, min_median);
    l.iter().filter(|x| x.outcome == Outcome::Slow).map(|x| (x.src, x.dst, x.op)).collect()
}

fn set(l: &mut [Leg], src: usize, dst: usize, op: Op, gbps: f64) {
    let x = l.iter_mut().find(|x| (x.src, x.dst, x.op) == (src, dst, op)).unwrap();
    x.gbps = Some(gbps);
}

#[test]
fn slow_is_a_direction_whose_write_and_read_both_fall_below_the_floor() {
    // every leg 90 Gb/s on 100 Gb/s ports: nothing is slow
    let mut l = legs(4, 1, |_, _, _, _| Outcome::Ok);
    assert!(slow_after(&mut l, 50, 25).is_empty());
    // one WRITE at a tenth of the median, its direction's READ as fast as the rest: noise
    set(&mut l, 0, 1, Op::Write, 9.0);
    assert!(slow_after(&mut l, 0, 25).is_empty());
    // 2→3 slow in both operations: that direction, not 3→2
    set(&mut l, 2, 3, Op::Write, 9.0);
    set(&mut l, 2, 3, Op::Read, 9.0);
    assert_eq!(slow_after(&mut l, 0, 25), [(2, 3, Op::Write), (2, 3, Op::Read)].into());
    assert!(
        l.iter().any(|x| x.detail == "9.00 Gb/s, under 25% of this rail's median 90.00 Gb/s"),
        "{l:#?}"
    );
    // against the port: WRITE under half its rate, READ under a quarter
    let mut l = legs(2, 1, |_, _, _, _| Outcome::Ok);
    set(&mut l, 0, 1, Op::Write, 40.0);
    set(&mut l, 0, 1, Op::Read, 30.0);
    assert!(slow_after(&mut l, 50, 0).is_empty(), "READ at 30% of the port is above its floor");
    set(&mut l, 0, 1, Op::Read, 20.0);
    assert_eq!(slow_after(&mut l, 50, 0), [(0, 1, Op::Write), (0, 1, Op::Read)].into());
    // a READ that failed leaves the WRITE alone to judge
    let mut l = legs(
        2,
        1,
        |_, s, _, op| if s == 1 && op == Op::Read { Outcome::Error } else { Outcome::Ok },
    );
    l.iter_mut().filter(|x| x.outcome == Outcome::Error).for_each(|x| x.gbps = None);
    set(&mut l, 1, 0, Op::Write, 10.0);
    assert_eq!(slow_after(&mut l, 50, 0), [(1, 0, Op::Write)].into());
}

#[test]
fn one_fault_seen_by_several_checks_is_one_culprit() {
    let fact = |kind, rail, blocks, summary: &str| {
        Fact::new(
            kind,
            rail,
            blocks,
            summary.into(),
            vec![format!("evidence of {summary}")],
            format!("fix {summary}"),
        )
    };
    let mut n = node(0, 2);
    n.facts = vec![
        fact(Kind::Shim, Some(0), false, "loopback: not loaded"),
        fact(Kind::Shim, None, true, "not loaded"),
        fact(Kind::Shim, Some(0), true, "registration: not loaded"),
        fact(Kind::DmaBuf, Some(1), false, "loopback: refused"),
        fact(Kind::DmaBuf, Some(1), true, "registration: refused"),
        fact(Kind::PciePath, Some(1), false, "SYS"),
    ];
    let cs = culprits(&[n.clone(), node(1, 2)], &legs(2, 2, |_, _, _, _| Outcome::Ok));
    assert_eq!(
        named(&cs),
        [
            one(Kind::Shim, &["n0"], None),
            one(Kind::DmaBuf, &["n0"], Some(1)),
            one(Kind::PciePath, &["n0"], Some(1))
        ]
        .into()
    );
    // the node's fact leads, then the one that blocks; the rest are its evidence
    let shim = cs.iter().find(|c| c.kind == Kind::Shim).unwrap();
    assert_eq!(
        (shim.check.summary.as_str(), shim.check.fix.as_str()),
        ("not loaded", "fix not loaded")
    );
    assert!(shim.check.evidence.contains(&"also: loopback: not loaded".to_string()), "{shim:#?}");
    assert!(
        shim.check.evidence.contains(&"evidence of registration: not loaded".to_string()),
        "{shim:#?}"
    );
    let dmabuf = cs.iter().find(|c| c.kind == Kind::DmaBuf).unwrap();
    assert_eq!(dmabuf.check.summary, "registration: refused");
    assert_eq!(
        dmabuf.check.evidence,
        [
            "evidence of registration: refused",
            "also: loopback: refused",
            "evidence of loopback: refused"
        ]
    );
}

#[test]
fn a_legs_merge_keeps_the_worst_outcomes_details() {
    let leg = |outcome, detail: &str| Leg {
        rail: 0,
        src: 0,
        dst: 1,
        op: Op::Write,
        outcome,
        gbps: None,
        lat_us: None,
        detail: detail.into(),
    };
    // the writer's error, and what the reader then found in its poisoned buffer
    let m = super::round::merge_legs(vec![
        leg(Outcome::Error, "RETRY_EXC_ERR"),
        leg(Outcome::Corrupt, "bytes differ"),
    ]);
    assert_eq!((m.len(), m[0].outcome, m[0].detail.as_str()), (1, Outcome::Error, "RETRY_EXC_ERR"));
    let m = super::round::merge_legs(vec![
        leg(Outcome::Corrupt, "bytes differ"),
        leg(Outcome::Error, "RETRY_EXC_ERR"),
    ]);
    assert_eq!((m[0].outcome, m[0].detail.as_str()), (Outcome::Error, "RETRY_EXC_ERR"));
    let m = super::round::merge_legs(vec![leg(Outcome::Error, "a"), leg(Outcome::Error, "b")]);
    assert_eq!(m[0].detail, "a; b");
}

#[test]
fn a_fill_that_fails_is_among_the_facts_rank_0_receives() {
    // n1's source buffer cannot be filled: rank 0 hears it with the node's other facts
    let sent: Vec<String> = (0..4)
        .map(|i| {
            let mut t = node(i, 1);
            let fill =
                |_: &()| if i == 1 { Err("cuMemcpyHtoD_v2 -> 700".to_string()) } else { Ok(()) };
            let (sent, rig) = facts_to_send(&mut t, Some(()), fill, 0);
            assert_eq!(rig.is_some(), i != 1);
            sent
        })
        .collect();
    let tasks: Vec<Task> =
        sent.iter().map(|s| Task::from_lines(s)).collect::<Result<_, _>>().unwrap();
    let nodes = merge(&tasks);
    assert!(nodes[0].facts.is_empty() && nodes[2].facts.is_empty(), "{nodes:#?}");
    let f = nodes[1].facts.iter().find(|f| f.kind == Kind::Node).expect("the fill's fact");
    assert_eq!((f.rail, f.blocks), (Some(0), true));
    assert!(f.check.summary.contains("cuMemcpyHtoD_v2 -> 700"), "{f:#?}");
    // without a rig n1 took part in no leg: n1 is the culprit, no peer is blamed
    let cs = culprits(
        &nodes,
        &legs(4, 1, |_, s, d, _| if s == 1 || d == 1 { Outcome::NotRun } else { Outcome::Ok }),
    );
    assert_eq!(named(&cs), [one(Kind::Node, &["n1"], Some(0))].into(), "{cs:#?}");
    // a task that has no rig sends its facts as they are
    let mut t = node(0, 1);
    let (sent, rig) = facts_to_send(&mut t, None::<()>, |_| unreachable!(), 0);
    assert_eq!((sent, rig), (node(0, 1).to_lines(), None));
}

#[test]
fn a_tasks_node_index_is_its_nodes_place_in_the_merged_list() {
    let names = ["b", "a", "b", "c c", "a"];
    let tasks: Vec<Task> = names
        .iter()
        .enumerate()
        .map(|(i, n)| Task { rank: i, node: n.to_string(), ..Default::default() })
        .collect();
    let nodes = merge(&tasks);
    for n in names {
        assert_eq!(node_index(&names, n), nodes.iter().position(|x| x.node == n).unwrap(), "{n}");
    }
}

#[test]
fn the_fleet_json_round_trips_with_culprits_matrices_and_nccl() {
    use super::render::{Fleet, FleetJson};
    let nodes: Vec<Task> = (0..3).map(|i| node(i, 2)).collect();
    let dead = |_r: usize, s: usize, d: usize, _o: Op| {
        if (s.min(d), s.max(d)) == (0, 1) {
            Outcome::Error
        } else {
            Outcome::Ok
        }
    };
    let mut l = legs(3, 2, dead);
    l.push(Leg {
        rail: 0,
        src: 0,
        dst: 2,
        op: Op::Nccl,
        outcome: Outcome::Error,
        gbps: Some(41.25),
        lat_us: None,
        detail: "via NET/IB/0/GDRDMA \"quoted\"".into(),
    });
    let cs = culprits(&nodes, &l);
    assert!(!cs.is_empty());
    let f = Fleet {
        nodes,
        legs: l,
        culprits: cs,
        launcher: "Open MPI".into(),
        bytes: 1 << 20,
        round_secs: vec![0.5, 1.0 / 3.0],
        secs: 2.0,
        unchecked: None,
    };
    let line = f.json();
    assert_eq!(crate::json::round_trip::<FleetJson>(&line), line);
    let m: FleetJson = serde_json::from_str(&line).unwrap();
    // a culprit's check carries its kind, nodes and rail; what passed carries nothing more
    let link = m.checks.iter().find(|c| c.check.id == "culprit.link").expect(&line);
    assert_eq!(
        link.own,
        Some(super::render::CulpritKeys {
            kind: "link".into(),
            nodes: vec!["n0".into(), "n1".into()],
            rail: Some(0)
        })
    );
    // NCCL's culprit names no rail: null
    let nccl = m.checks.iter().find(|c| c.check.id == "culprit.nccl").expect(&line);
    assert_eq!(nccl.own.as_ref().map(|k| k.rail), Some(None));
    assert!(line.contains(r#","kind":"nccl","nodes":["n0","n2"],"rail":null}"#), "{line}");
    assert!(m
        .checks
        .iter()
        .filter(|c| !c.check.id.starts_with("culprit."))
        .all(|c| c.own.is_none()));
    assert!(line.contains(r#""status":"FAIL","summary":"#), "{line}");
    // numbers as the text prints them, the versions in the task's order (not sorted), a matrix per
    // rail and operation and NCCL's on rail 0 only, null on the diagonal
    assert!(line.contains(r#","exit":1,"launcher":"Open MPI","bytes":1048576,"rounds":2,"round_seconds":[0.500,0.333],"seconds":2.000,"nodes":[{"name":"n0","rails":[{"rail":0,"gpu":"GPU 0","nic":"mlx5_0","port_gbps":100.000,"path":"dmabuf","loopback":"PASS"},"#), "{line}");
    assert!(line.contains(r#""versions":{"gdrshim":"0.2.0","driver":"570.86"}}"#), "{line}");
    let ops: Vec<(usize, &str)> = m.own.matrices.iter().map(|x| (x.rail, x.op.as_str())).collect();
    assert_eq!(ops, [(0, "WRITE"), (0, "READ"), (0, "NCCL"), (1, "WRITE"), (1, "READ")]);
    assert!(line.contains(r#"{"rail":0,"op":"WRITE","rows":[[null,{"outcome":"error","gbps":90.000,"latency_us":3.000,"detail":"error"},"#), "{line}");
    assert!(line.contains(r#"{"outcome":"error","gbps":41.250,"latency_us":null,"detail":"via NET/IB/0/GDRDMA \"quoted\""}"#), "{line}");
}
