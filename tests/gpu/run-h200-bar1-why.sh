#!/usr/bin/env bash
# Where a first registration's time goes on the H200 (issue 30): the export ioctl alone took
# 16-22 µs under gdrshim against libcuda's 11-12 µs for the same memory (h200-run27-settle). Four
# ways, each run VARIANT_RUNS times (default 3), interleaved, 200 buffers of 2 MiB, system calls
# timed by tests/gpu/syscount.c:
#   shim          gdrshim's first registration (GeForce emulation), its helper thread as shipped
#   shim-nohelper the same with GDRSHIM_APPLY_THREAD=0 (no helper thread: batches applied inline)
#   native-shadow libcuda's export + registration with gdrshim preloaded in shadow mode
#   native        libcuda's export + registration, no gdrshim
# Prints per run "VARIANT run N: median_ns=M ioctl=CALLS/NSns ..." (the counted 20 buffers).
# Usage: tests/gpu/run-h200-bar1-why.sh OUTDIR   (needs target/knobs/release/libgdrshim.so)
set -u -o pipefail
OUT=${1:?outdir}
mkdir -p "$OUT"
SHIM=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}")
B=/tmp/gdrshim-bar1why; mkdir -p "$B/stub"
res="$OUT/bar1-why.txt"; : >"$res"
gcc -shared -fPIC -O1 -o "$B/suppress503c.so" tests/gpu/suppress503c.c -ldl
gcc -shared -fPIC -O1 -Wl,--version-script=tests/gpu/stubverbs.map -Wl,-soname,libibverbs.so.1 -o "$B/stub/libibverbs.so.1" tests/gpu/stubverbs.c
gcc -shared -fPIC -O2 -o "$B/syscount.so" tests/gpu/syscount.c -ldl
nvcc -O2 -arch=sm_90 -o "$B/bar1_figures" tests/gpu/bar1_figures.cu -lcuda -ldl 2>&1 | grep -i " error"
export LD_LIBRARY_PATH="$B/stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
one() { # VARIANT RUN
  local o="$B/$1-$2.out"
  case $1 in
    shim) GDRSHIM_MODE=register GDRSHIM_TEST_HIDE_DMABUF=1 SUPPRESS_LOG=/dev/null LD_PRELOAD="$B/suppress503c.so:$SHIM:$B/syscount.so" \
      timeout 90 "$B/bar1_figures" shim 200 2 >"$o" 2>>"$B/err" ;;
    shim-nohelper) GDRSHIM_APPLY_THREAD=0 GDRSHIM_MODE=register GDRSHIM_TEST_HIDE_DMABUF=1 SUPPRESS_LOG=/dev/null \
      LD_PRELOAD="$B/suppress503c.so:$SHIM:$B/syscount.so" timeout 90 "$B/bar1_figures" shim 200 2 >"$o" 2>>"$B/err" ;;
    native-shadow) GDRSHIM_MODE=shadow LD_PRELOAD="$SHIM:$B/syscount.so" timeout 90 "$B/bar1_figures" native 200 2 >"$o" 2>>"$B/err" ;;
    native) LD_PRELOAD="$B/syscount.so" timeout 90 "$B/bar1_figures" native 200 2 >"$o" 2>>"$B/err" ;;
  esac || echo "$1 run $2: exit $?" | tee -a "$res"
  local med calls
  med=$(awk '$1 == "bar1" && ($4 == "first" || $4 == "libcuda") { print $6 }' "$o")
  calls=$(awk '$1 == "bar1" && $2 == "calls" && ($5 == "first" || $5 == "libcuda") { $1 = $2 = $3 = $4 = $5 = ""; print }' "$o" | sed 's/^ *//')
  printf '%-14s run %s: %s %s\n' "$1" "$2" "$med" "$calls" | tee -a "$res"
}
for run in $(seq 1 "${VARIANT_RUNS:-3}"); do
  for v in shim shim-nohelper native-shadow native; do one "$v" "$run"; done
done
grep -h FAIL "$B/err" | head -5 | tee -a "$res"
exit 0
