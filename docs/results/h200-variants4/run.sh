#!/usr/bin/env bash
# How h200-variants4/ was made (kept as the record; the builds were carried as bench-variants/*.so
# and are not in the repository). Each variant in its own process, the order of the variants
# rotated per round, 4 rounds (each variant once in each position); in each process `bench alloc-ab SIZE 200 40`: 40 pairs of
# 200-iteration batches, the shim working in one and paused (gdrshim_bench_pause) in the other.
#   base        = 8fd0257 (end of the previous session: full batches applied by the thread that
#                 fills them)
#   spin        = the final build (819de74): full batches applied on the helper thread (looks every millisecond); the
#                 queue's lock and hot fields in one cache line, released with a plain store
#   spin-inline = the same build with GDRSHIM_APPLY_THREAD=0 (same code and layout, no thread)
#   demote      = spin + the helper pushes the applied batch's lines to the shared cache
#                 (CLDEMOTE, a NOP where unsupported) before the hooks write them again
set -u
OUT=${1:?out}
B=/tmp/gdrshim-ab; mkdir -p "$B"
{ grep -m1 "model name" /proc/cpuinfo; grep -m1 -o -w cldemote /proc/cpuinfo || echo "no cldemote"; nproc; } >"$OUT/cpu.txt"
nvcc -O2 -arch=sm_90 -o "$B/bench" tests/gpu/bench.cu -lcuda -ldl 2>&1 | grep -i " error"
V=(base spin spin-inline demote)
so() { case $1 in spin-inline) echo spin ;; *) echo "$1" ;; esac; }
thr() { case $1 in spin-inline) echo 0 ;; *) echo 1 ;; esac; }
for p in 0 1 2 3; do
  for k in 0 1 2 3; do
    v=${V[$(( (p + k) % 4 ))]}
    for size in 2097152 4096; do
      GDRSHIM_MODE=shadow GDRSHIM_BENCH_PAUSE=1 GDRSHIM_APPLY_THREAD=$(thr "$v") LD_PRELOAD="$PWD/bench-variants/$(so "$v").so" "$B/bench" alloc-ab $size 200 40 2>&1 | grep -E "^bench|^gdrshim: summary" | sed "s/^/$v proc$p /"
    done
  done
done >"$OUT/variants-raw.txt"
for v in "${V[@]}"; do
  echo "## $v" ; GDRSHIM_MODE=shadow GDRSHIM_TIMING=1 GDRSHIM_APPLY_THREAD=$(thr "$v") LD_PRELOAD="$PWD/bench-variants/$(so "$v").so" "$B/bench" alloc 2097152 9000 2>&1 | grep -E "^bench|summary" | grep -oE "ns_per_iter=[0-9.]+|nv_ioctls=[0-9]+|native=[0-9]+|matched=[0-9]+|mismatched=[0-9]+|hook_ns_per_nv_ioctl=[0-9]+|hook_top=[^ ]+|alloc_hook_ns_per_call=[0-9]+|helper_batches=[0-9]+" | tr '\n' ' '; echo
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
