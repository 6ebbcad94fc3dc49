#!/usr/bin/env bash
# Benchmarks on the GPU machine: with vs without the shim in one run, interleaved, medians.
# Usage: tests/gpu/run-h200-bench.sh OUTDIR
set -u
OUT=${1:?outdir}
mkdir -p "$OUT"
# the test knobs (GDRSHIM_TEST_*, GDRSHIM_TIMING, GDRSHIM_BENCH_PAUSE) are in the knobs build only:
# cargo build --release --lib --features knobs, with CARGO_TARGET_DIR=target/knobs
SHIM=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}")
# shellcheck source=tests/gpu/lib-stubnic.sh
source tests/gpu/lib-stubnic.sh
B=/tmp/gdrshim-bench; mkdir -p "$B"
nvcc -O2 -arch=sm_90 -o "$B/bench" tests/gpu/bench.cu -lcuda -ldl 2>&1 | grep -i " error" 
stubnic "$B"
nvcc -O2 -arch=sm_90 -o "$B/reg_cycle" tests/gpu/reg_cycle.cu -lcuda -ldl -L"$B/stub" -l:libibverbs.so.1 2>&1 | grep -i " error"
: >"$B/raw"
PIN=""; command -v taskset >/dev/null && PIN="taskset -c 3"  # one core for both sides: less scheduling noise
for _ in $(seq 15); do
  $PIN "$B/bench" | sed 's/^/none /' >>"$B/raw"
  GDRSHIM_MODE=shadow GDRSHIM_SUMMARY=0 LD_PRELOAD="$SHIM" $PIN "$B/bench" | sed 's/^/shadow /' >>"$B/raw"
done
for _ in $(seq 7); do
  "$B/reg_cycle" 0 bench | sed 's/^/none /' >>"$B/raw"
  GDRSHIM_MODE=register GDRSHIM_SUMMARY=0 LD_PRELOAD="$B/suppress503c.so:$SHIM" SUPPRESS_LOG=/dev/null "$B/reg_cycle" 0 bench | sed 's/^/shim /' >>"$B/raw"
done
echo "### one shadow run with GDRSHIM_TIMING=1 (time spent in the ioctl hook outside the real call)"
GDRSHIM_MODE=shadow GDRSHIM_TIMING=1 LD_PRELOAD="$SHIM" "$B/bench" 2>&1 | tail -5
cp "$B/raw" "$OUT/bench-raw.txt"
python3 - "$B/raw" <<'PY'
import re, statistics, sys, collections
d = collections.defaultdict(list)
for l in open(sys.argv[1]):
    who, _, rest = l.split(" ", 2)
    name = rest.split()[0]
    for k, v in re.findall(r"(\w+)=([\d.]+)", rest):
        if k in ("size",): continue
        size = re.search(r"size=(\d+)", rest)
        key = f"{name}{'/'+size.group(1) if size else ''}:{k}"
        d[(key, who)].append(float(v))
keys = sorted({k for k, _ in d})
print(f"{'measure':44} {'without':>10} {'with':>10} {'ratio':>7} {'added':>10}  (medians; n per side)")
for k in keys:
    a = d.get((k, "none")); b = d.get((k, "shadow")) or d.get((k, "shim"))
    if not a or not b: continue
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"{k:44} {ma:10.1f} {mb:10.1f} {mb/ma:7.3f} {mb-ma:10.1f}  n={len(a)}")
PY
