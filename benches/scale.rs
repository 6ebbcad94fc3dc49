//! The scale benchmark (issue 16): `cargo bench --bench scale [-- SAMPLES N...]`. Live
//! allocations grow to each N (default 10^3..10^6); at each, every operation is timed one call at
//! a time with and without the shim in the same run, against a fake driver and NIC that answer at
//! once (tests/c/scalebench.c, scalefake.c, fakeverbs.c); and the heap the shim holds per live
//! allocation, all its structures counted (mallinfo2, with minus without, growth only); and
//! gdrshim_export_dmabuf in a run on the DMA-BUF route. Prints a
//! Markdown table; absolute times are this machine's, the added time and ratio are the result.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "../tests/common/scale.rs"]
mod scale;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let samples = args.first().cloned().unwrap_or_else(|| "2000".into());
    let ns: Vec<String> = if args.len() > 1 {
        args[1..].to_vec()
    } else {
        ["1000", "10000", "100000", "1000000"].map(String::from).to_vec()
    };
    let env = common::build("scale-bench");
    scale::build(&env);
    let mut heap_args = vec!["heap".to_string()];
    heap_args.extend(ns.iter().cloned());
    let (hw, hwo) = (
        scale::heap(&scale::run(&env, true, &heap_args)),
        scale::heap(&scale::run(&env, false, &heap_args)),
    );
    let mut ops_args = vec!["ops".to_string(), samples.clone()];
    ops_args.extend(ns.iter().cloned());
    let (mut with, mut without) = (
        scale::times(&scale::run(&env, true, &ops_args)),
        scale::times(&scale::run(&env, false, &ops_args)),
    );
    // gdrshim_export_dmabuf, on the DMA-BUF route (against the fake driver's dup without it)
    let mut export_args = vec!["export".to_string(), samples.clone()];
    export_args.extend(ns.iter().cloned());
    let dmabuf = [("GDRSHIM_ROUTE", "dmabuf")];
    with.extend(scale::times(&scale::run_with(&env, true, &export_args, &dmabuf)));
    without.extend(scale::times(&scale::run_with(&env, false, &export_args, &dmabuf)));

    println!(
        "gdrshim scale benchmark: {samples} samples per operation, register mode, NV503C route (export_dmabuf: the DMA-BUF route)"
    );
    println!();
    println!("| live allocations | operation | without p50 / p99 (ns) | with p50 / p99 (ns) | added p50 / p99 (ns) | with/without p50 |");
    println!("|---:|---|---:|---:|---:|---:|");
    for ((n, op), (p50, p99)) in &with {
        let (b50, b99) = without.get(&(*n, op.clone())).copied().unwrap_or((0, 0));
        println!(
            "| {n} | {op} | {b50} / {b99} | {p50} / {p99} | {} / {} | {:.1} |",
            p50.saturating_sub(b50),
            p99.saturating_sub(b99),
            *p50 as f64 / b50.max(1) as f64
        );
    }
    println!();
    println!("| live allocations | shim heap per live allocation (bytes) | added per allocation since the row above (bytes) |");
    println!("|---:|---:|---:|");
    let mut prev: Option<(u64, u64)> = None;
    for (n, h) in &hw {
        let ours = h.saturating_sub(hwo.get(n).copied().unwrap_or(0));
        let marginal = prev.map_or("".to_string(), |(pn, ph)| {
            format!("{:.1}", ours.saturating_sub(ph) as f64 / (n - pn) as f64)
        });
        println!("| {n} | {:.1} | {marginal} |", ours as f64 / *n as f64);
        prev = Some((*n, ours));
    }
}
