#!/usr/bin/env bash
# Issue 30's registration figures on the GPU machine (about 4 minutes), stub NIC:
#  (a) first registration of a buffer: ibv_reg_mr on GPU memory, which gdrshim turns into its
#      export + ibv_reg_dmabuf_mr (GeForce emulation: GDRSHIM_TEST_HIDE_DMABUF=1, libcuda's 503C
#      suppressed);
#  (b) the same buffer registered again while the first MR lives (second PD, relaxed-ordering twin):
#      gdrshim's shared buffer reused;
#  (c) libcuda's own cuMemGetHandleForAddressRange export + ibv_reg_dmabuf_mr + close, no shim.
# Medians over 200 buffers of 2 and 64 MiB; BAR1_ROUNDS rounds (default 4), the two ways run back
# to back in each round, in turn first; at gdrshim's default log level (warn: nothing written per
# registration). Ratios repeat/libcuda (target <= 0.5) and first/libcuda (target <= 1), of the
# medians and per round; per registration, the system calls each way makes and the time spent in
# them (tests/gpu/syscount.c); then one run at info for gdrshim's BAR1 line and its counters
# (dmabuf_reused, exported_peak_bytes, bar1_bytes, bar1_static).
# Usage: tests/gpu/run-h200-bar1.sh OUTDIR   (needs target/knobs/release/libgdrshim.so)
set -u -o pipefail
OUT=${1:?outdir}
mkdir -p "$OUT"
SHIM=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}")
# shellcheck source=tests/gpu/lib-stubnic.sh
source tests/gpu/lib-stubnic.sh
B=/tmp/gdrshim-bar1; mkdir -p "$B"
res="$OUT/bar1.txt"; : >"$res"
log() { echo "$@" | tee -a "$res"; }
stubnic "$B"
gcc -shared -fPIC -O2 -o "$B/syscount.so" tests/gpu/syscount.c -ldl
nvcc -O2 -arch=sm_90 -o "$B/bar1_figures" tests/gpu/bar1_figures.cu -lcuda -ldl 2>&1 | grep -i " error"
: >"$B/raw"
ROUNDS=${BAR1_ROUNDS:-4}
native() { # MIB ROUND
  LD_PRELOAD="$B/syscount.so" timeout 90 "$B/bar1_figures" native 200 "$1" 2>>"$B/err" | sed "s/^/r$2 /" >>"$B/raw" || log "native $1 MiB round $2: exit $?"
}
shim() { # MIB ROUND [LEVEL]
  GDRSHIM_MODE=register GDRSHIM_TEST_HIDE_DMABUF=1 SUPPRESS_LOG=/dev/null GDRSHIM_LOG_LEVEL="${3:-warn}" \
    GDRSHIM_LOG_FILE="$B/shim-$1-$2.log" LD_PRELOAD="$B/suppress503c.so:$SHIM:$B/syscount.so" \
    timeout 90 "$B/bar1_figures" shim 200 "$1" 2>>"$B/err" | sed "s/^/r$2 /" >>"$B/raw" || log "shim $1 MiB round $2: exit $?"
}
for round in $(seq 1 "$ROUNDS"); do
  for mib in 2 64; do
    if [ $((round % 2)) = 1 ]; then native "$mib" "$round"; shim "$mib" "$round"; else shim "$mib" "$round"; native "$mib" "$round"; fi
  done
done
shim 2 info info
grep -h FAIL "$B/err" | head -5 | tee -a "$res"
log "### per round (ns): libcuda first repeat, first/libcuda repeat/libcuda"
awk '$2 == "bar1" && $3 != "counters" && $3 != "calls" && $1 != "rinfo" { split($7, m, "="); v[$1 " " $4 " " $5] = m[2]; r[$1] = 1 }
  END { for (k in r) for (s = 2; s <= 64; s *= 32) { l = v[k " " s " libcuda"]; if (l > 0) printf "%s %2d MiB: %6d %6d %6d  %.2f %.2f\n", k, s, l, v[k " " s " first"], v[k " " s " repeat"], v[k " " s " first"] / l, v[k " " s " repeat"] / l } }' "$B/raw" | sort | tee -a "$res"
log "### per registration: system calls (calls/time in them), last round"
grep -h "^r$ROUNDS bar1 calls" "$B/raw" | cut -d' ' -f2- | sort | tee -a "$res"
log "### medians of the rounds' medians (ns)"
grep -v '^rinfo ' "$B/raw" | cut -d' ' -f2- | awk '$1 == "bar1" && $2 != "counters" && $2 != "calls" { split($6, m, "="); k = $3 " " $4; v[k] = v[k] " " m[2] }
  END {
    for (k in v) {
      n = split(v[k], a, " ")
      for (i = 2; i <= n; i++) { x = a[i] + 0; for (j = i - 1; j >= 1 && a[j] + 0 > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
      med[k] = a[int((n + 1) / 2)]; printf "%-14s %s (rounds:%s)\n", k, med[k], v[k]
    }
    for (s = 2; s <= 64; s *= 32) {
      lib = med[s " libcuda"]; if (lib <= 0) { printf "%d MiB: no libcuda figure\n", s; continue }
      r = med[s " repeat"] / lib; f = med[s " first"] / lib
      printf "%d MiB: repeat/libcuda %.2f (target <= 0.5: %s)  first/libcuda %.2f (target <= 1: %s)\n", s, r, r <= 0.5 ? "met" : "NOT met", f, f <= 1 ? "met" : "NOT met"
    }
  }' | sort | tee -a "$res"
log "### gdrshim's counters (last round) and summary (the run at info)"
grep -h "^r$ROUNDS bar1 counters" "$B/raw" | cut -d' ' -f2- | tee -a "$res"
for f in "$B/shim-2-$ROUNDS.log" "$B/shim-64-$ROUNDS.log" "$B/shim-2-info.log"; do
  grep -h 'gdrshim: summary' "$f" 2>/dev/null | tr ' ' '\n' | grep -E '^(route|dmabuf_exports|dmabuf_reused|dmabuf_buffers|exported_peak_bytes|registered_peak_bytes|bar1_bytes|bar1_static|rm_errors)=' | tr '\n' ' ' | sed "s|^|$(basename "$f"): |" | tee -a "$res"; echo | tee -a "$res"
done
grep -h 'BAR1' "$B/shim-2-info.log" 2>/dev/null | sed 's/^[^[]*\[gdrshim\]//' | sort -u | head -3 | tee -a "$res"
cp "$B/raw" "$OUT/bar1-raw.txt"
cd "$B" && tar czf "$OUT/bar1-logs.tgz" ./*.log ./err 2>/dev/null
exit 0
