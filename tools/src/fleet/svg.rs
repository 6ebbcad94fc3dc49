//! The heat map: one N×N panel per rail and operation, each cell the bandwidth of one direction
//! as a share of the slower port's active rate (green full, amber below half, red below a
//! quarter), a failure drawn as its mark on red, purple or grey. Plain SVG, written by hand.

use super::model::{Op, Outcome};
use super::render::Fleet;
use std::fmt::Write as _;

const CELL: usize = 18;

fn esc(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// A cell's fill and mark.
fn look(outcome: Outcome, share: Option<f64>) -> (&'static str, &'static str) {
    match outcome {
        Outcome::Error => ("#c62828", "×"),
        Outcome::Corrupt => ("#6a1b9a", "!"),
        Outcome::NotRun => ("#9e9e9e", "–"),
        Outcome::Slow => ("#ef6c00", "~"),
        Outcome::Ok => match share {
            Some(s) if s >= 0.5 => ("#2e7d32", ""),
            Some(s) if s >= 0.25 => ("#f9a825", ""),
            Some(_) => ("#ef6c00", ""),
            None => ("#66bb6a", ""),
        },
    }
}

pub fn svg(f: &Fleet) -> String {
    let n = f.nodes.len();
    let label_w =
        8 * f.nodes.iter().map(|t| t.node.chars().count()).max().unwrap_or(4).min(24) + 12;
    let panel = label_w + n * CELL + 24;
    let panel_h = label_w + n * CELL + 40;
    let panels: Vec<(usize, Op)> =
        f.rails().into_iter().flat_map(|r| [(r, Op::Write), (r, Op::Read)]).collect();
    let width = panel * panels.len().max(1) + 20;
    let height = panel_h + 70;
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="monospace" font-size="11">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let culprits = if f.culprits.is_empty() {
        "no culprit".to_string()
    } else {
        format!("{} culprit(s)", f.culprits.len())
    };
    let _ = writeln!(
        s,
        r#"<text x="10" y="18" font-size="14">gdrshim fleet: {} nodes, {} per transfer, {culprits}</text>"#,
        n,
        crate::size::human(f.bytes as u64)
    );
    for (k, &(rail, op)) in panels.iter().enumerate() {
        panel_at(&mut s, f, rail, op, (10 + k * panel, label_w));
    }
    legend(&mut s, height - 16);
    s.push_str("</svg>\n");
    s
}

/// One panel, its left edge at `x0`: its title, the nodes' names along both sides, the cells.
fn panel_at(s: &mut String, f: &Fleet, rail: usize, op: Op, (x0, label_w): (usize, usize)) {
    let n = f.nodes.len();
    let y0 = 40;
    let _ = writeln!(
        s,
        r#"<text x="{x0}" y="{}" font-size="12">rail {rail} {} (row: from, column: to)</text>"#,
        y0,
        op.word()
    );
    let gx = x0 + label_w;
    let gy = y0 + label_w;
    for (i, t) in f.nodes.iter().enumerate() {
        let name = esc(&t.node.chars().take(24).collect::<String>());
        let y = gy + i * CELL + CELL / 2 + 4;
        let _ = writeln!(s, r#"<text x="{}" y="{y}" text-anchor="end">{name}</text>"#, gx - 4);
        let cx = gx + i * CELL + CELL / 2 + 4;
        let _ = writeln!(
            s,
            r#"<text x="{cx}" y="{}" transform="rotate(-90 {cx} {})">{name}</text>"#,
            gy - 4,
            gy - 4
        );
    }
    for i in 0..n {
        for j in 0..n {
            let (x, y) = (gx + j * CELL, gy + i * CELL);
            if i == j {
                let _ = writeln!(
                    s,
                    r##"<rect x="{x}" y="{y}" width="{CELL}" height="{CELL}" fill="#eeeeee"/>"##
                );
                continue;
            }
            cell(s, f, rail, op, (i, j), (x, y));
        }
    }
}

/// The cell of the leg from node `i` to node `j`, at (`x`, `y`): its fill, mark and tooltip.
fn cell(
    s: &mut String,
    f: &Fleet,
    rail: usize,
    op: Op,
    (i, j): (usize, usize),
    (x, y): (usize, usize),
) {
    let Some(l) = f.leg(rail, op, i, j) else { return };
    let rate = [i, j]
        .iter()
        .filter_map(|&x| f.nodes[x].rails.iter().find(|r| r.rail == rail).and_then(|r| r.port_gbps))
        .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.min(v))));
    let share = l.gbps.zip(rate).map(|(g, r)| g / r);
    let (fill, mark) = look(l.outcome, share);
    let tip = format!(
        "{} → {} rail {rail} {}: {}{}{}",
        f.nodes[i].node,
        f.nodes[j].node,
        op.word(),
        l.outcome.word(),
        l.gbps.map_or(String::new(), |g| format!(", {g:.2} Gb/s")),
        if l.detail.is_empty() { String::new() } else { format!(": {}", l.detail) }
    );
    let _ = writeln!(
        s,
        r#"<rect x="{x}" y="{y}" width="{CELL}" height="{CELL}" fill="{fill}" stroke="white"><title>{}</title></rect>"#,
        esc(&tip)
    );
    if !mark.is_empty() {
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" fill="white" text-anchor="middle">{mark}</text>"#,
            x + CELL / 2,
            y + CELL - 5
        );
    }
}

/// The colours' legend along the bottom, its text's baseline at `ly`.
fn legend(s: &mut String, ly: usize) {
    let legend = [
        ("#2e7d32", "≥ 50% of port rate"),
        ("#f9a825", "25–50%"),
        ("#ef6c00", "slow"),
        ("#c62828", "× error"),
        ("#6a1b9a", "! corrupt"),
        ("#9e9e9e", "– not run"),
    ];
    for (k, (fill, text)) in legend.iter().enumerate() {
        let x = 10 + k * 140;
        let _ =
            writeln!(s, r#"<rect x="{x}" y="{}" width="12" height="12" fill="{fill}"/>"#, ly - 10);
        let _ = writeln!(s, r#"<text x="{}" y="{ly}">{}</text>"#, x + 16, esc(text));
    }
}
