//! The rounds: in each, every node meets the partner the schedule gives it, on this task's rail.
//! Seven exchanges a round keep the two ends in step: endpoints; connected (both `dst` poisoned);
//! WRITEs done; READs done; flushes done; and each task's legs. A leg whose bytes this task
//! received is judged here (every byte against the pattern); a WRITE's bandwidth by its writer.

use super::link::{Endpoint, Half, Rig};
use super::model::{Leg, Op, Outcome, Task};
use super::nccl::Nccl;
use super::schedule::{partner, rounds};
use super::wire::Group;
use crate::selftest::cuda::Cuda;
use std::collections::BTreeMap;
use std::time::Instant;

/// An exchange, or the work of one task alone (a job of one task).
pub fn gather(g: &mut Option<Group>, mine: &str) -> Result<Vec<String>, String> {
    match g {
        Some(g) => g.all_gather(mine),
        None => Ok(vec![mine.to_string()]),
    }
}

/// The pattern's tag of a node's rail (the pattern mixes it in above bit 48).
pub fn tag(node: usize, rail: usize) -> u64 {
    1 + (node as u64 * 64 + rail as u64) % 0xffe0
}

#[allow(clippy::too_many_arguments)]
/// Every round on rail `rail` of node `me`: the legs this task saw, and (rank 0) each round's time.
pub fn run(
    g: &mut Option<Group>,
    rank: usize,
    nodes: &[Task],
    tasks: &[Task],
    me: usize,
    rail: usize,
    mut rig: Option<&mut Rig>,
    seed: u64,
    nccl: Option<Option<(&mut Nccl, &Cuda)>>,
) -> Result<(Vec<Leg>, Vec<f64>), String> {
    let mut nccl = nccl;
    let all = rounds(nodes.len());
    let mut seen = Vec::new();
    let mut secs = Vec::new();
    for (k, round) in all.iter().enumerate() {
        let t0 = Instant::now();
        let mut legs = Vec::new();
        // the peer: the task of the partner node that has this rail
        let peer = partner(round, me).and_then(|p| {
            let r = tasks
                .iter()
                .find(|t| t.node == nodes[p].node && t.rails.iter().any(|x| x.rail == rail))?
                .rank;
            Some((p, r))
        });
        let live = connect(g, rig.as_deref_mut(), peer, nodes, (me, rail), seed, &mut legs)?;
        phases(g, rig.as_deref_mut(), live.as_ref(), rail, me, seed, &mut legs)?;
        if let Some(n) = nccl.as_mut() {
            let n = n.as_mut().map(|(n, cu)| (&mut **n, *cu));
            nccl_phase(g, n, peer, (me, rail), seed, &mut legs)?;
        }
        if let Some(r) = rig.as_deref_mut() {
            r.close();
        }
        let mine_legs: Vec<String> = legs.iter().map(Leg::to_line).collect();
        let parts = gather(g, &mine_legs.join("\n"))?;
        if rank == 0 {
            secs.push(t0.elapsed().as_secs_f64());
            eprintln!(
                "fleet: round {}/{} done in {:.2} s ({} pair(s))",
                k + 1,
                all.len(),
                t0.elapsed().as_secs_f64(),
                round.len()
            );
            for p in parts {
                for l in p.lines().filter(|l| !l.is_empty()) {
                    seen.push(Leg::from_line(l)?);
                }
            }
        }
    }
    Ok((merge_legs(seen), secs))
}

/// A round's pair as this task sees it: the partner node, its endpoint, how connecting to it went.
type Pair = (usize, Endpoint, Result<(), String>);

/// This round's pair, as far as it gets: each end's QP opened and its endpoint exchanged, then
/// connected and its `dst` poisoned. The pair when both ends are ready; a pair that is not has its
/// legs in `legs` (not run, or the error that stopped it).
fn connect(
    g: &mut Option<Group>,
    mut rig: Option<&mut Rig>,
    peer: Option<(usize, usize)>,
    nodes: &[Task],
    (me, rail): (usize, usize),
    seed: u64,
    legs: &mut Vec<Leg>,
) -> Result<Option<Pair>, String> {
    let mut ep = Err("no rig".to_string());
    if let (Some(r), Some(_)) = (rig.as_deref_mut(), peer) {
        ep = r.open();
    }
    let eps = gather(g, &ep.as_ref().map_or_else(|e| format!("no {e}"), |x| x.to_line()))?;
    let got = |rk: usize| {
        Endpoint::from_line(&eps[rk])
            .ok_or_else(|| eps[rk].strip_prefix("no ").unwrap_or(&eps[rk]).to_string())
    };
    let mine = match (&ep, peer) {
        (Ok(_), Some((p, prank))) => match (got(prank), rig) {
            (Ok(theirs), Some(r)) => {
                let name = nodes[p].node.clone();
                let ok = r.connect(&theirs, &name).and_then(|()| r.poison_dst(seed));
                Some((p, theirs, ok))
            }
            (Err(why), _) => {
                not_run(
                    legs,
                    rail,
                    me,
                    p,
                    &format!("{} could not take part: {why}", nodes[p].node),
                );
                None
            }
            (_, None) => None,
        },
        (Err(why), Some((p, _))) => {
            not_run(legs, rail, me, p, &format!("{} could not take part: {why}", nodes[me].node));
            None
        }
        _ => None,
    };
    let ready = gather(g, if mine.as_ref().is_some_and(|m| m.2.is_ok()) { "ok" } else { "no" })?;
    let both = |m: &Pair| m.2.is_ok() && peer.is_some_and(|(_, pr)| ready[pr] == "ok");
    match (&mine, peer) {
        (Some((p, _, Err(e))), _) => {
            error(legs, rail, me, *p, &format!("connecting to {}: {e}", nodes[*p].node))
        }
        (Some((p, _, Ok(()))), Some((_, pr))) if ready[pr] != "ok" => not_run(
            legs,
            rail,
            me,
            *p,
            &format!("{} could not connect to {}", nodes[*p].node, nodes[me].node),
        ),
        _ => {}
    }
    Ok(mine.filter(both))
}

/// WRITE, verify, READ, flush, verify: with a live pair, else only the exchanges.
fn phases(
    g: &mut Option<Group>,
    rig: Option<&mut Rig>,
    live: Option<&Pair>,
    rail: usize,
    me: usize,
    seed: u64,
    legs: &mut Vec<Leg>,
) -> Result<(), String> {
    let (Some(r), Some((p, theirs, _))) = (rig, live) else {
        for _ in 0..3 {
            gather(g, "")?;
        }
        return Ok(());
    };
    let (p, theirs) = (*p, *theirs);
    let w = r.write(&theirs);
    legs.push(half(rail, me, p, Op::Write, &w));
    gather(g, "")?;
    // the peer's WRITE into us, every byte
    let v = r.verify(seed, tag(p, rail));
    legs.push(checked(rail, p, me, Op::Write, v));
    let read = r
        .poison_dst(seed)
        .map_err(|e| format!("poisoning dst: {e}"))
        .and_then(|()| r.read(&theirs));
    gather(g, "")?;
    // the peer's NIC finishes its READ's writes into its GPU when ours reads from it
    let flushed = r.flush(&theirs);
    gather(g, "")?;
    let v = match (&read, flushed) {
        (Err(_), _) => Ok(()),
        (Ok(_), Err(e)) => Err(format!("the flush READ of the peer's dst failed: {e}")),
        (Ok(_), Ok(())) => r.verify(seed, tag(p, rail)),
    };
    legs.push(half(rail, p, me, Op::Read, &read));
    legs.push(checked(rail, p, me, Op::Read, v));
    Ok(())
}

/// NCCL's send/recv with this round's partner `pair` (its node and task rank): the id from the
/// pair's lower node, then both ends at once; the leg of the bytes this task received (every
/// byte checked, NCCL's connections read from its log). It runs whatever the RDMA legs did.
fn nccl_phase(
    g: &mut Option<Group>,
    nccl: Option<(&mut Nccl, &Cuda)>,
    pair: Option<(usize, usize)>,
    (me, rail): (usize, usize),
    seed: u64,
    legs: &mut Vec<Leg>,
) -> Result<(), String> {
    let ready = match (&nccl, pair) {
        (Some((n, _)), Some((p, _))) if me < p => {
            n.new_id().map_or_else(|e| format!("no {e}"), |id| format!("id {id}"))
        }
        (Some(_), Some(_)) => "ok".into(),
        (None, Some(_)) => "no NCCL cannot be used on this node".into(),
        _ => "no".into(),
    };
    let all = gather(g, &ready)?;
    let Some((p, prank)) = pair else { return Ok(()) };
    let theirs = &all[prank];
    let why_not =
        [&ready, theirs].into_iter().find_map(|x| x.strip_prefix("no ").map(str::to_string));
    let id = if me < p { ready.strip_prefix("id ") } else { theirs.strip_prefix("id ") };
    let (outcome, detail) = match (nccl, id, why_not) {
        (_, _, Some(why)) => (Outcome::NotRun, why),
        (Some((n, cu)), Some(id), None) => match n.pair(cu, id, (me > p) as core::ffi::c_int, seed)
        {
            Err(e) => (Outcome::Error, e),
            Ok(proof) => match n.verify(cu, seed, tag(p, rail)) {
                Err(e) => (Outcome::Corrupt, e),
                Ok(()) => (Outcome::Ok, proof),
            },
        },
        _ => (Outcome::NotRun, "no NCCL id from the pair's first node".into()),
    };
    legs.push(Leg {
        rail: 0,
        src: p,
        dst: me,
        op: Op::Nccl,
        outcome,
        gbps: None,
        lat_us: None,
        detail,
    });
    Ok(())
}

fn half(rail: usize, src: usize, dst: usize, op: Op, h: &Half) -> Leg {
    match h {
        Ok((gbps, lat)) => Leg {
            rail,
            src,
            dst,
            op,
            outcome: Outcome::Ok,
            gbps: Some(*gbps),
            lat_us: *lat,
            detail: String::new(),
        },
        Err(e) => Leg {
            rail,
            src,
            dst,
            op,
            outcome: Outcome::Error,
            gbps: None,
            lat_us: None,
            detail: e.clone(),
        },
    }
}

fn checked(rail: usize, src: usize, dst: usize, op: Op, v: Result<(), String>) -> Leg {
    let (outcome, detail) = match v {
        Ok(()) => (Outcome::Ok, String::new()),
        Err(e) => (Outcome::Corrupt, e),
    };
    Leg { rail, src, dst, op, outcome, gbps: None, lat_us: None, detail }
}

fn not_run(legs: &mut Vec<Leg>, rail: usize, me: usize, p: usize, why: &str) {
    for (src, dst, op) in [(me, p, Op::Write), (p, me, Op::Read)] {
        legs.push(Leg {
            rail,
            src,
            dst,
            op,
            outcome: Outcome::NotRun,
            gbps: None,
            lat_us: None,
            detail: why.into(),
        });
    }
}

fn error(legs: &mut Vec<Leg>, rail: usize, me: usize, p: usize, why: &str) {
    for (src, dst, op) in [(me, p, Op::Write), (p, me, Op::Read)] {
        legs.push(Leg {
            rail,
            src,
            dst,
            op,
            outcome: Outcome::Error,
            gbps: None,
            lat_us: None,
            detail: why.into(),
        });
    }
}

/// One leg per (rail, from, to, operation): the worst outcome both ends saw, the bandwidth and
/// latency its measuring end gave, and every distinct detail of that outcome.
pub fn merge_legs(legs: Vec<Leg>) -> Vec<Leg> {
    let mut m: BTreeMap<(usize, usize, usize, Op), Leg> = BTreeMap::new();
    for l in legs {
        match m.get_mut(&(l.rail, l.src, l.dst, l.op)) {
            None => {
                m.insert((l.rail, l.src, l.dst, l.op), l);
            }
            Some(x) => {
                x.gbps = x.gbps.or(l.gbps);
                x.lat_us = x.lat_us.or(l.lat_us);
                // the worst outcome's details: bytes that differ after a transfer that failed are
                // its consequence, not news
                if l.outcome > x.outcome {
                    (x.outcome, x.detail) = (l.outcome, l.detail);
                } else if l.outcome == x.outcome
                    && !l.detail.is_empty()
                    && !x.detail.contains(&l.detail)
                {
                    x.detail = if x.detail.is_empty() {
                        l.detail
                    } else {
                        format!("{}; {}", x.detail, l.detail)
                    };
                }
            }
        }
    }
    m.into_values().collect()
}
