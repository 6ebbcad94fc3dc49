#!/usr/bin/env bash
# The program's-own-memory rule on the H200 against libcuda (issue 29 A): tests/gpu/owned.cu's
# cases (cudaMalloc whole, sub-range, past its end, after its free; CUDA's own memory after a
# 64 MiB cudaMalloc; neighbours: cudaMallocs, pool blocks, VMM handles in one and in two
# reservations, one handle mapped twice; managed, pinned and host-registered memory; IPC from a
# second process), first without gdrshim (libcuda's answers), then in GeForce emulation
# (GDRSHIM_TEST_HIDE_DMABUF=1, libcuda's 503C suppressed): gdrshim's answers, compared in-process
# with libcuda's own (export_oracle_* in the summary), and the same ranges through ibv_reg_mr on
# the stub NIC (pass0 hits and misses per case).
# Usage: tests/gpu/run-h200-owned.sh OUTDIR
set -u
OUT=${1:?outdir}
mkdir -p "$OUT"
SHIM=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}")
# shellcheck source=tests/gpu/lib-stubnic.sh
source tests/gpu/lib-stubnic.sh
B=/tmp/gdrshim-owned; mkdir -p "$B"
res="$OUT/owned.txt"; : >"$res"
stubnic "$B"
nvcc -O2 -arch=sm_90 -o "$B/owned" tests/gpu/owned.cu -lcuda -ldl 2>&1 | grep -i error
echo "### libcuda alone" | tee -a "$res"
timeout 120 "$B/owned" cases 2>&1 | grep -v '^verbs' | tee -a "$res"
echo "### under gdrshim, GeForce emulation (DMA-BUF route)" | tee -a "$res"
GDRSHIM_MODE=register GDRSHIM_TEST_HIDE_DMABUF=1 SUPPRESS_LOG=/dev/null GDRSHIM_LOG_LEVEL=info GDRSHIM_LOG_FILE="$B/owned.log" \
  LD_PRELOAD="$B/suppress503c.so:$SHIM" timeout 120 "$B/owned" cases >"$B/owned.out" 2>&1
echo "exit=$?" | tee -a "$res"
tee -a "$res" <"$B/owned.out" | grep -v '^gdrshim: summary'
grep -h '^gdrshim: summary' "$B/owned.out" "$B/owned.log" 2>/dev/null | tr ' ' '\n' | grep -E '^(pid|route|export_oracle|dmabuf_served|dmabuf_exports|pass0|registered)' | tr '\n' ' ' | tee -a "$res"; echo | tee -a "$res"
grep -hE 'WARN|ERROR' "$B/owned.log" 2>/dev/null | sed 's/^[^[]*\[gdrshim\]//' | sed 's/0x[0-9a-f]*/X/g' | sort | uniq -c | sort -rn | head -12 | tee -a "$res"
cp "$B/owned.log" "$OUT/owned.log" 2>/dev/null
