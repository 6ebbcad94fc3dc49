#!/usr/bin/env bash
# Issue 28's "no regression" for training: the median training step (tests/gpu/train_step.py) with
# gdrshim preloaded in shadow and in register mode against no shim, ROUNDS rounds of one process
# each, the order rotated per round; the ratio of medians per round and its median. Target:
# shadow/none <= 1.002.
# Usage: tests/gpu/run-h200-trainstep.sh OUTDIR [ROUNDS]   (target/release/libgdrshim.so)
set -u
OUT=${1:?outdir}; ROUNDS=${2:-5}
mkdir -p "$OUT"
SHIM=$(readlink -f "${GDRSHIM_H200_SHIM:-target/release/libgdrshim.so}")
res=$OUT/trainstep.txt; : >"$res"
one() { # who
  case $1 in
    none) python3 tests/gpu/train_step.py 300 ;;
    shadow) GDRSHIM_MODE=shadow GDRSHIM_SUMMARY=0 LD_PRELOAD="$SHIM" python3 tests/gpu/train_step.py 300 ;;
    register) GDRSHIM_SUMMARY=0 LD_PRELOAD="$SHIM" python3 tests/gpu/train_step.py 300 ;;
  esac 2>/dev/null | grep -o 'median_us=[0-9.]*' | cut -d= -f2
}
order=(none shadow register)
for r in $(seq 1 "$ROUNDS"); do
  declare -A t=()
  for i in 0 1 2; do w=${order[$(((i + r) % 3))]}; t[$w]=$(one "$w"); done
  echo "round $r none=${t[none]} shadow=${t[shadow]} register=${t[register]}" | tee -a "$res"
done
# per round: shadow/none and register/none; their medians (plain awk and sort: no gawk there)
ratios() { awk -v k="$1" '/^round/ { for (i = 3; i <= 5; i++) { split($i, kv, "="); v[kv[1]] = kv[2] } if (v["none"] > 0) printf "%.4f\n", v[k] / v["none"] }' "$res" | sort -n; }
median() { awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)]; else print "none" }'; }
echo "median over $ROUNDS rounds: shadow/none $(ratios shadow | median) (each: $(ratios shadow | tr '\n' ' '))register/none $(ratios register | median) (target <= 1.002)" | tee -a "$res"
