#!/usr/bin/env bash
# How h200-variants/ and h200-variants2/ were made (kept as the record; the builds were carried
# as bench-variants/*.so and are not in the repository). Each build in its own process, the order
# of the builds rotated per round, 6 rounds; in each process `bench alloc-ab SIZE 200 40`: 40 pairs
# of 200-iteration batches, the shim working in one and paused (gdrshim_bench_pause) in the other.
#   h200-variants:  A = ee3ee96 (start of the session) + a minimal gdrshim_bench_pause;
#                   B = 40b0f9c + the counters/ranges changes of e074d53 (backlog of 128);
#                   C = B with a backlog of 1 (every event applied at once)
#   h200-variants2: B again; F = e074d53 (B + inline GPU list, one-descent unmaps, backlog applied
#                   by reference); G = F with a backlog of 512 (= 2060463); H = F with the hot
#                   functions in one link section (not kept: no gain)
set -u
OUT=${1:?out}
B=/tmp/gdrshim-ab; mkdir -p "$B"
nvcc -O2 -arch=sm_90 -o "$B/bench" tests/gpu/bench.cu -lcuda -ldl 2>&1 | grep -i " error"
V=(B-backlog128 F-v3 G-v3-backlog512 H-v3-hot)
for p in 0 1 2 3 4 5; do
  for k in 0 1 2 3; do
    v=${V[$(( (p + k) % 4 ))]}
    for size in 2097152 4096; do
      GDRSHIM_MODE=shadow GDRSHIM_BENCH_PAUSE=1 GDRSHIM_SUMMARY=0 LD_PRELOAD="$PWD/bench-variants/$v.so" "$B/bench" alloc-ab $size 200 40 2>&1 | grep "^bench" | sed "s/^/$v proc$p /"
    done
  done
done >"$OUT/variants-raw.txt"
for v in "${V[@]}"; do
  echo "## $v" ; GDRSHIM_MODE=shadow GDRSHIM_TIMING=1 LD_PRELOAD="$PWD/bench-variants/$v.so" "$B/bench" alloc 2097152 9000 2>&1 | grep -E "^bench|summary" | grep -oE "ns_per_iter=[0-9.]+|nv_ioctls=[0-9]+|native=[0-9]+|matched=[0-9]+|hook_ns_per_nv_ioctl=[0-9]+|hook_top=[^ ]+|alloc_hook_ns_per_call=[0-9]+" | tr '\n' ' '; echo
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
    print(f"{v:14} {size:>8} on/off {statistics.median(xs):.4f} [{a:.4f}, {b:.4f}] pairs={len(xs)} per process: " + " ".join(f"{statistics.median(x):.4f}" for x in per.values()))
PY
cat "$OUT/variants-timing.txt"
