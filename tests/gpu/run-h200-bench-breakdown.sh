#!/usr/bin/env bash
# Where the alloc/free loop's extra time goes (issue 2): the benchmark without the shim, with the
# shim in off mode (hooks present, inert), and in shadow mode, interleaved; then one shadow run
# with GDRSHIM_TIMING=1, whose summary names the most expensive request kinds.
# Usage: tests/gpu/run-h200-bench-breakdown.sh OUTDIR
set -u
OUT=${1:?outdir}
mkdir -p "$OUT"
# the test knobs (GDRSHIM_TEST_*, GDRSHIM_TIMING, GDRSHIM_BENCH_PAUSE) are in the knobs build only:
# cargo build --release --lib --features knobs, with CARGO_TARGET_DIR=target/knobs
SHIM=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}")
B=/tmp/gdrshim-bd; mkdir -p "$B"
nvcc -O2 -arch=sm_90 -o "$B/bench" tests/gpu/bench.cu -lcuda -ldl 2>&1 | grep -i " error"
: >"$B/raw"
for _ in $(seq 9); do
  {
    "$B/bench" | sed 's/^/none /'
    GDRSHIM_MODE=off LD_PRELOAD="$SHIM" "$B/bench" | sed 's/^/off /'
    GDRSHIM_MODE=shadow GDRSHIM_SUMMARY=0 LD_PRELOAD="$SHIM" "$B/bench" | sed 's/^/shadow /'
  } >>"$B/raw"
done
cp "$B/raw" "$OUT/breakdown-raw.txt"
for _ in 1 2; do GDRSHIM_MODE=shadow GDRSHIM_TIMING=1 LD_PRELOAD="$SHIM" "$B/bench" 2>&1 | grep -E "^gdrshim: summary|bench" | sed 's/.*\(hook_ns_per_nv_ioctl=[^ ]* hook_top=[^ ]* alloc_hook_ns_per_call=[^ ]*\).*/\1/' | tee -a "$OUT/breakdown-timing.txt"; done
python3 - "$B/raw" <<'PY' | tee "$OUT/breakdown.txt"
import re, statistics, sys, collections
d = collections.defaultdict(list)
for l in open(sys.argv[1]):
    who, rest = l.split(" ", 1)
    m = re.search(r"bench (\w+)(?: size=(\d+))? \w+=([\d.]+)", rest)
    if m: d[(m.group(1) + (("/" + m.group(2)) if m.group(2) else ""), who)].append(float(m.group(3)))
for k in sorted({k for k, _ in d}):
    base = statistics.median(d[(k, "none")])
    row = " ".join(f"{w}={statistics.median(d[(k, w)]):.1f} (x{statistics.median(d[(k, w)])/base:.3f}, min x{min(d[(k, w)])/min(d[(k, 'none')]):.3f})" for w in ("off", "shadow"))
    print(f"{k:22} none={base:.1f} {row} n={len(d[(k, 'none')])}")
PY
