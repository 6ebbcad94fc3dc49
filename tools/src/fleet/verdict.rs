//! The culprits: from each node's facts and every leg of every link, one verdict per fault, each
//! naming what is at fault and why. The rules:
//! - a node's own facts name it (gdrshim missing or another version, no dma-buf MRs, memlock,
//!   IOMMU, the GPU↔NIC PCIe path, a check of the doctor or the self-test that failed);
//! - a version held by fewer nodes than another is named; with no majority, the skew itself;
//! - per rail, a link whose failure a fact of one of its ends explains is that end's;
//! - of what is left, a node all of whose links on a rail failed (two peers at least) is at
//!   fault there, not its links: a fault shared by both ends of every failing pair is the node's.
//!   On every rail of it: the node; on some: that rail's NIC or port. All of them: the fleet;
//! - every other failing pair is its link.

use super::model::{Culprit, Fact, Kind, Leg, Op, Outcome, Task};
use std::collections::{BTreeMap, BTreeSet};

/// The legs that are slow: below `min_bw`% of the slower port's rate (READ: half of it), or below
/// `min_median`% of their rail's median for the operation (with three legs at least). A
/// direction is slow only where its WRITE and its READ both are: two measurements in two
/// phases of the round, each the best of several passes. What slows one of them only (another
/// task on the core, a page fault) is noise, which the other does not repeat; a slow cable or
/// port, or a path slow one way, slows both. `rate(node, rail)`: a port's active rate, Gb/s.
pub fn mark_slow(
    legs: &mut [Leg],
    rate: impl Fn(usize, usize) -> Option<f64>,
    min_bw: u32,
    min_median: u32,
) {
    let mut medians: BTreeMap<(usize, Op), Vec<f64>> = BTreeMap::new();
    for l in legs.iter() {
        if let (Outcome::Ok, Some(g)) = (l.outcome, l.gbps) {
            medians.entry((l.rail, l.op)).or_default().push(g);
        }
    }
    for v in medians.values_mut() {
        v.sort_by(f64::total_cmp);
    }
    let below = |leg: &Leg| -> Option<String> {
        let g = leg.gbps.filter(|_| leg.outcome == Outcome::Ok && leg.op != Op::Nccl)?;
        let share = if leg.op == Op::Read { 0.005 } else { 0.01 } * min_bw as f64;
        let port = rate(leg.src, leg.rail)
            .into_iter()
            .chain(rate(leg.dst, leg.rail))
            .fold(f64::INFINITY, f64::min);
        let v = &medians[&(leg.rail, leg.op)];
        let median = v[v.len() / 2];
        if port.is_finite() && share > 0.0 && g < share * port {
            Some(format!(
                "{g:.2} Gb/s = {:.0}% of the {port:.0} Gb/s port rate (floor {:.0}%)",
                100.0 * g / port,
                100.0 * share
            ))
        } else if v.len() >= 3 && g < median * min_median as f64 / 100.0 {
            Some(format!("{g:.2} Gb/s, under {min_median}% of this rail's median {median:.2} Gb/s"))
        } else {
            None
        }
    };
    let found: Vec<Option<String>> = legs.iter().map(below).collect();
    for i in 0..legs.len() {
        let Some(detail) = &found[i] else { continue };
        let l = &legs[i];
        // the same direction's other operation: below its floor too, or not measured
        let other = legs.iter().position(|o| {
            (o.rail, o.src, o.dst) == (l.rail, l.src, l.dst) && o.op != l.op && o.op != Op::Nccl
        });
        if other.is_none_or(|j| found[j].is_some() || legs[j].gbps.is_none()) {
            legs[i].outcome = Outcome::Slow;
            legs[i].detail = detail.clone();
        }
    }
}

/// Whether `f` accounts for an outcome of class `c` on `rail`.
pub fn explains(f: &Fact, rail: usize, c: Outcome) -> bool {
    if f.rail.is_some_and(|r| r != rail) || c == Outcome::Ok {
        return false;
    }
    f.blocks
        || match f.kind {
            Kind::PciePath => c == Outcome::Slow,
            Kind::NicPort | Kind::Iommu => matches!(c, Outcome::Slow | Outcome::Error),
            Kind::Memlock | Kind::Shim => matches!(c, Outcome::Error | Outcome::NotRun),
            // not blocking: a fallback or a failed check slows or stops transfers, it changes no byte
            Kind::DmaBuf | Kind::Node => c != Outcome::Corrupt,
            Kind::VersionSkew | Kind::Link | Kind::Nccl | Kind::Fleet => false,
        }
}

/// All culprits, the nodes' own first, then the versions, then what the links show.
pub fn culprits(nodes: &[Task], legs: &[Leg]) -> Vec<Culprit> {
    let mut out = Vec::new();
    for n in nodes {
        out.extend(node_culprits(n));
    }
    out.extend(versions(nodes));
    let rails: BTreeSet<usize> = legs.iter().filter(|l| l.op != Op::Nccl).map(|l| l.rail).collect();
    let mut by_rail: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for &rail in &rails {
        let (bad_nodes, rest) = links(nodes, legs, rail, false, &mut out);
        for x in bad_nodes {
            by_rail.entry(nodes[x].node.clone()).or_default().push(rail);
        }
        out.extend(rest);
    }
    for (name, bad) in by_rail {
        let n = nodes.iter().find(|n| n.node == name).expect("a node of the list");
        let has: Vec<usize> =
            n.rails.iter().map(|r| r.rail).filter(|r| rails.contains(r)).collect();
        let ev = evidence(nodes, legs, |l| {
            bad.contains(&l.rail) && (nodes[l.src].node == name || nodes[l.dst].node == name)
        });
        if has.iter().all(|r| bad.contains(r)) {
            let one =
                if has.len() == 1 { " (its only rail: the node or that rail's NIC)" } else { "" };
            out.push(Culprit::new(
                Kind::Node,
                vec![name.clone()],
                None,
                format!("every link of {name} failed, on every rail, while its peers pass with each other{one}"),
                ev,
                "the node: its NIC(s), cables and switch ports, its driver state (dmesg for Xid and mlx5 errors); the facts above".into(),
            ));
        } else {
            for r in bad {
                let nic =
                    n.rails.iter().find(|x| x.rail == r).map_or("?".into(), |x| x.nic.clone());
                out.push(Culprit::new(
                    Kind::NicPort,
                    vec![name.clone()],
                    Some(r),
                    format!("{nic} of {name} (rail {r}) fails with every peer while the node's other rails pass"),
                    evidence(nodes, legs, |l| l.rail == r && (nodes[l.src].node == name || nodes[l.dst].node == name)),
                    "that NIC: its port state and width (ibstat, ethtool), its cable and switch port, its firmware".into(),
                ));
            }
        }
    }
    if legs.iter().any(|l| l.op == Op::Nccl) {
        let (bad_nodes, rest) = links(nodes, legs, 0, true, &mut out);
        for x in bad_nodes {
            let name = &nodes[x].node;
            out.push(Culprit::new(
                Kind::Nccl,
                vec![name.clone()],
                None,
                format!("NCCL takes no GDRDMA on any channel of {name} with any peer"),
                evidence(nodes, legs, |l| l.op == Op::Nccl && (l.src == x || l.dst == x)),
                "NCCL on that node stages through host memory: is gdrshim preloaded there, and does NCCL's log say GDR off \
                      (NCCL_DEBUG=INFO, NET/IB : GPU Direct RDMA Disabled)?"
                    .into(),
            ));
        }
        out.extend(rest);
    }
    out
}

/// A node's facts as culprits, one per fault: the facts of one kind on one rail are one culprit,
/// and a fact of the whole node takes its rails' facts of that kind (gdrshim not loaded, and
/// each rail's registration that failed for it). The one that leads: the node's, then one that
/// blocks; the others' summaries and evidence follow it.
fn node_culprits(n: &Task) -> Vec<Culprit> {
    let mut facts: Vec<&Fact> = n.facts.iter().collect();
    facts.sort_by_key(|f| (f.rail.is_some(), !f.blocks));
    let mut out: Vec<Culprit> = Vec::new();
    for f in facts {
        match out.iter_mut().find(|c| c.kind == f.kind && (c.rail.is_none() || c.rail == f.rail)) {
            Some(c) => {
                let also = format!("also: {}", f.check.summary);
                for e in std::iter::once(&also).chain(&f.check.evidence) {
                    if *e != format!("also: {}", c.check.summary) && !c.check.evidence.contains(e) {
                        c.check.evidence.push(e.clone());
                    }
                }
            }
            None => out.push(Culprit {
                kind: f.kind,
                nodes: vec![n.node.clone()],
                rail: f.rail,
                check: f.check.clone(),
            }),
        }
    }
    out
}

/// The failing legs that `pick` selects, one line each.
fn evidence(nodes: &[Task], legs: &[Leg], pick: impl Fn(&Leg) -> bool) -> Vec<String> {
    legs.iter()
        .filter(|l| l.outcome != Outcome::Ok && pick(l))
        .map(|l| {
            format!(
                "rail {} {} {}→{}: {}: {}",
                l.rail,
                l.op.word(),
                nodes[l.src].node,
                nodes[l.dst].node,
                l.outcome.word(),
                l.detail
            )
        })
        .collect()
}

/// One rail's links (or NCCL's pairs): the nodes at fault there (indices) and the culprits that
/// are links. The fleet culprit, when every node fails, goes to `out` directly.
fn links(
    nodes: &[Task],
    legs: &[Leg],
    rail: usize,
    nccl: bool,
    out: &mut Vec<Culprit>,
) -> (Vec<usize>, Vec<Culprit>) {
    let mine = |l: &&Leg| if nccl { l.op == Op::Nccl } else { l.op != Op::Nccl && l.rail == rail };
    // each pair's worst outcome
    let mut pair: BTreeMap<(usize, usize), Outcome> = BTreeMap::new();
    for l in legs.iter().filter(mine) {
        let k = (l.src.min(l.dst), l.src.max(l.dst));
        let w = pair.entry(k).or_insert(Outcome::Ok);
        *w = (*w).max(l.outcome);
    }
    // NCCL's legs: also a node without NCCL (its fact explains only those)
    let explained_by = |x: usize, c: Outcome| {
        nodes[x]
            .facts
            .iter()
            .any(|f| explains(f, rail, c) || (nccl && (f.blocks || f.kind == Kind::Nccl)))
    };
    let unexplained = |&(a, b): &(usize, usize), c: Outcome| {
        c != Outcome::Ok && !explained_by(a, c) && !explained_by(b, c)
    };
    let at_fault: Vec<usize> = (0..nodes.len())
        .filter(|&x| {
            // the pairs of x whose other end is not to blame by its own facts
            let judged: Vec<Outcome> = pair
                .iter()
                .filter(|(&(a, b), &c)| {
                    (a == x || b == x) && !explained_by(if a == x { b } else { a }, c)
                })
                .map(|(_, &c)| c)
                .collect();
            // all of them failed, and not all for a reason x's own facts already give
            judged.len() >= 2
                && judged.iter().all(|&c| c != Outcome::Ok)
                && judged.iter().any(|&c| !explained_by(x, c))
        })
        .collect();
    let players: BTreeSet<usize> = pair.keys().flat_map(|&(a, b)| [a, b]).collect();
    let every = at_fault.len() >= 3 && at_fault.len() == players.len();
    if every {
        out.push(Culprit::new(
            Kind::Fleet,
            players.iter().map(|&x| nodes[x].node.clone()).collect(),
            (!nccl).then_some(rail),
            format!("every link of every node failed{}", if nccl { " to use GDRDMA in NCCL" } else { "" }),
            evidence(nodes, legs, |l| mine(&l)).into_iter().take(6).collect(),
            "what every node shares: the switch or fabric, the RoCE GID index and VLAN, the subnet manager (IB), the network \
                  the NICs' addresses are in"
                .into(),
        ));
        return (Vec::new(), Vec::new());
    }
    let mut rest = Vec::new();
    for (&(a, b), &c) in &pair {
        if !unexplained(&(a, b), c) || at_fault.contains(&a) || at_fault.contains(&b) {
            continue;
        }
        let (na, nb) = (&nodes[a].node, &nodes[b].node);
        // only each other to judge by: the link and either end cannot be told apart
        let alone =
            |x: usize, y: usize| !pair.keys().any(|&(p, q)| (p == x || q == x) && p != y && q != y);
        let note = if alone(a, b) && alone(b, a) {
            " (these two alone: the link, or either end; a third node tells them apart)"
        } else {
            ""
        };
        rest.push(Culprit::new(
            if nccl { Kind::Nccl } else { Kind::Link },
            vec![na.clone(), nb.clone()],
            (!nccl).then_some(rail),
            if nccl {
                format!("NCCL between {na} and {nb} takes a channel without GDRDMA{note}")
            } else {
                format!("the link {na} ↔ {nb} on rail {rail}: {}{note}", c.word())
            },
            evidence(nodes, legs, |l| mine(&l) && (l.src.min(l.dst), l.src.max(l.dst)) == (a, b)),
            if nccl {
                "NCCL's log of that pair (NCCL_DEBUG=INFO): the channel line and GDR's reason".into()
            } else {
                match c {
                    Outcome::Slow => "the cable or a switch port trained below its rate between these two (ethtool, ibstat, port counters)",
                    Outcome::Corrupt => {
                        "bytes changed on the way: the cable, a switch port, or a NIC's firmware between these two (symbol errors)"
                    }
                    _ => "the cable or switch path between these two: both NICs pass with every other node",
                }
                .into()
            },
        ));
    }
    (at_fault, rest)
}

/// Versions that differ: a minority named by its version, or the skew where no version leads.
fn versions(nodes: &[Task]) -> Vec<Culprit> {
    let mut whats: Vec<&str> =
        nodes.iter().flat_map(|n| n.versions.iter().map(|(w, _)| w.as_str())).collect();
    whats.sort_unstable();
    whats.dedup();
    let mut out = Vec::new();
    for what in whats {
        let mut groups: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        for n in nodes {
            if let Some((_, v)) = n.versions.iter().find(|(w, _)| w == what) {
                if v != "missing" && v != "unknown" {
                    groups.entry(v.as_str()).or_default().push(&n.node);
                }
            }
        }
        if groups.len() < 2 {
            continue;
        }
        let top = groups.values().map(Vec::len).max().unwrap_or(0);
        let leaders: Vec<&str> =
            groups.iter().filter(|(_, v)| v.len() == top).map(|(k, _)| *k).collect();
        let kind = if what == "gdrshim" { Kind::Shim } else { Kind::VersionSkew };
        let all: Vec<String> =
            groups.iter().map(|(v, ns)| format!("{what} {v}: {}", ns.join(", "))).collect();
        if leaders.len() == 1 {
            let lead = leaders[0];
            for (v, ns) in groups.iter().filter(|(v, _)| **v != lead) {
                out.push(Culprit::new(
                    kind,
                    ns.iter().map(|s| s.to_string()).collect(),
                    None,
                    format!(
                        "{what} {v} on {}, {lead} on the {} other node(s)",
                        ns.join(", "),
                        groups[lead].len()
                    ),
                    all.clone(),
                    format!("install {what} {lead} there (one version across the fleet)"),
                ));
            }
        } else {
            out.push(Culprit::new(
                Kind::VersionSkew,
                groups.values().flatten().map(|s| s.to_string()).collect(),
                None,
                format!("{what} differs across the fleet with no version on most nodes"),
                all,
                format!("pick one {what} version for every node"),
            ));
        }
    }
    out
}
