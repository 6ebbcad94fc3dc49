#!/usr/bin/env bash
# Builds of gdrshim side by side in one device session (the records in docs/results/h200-variants4/ and docs/results/history/h200-variants*/
# name theirs): each variant in its own process, the order of the variants rotated per round; in
# each process `bench alloc-ab SIZE 200 40`: 40 pairs of 200-iteration batches, the shim working in
# one and paused (gdrshim_bench_pause) in the other; then one GDRSHIM_TIMING run per variant.
# Usage: tests/gpu/run-h200-variants.sh OUTDIR ROUNDS VARIANT...
#   VARIANT = NAME[:SO[:ENV=VALUE]]: bench-variants/SO.so (default NAME.so), with ENV set if given (else GDRSHIM_APPLY_THREAD=1, the default, which builds before it ignore)
set -u
OUT=${1:?out}; ROUNDS=${2:?rounds}; shift 2
mkdir -p "$OUT"
V=("$@")
B=/tmp/gdrshim-ab; mkdir -p "$B"
{ grep -m1 "model name" /proc/cpuinfo; grep -m1 -o -w cldemote /proc/cpuinfo || echo "no cldemote"; nproc; } >"$OUT/cpu.txt"
nvcc -O2 -arch=sm_90 -o "$B/bench" tests/gpu/bench.cu -lcuda -ldl 2>&1 | grep -i " error"
name() { echo "${1%%:*}"; }
so() { local r=${1#*:}; [ "$r" = "$1" ] && r=$1; echo "$PWD/bench-variants/${r%%:*}.so"; }
envs() { local r=${1#*:}; case $r in *:*) echo "${r#*:}" ;; *) echo "GDRSHIM_APPLY_THREAD=1" ;; esac; }
for p in $(seq 0 $((ROUNDS - 1))); do
  for k in $(seq 0 $((${#V[@]} - 1))); do
    v=${V[$(( (p + k) % ${#V[@]} ))]}
    for size in 2097152 4096; do
      env "$(envs "$v")" GDRSHIM_MODE=shadow GDRSHIM_BENCH_PAUSE=1 LD_PRELOAD="$(so "$v")" "$B/bench" alloc-ab $size 200 40 2>&1 | grep -E "^bench|^gdrshim: summary" | sed "s/^/$(name "$v") proc$p /"
    done
  done
done >"$OUT/variants-raw.txt"
for v in "${V[@]}"; do
  echo "## $(name "$v")"; env "$(envs "$v")" GDRSHIM_MODE=shadow GDRSHIM_TIMING=1 LD_PRELOAD="$(so "$v")" "$B/bench" alloc 2097152 9000 2>&1 | grep -E "^bench|summary" | grep -oE "ns_per_iter=[0-9.]+|nv_ioctls=[0-9]+|native=[0-9]+|matched=[0-9]+|mismatched=[0-9]+|hook_ns_per_nv_ioctl=[0-9]+|hook_top=[^ ]+|alloc_hook_ns_per_call=[0-9]+|helper_batches=[0-9]+" | tr '\n' ' '; echo
done >"$OUT/variants-timing.txt"
python3 - "$OUT/variants-raw.txt" <<'PY' | tee "$OUT/variants.txt"
import re, sys, statistics, random
d = {}
for l in open(sys.argv[1]):
    m = re.match(r"(\S+) (\S+) bench alloc_ab size=(\d+) pair=\d+ on=([\d.]+) off=([\d.]+)", l)
    if m: d.setdefault((m.group(1), m.group(3)), []).append((m.group(2), float(m.group(4)) / float(m.group(5))))
def ci(xs, n=5000):
    random.seed(1); meds = sorted(statistics.median(random.choices(xs, k=len(xs))) for _ in range(n)); return meds[int(.025*n)], meds[int(.975*n)]
for (v, size), rs in sorted(d.items()):
    xs = [r for _, r in rs]; a, b = ci(xs)
    per = {}
    for p, r in rs: per.setdefault(p, []).append(r)
    print(f"{v:12} {size:>8} on/off {statistics.median(xs):.4f} [{a:.4f}, {b:.4f}] pairs={len(xs)} per process: " + " ".join(f"{statistics.median(x):.4f}" for x in per.values()))
PY
grep "summary" "$OUT/variants-raw.txt" | while read -r v p rest; do
  echo "$v $p $(grep -oE "native=[0-9]+|matched=[0-9]+|uncovered=[0-9]+|helper_batches=[0-9]+|bench_pauses=[0-9]+" <<<"$rest" | tr '\n' ' ')"
done >"$OUT/variants-summaries.txt"
cat "$OUT/variants-timing.txt"
