#!/usr/bin/env bash
# Issue 30's registration figures on the GPU machine (under 3 minutes), stub NIC:
#  (a) first registration of a buffer: ibv_reg_mr on GPU memory, which gdrshim turns into its
#      export + ibv_reg_dmabuf_mr (GeForce emulation: GDRSHIM_TEST_HIDE_DMABUF=1, libcuda's 503C
#      suppressed);
#  (b) the same buffer registered again while the first MR lives (second PD, relaxed-ordering twin):
#      gdrshim's shared buffer reused;
#  (c) libcuda's own cuMemGetHandleForAddressRange export + ibv_reg_dmabuf_mr + close, no shim.
# Medians over 200 buffers of 2 and 64 MiB, three rounds; ratios repeat/libcuda (target <= 0.5)
# and first/libcuda (target <= 1); gdrshim's counters and summary (dmabuf_reused,
# exported_peak_bytes, bar1_bytes, bar1_static) and its BAR1 line.
# Usage: tests/gpu/run-h200-bar1.sh OUTDIR   (needs target/knobs/release/libgdrshim.so)
set -u
OUT=${1:?outdir}
mkdir -p "$OUT"
SHIM=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}")
B=/tmp/gdrshim-bar1; mkdir -p "$B/stub"
res="$OUT/bar1.txt"; : >"$res"
log() { echo "$@" | tee -a "$res"; }
gcc -shared -fPIC -O1 -o "$B/suppress503c.so" tests/gpu/suppress503c.c -ldl
gcc -shared -fPIC -O1 -Wl,--version-script=tests/gpu/stubverbs.map -Wl,-soname,libibverbs.so.1 -o "$B/stub/libibverbs.so.1" tests/gpu/stubverbs.c
nvcc -O2 -arch=sm_90 -o "$B/bar1_figures" tests/gpu/bar1_figures.cu -lcuda -ldl 2>&1 | grep -i " error"
export LD_LIBRARY_PATH="$B/stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
: >"$B/raw"
for round in 1 2 3; do
  for mib in 2 64; do
    timeout 60 "$B/bar1_figures" native 200 "$mib" >>"$B/raw" 2>>"$B/err" || log "native $mib MiB round $round: exit $?"
    GDRSHIM_MODE=register GDRSHIM_TEST_HIDE_DMABUF=1 SUPPRESS_LOG=/dev/null GDRSHIM_LOG_LEVEL=info \
      GDRSHIM_LOG_FILE="$B/shim-$mib-$round.log" LD_PRELOAD="$B/suppress503c.so:$SHIM" \
      timeout 60 "$B/bar1_figures" shim 200 "$mib" >>"$B/raw" 2>>"$B/err" || log "shim $mib MiB round $round: exit $?"
  done
done
grep -h FAIL "$B/err" | head -5 | tee -a "$res"
log "### medians of the three rounds' medians (ns)"
awk '$1 == "bar1" && $2 != "counters" { split($6, m, "="); k = $3 " " $4; v[k] = v[k] " " m[2] }
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
  }' "$B/raw" | sort | tee -a "$res"
log "### gdrshim's counters (last round) and summary"
grep -h '^bar1 counters' "$B/raw" | tail -2 | tee -a "$res"
for mib in 2 64; do
  grep -h 'gdrshim: summary' "$B/shim-$mib-3.log" 2>/dev/null | tr ' ' '\n' | grep -E '^(route|dmabuf_exports|dmabuf_reused|dmabuf_buffers|exported_peak_bytes|registered_peak_bytes|bar1_bytes|bar1_static|rm_errors)=' | tr '\n' ' ' | sed "s/^/$mib MiB: /" | tee -a "$res"; echo | tee -a "$res"
  grep -h 'BAR1' "$B/shim-$mib-3.log" 2>/dev/null | sed 's/^[^[]*\[gdrshim\]//' | sort -u | head -3 | tee -a "$res"
done
cp "$B/raw" "$OUT/bar1-raw.txt"
cd "$B" && tar czf "$OUT/bar1-logs.tgz" ./*.log ./err 2>/dev/null
exit 0
