#!/usr/bin/env bash
# What libcuda issues when a CUDA context ends, and what it answers afterwards (issue 36, item 4):
# tests/gpu/ctx_end.cu's three ways (cudaDeviceReset, cuCtxDestroy, the primary context released
# by its last holder), each under gdrshim with GDRSHIM_CAPTURE (the RM and UVM traffic of every
# phase: the fixture of context ends) and in GeForce emulation (gdrshim's answers for the old
# pointers after the end, against libcuda's own: export_oracle_* in the summary), and without
# gdrshim (libcuda's answers alone).
# Usage: tests/gpu/run-h200-ctx.sh OUTDIR   (results in OUTDIR/ctx.txt, captures ctx-*.cap.gz)
set -u
OUT=${1:?outdir}
mkdir -p "$OUT"
SHIM=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}")
B=/tmp/gdrshim-ctx; mkdir -p "$B"
res="$OUT/ctx.txt"; : >"$res"
nvcc -O2 -arch=sm_90 -o "$B/ctx_end" tests/gpu/ctx_end.cu -lcuda -ldl 2>&1 | grep -i error
for how in reset destroy release two; do
  echo "### $how: libcuda alone" | tee -a "$res"
  timeout 60 "$B/ctx_end" "$how" 2>&1 | tee -a "$res"
  echo "### $how: under gdrshim, GeForce emulation, captured" | tee -a "$res"
  GDRSHIM_MODE=register GDRSHIM_TEST_HIDE_DMABUF=1 GDRSHIM_LOG_LEVEL=info GDRSHIM_CAPTURE="$B/ctx-$how.cap" \
    LD_PRELOAD="$SHIM" timeout 60 "$B/ctx_end" "$how" >"$B/ctx-$how.out" 2>&1
  echo "exit=$?" | tee -a "$res"
  grep -E '^(phase|ask|ctx_end)|context ended|WARN' "$B/ctx-$how.out" | tee -a "$res"
  grep -h '^gdrshim: summary' "$B/ctx-$how.out" | tr ' ' '\n' | grep -E '^(export_oracle|dmabuf_served|nv_ioctls|decoded)' | tr '\n' ' ' | tee -a "$res"; echo | tee -a "$res"
  gzip -c "$B/ctx-$how.cap" >"$OUT/ctx-$how.cap.gz" 2>/dev/null
done
