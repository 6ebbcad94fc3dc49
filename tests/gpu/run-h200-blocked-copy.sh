#!/usr/bin/env bash
# Which way of writing GPU memory finishes while another thread is blocked in a pageable copy
# (tests/gpu/blocked_copy.cu; issue 47 part 1: what the lab's wire may use). One process per way.
#   tests/gpu/run-h200-blocked-copy.sh OUTDIR     (OUTDIR/blocked-copy.txt)
set -u
OUT=${1:?outdir}
mkdir -p "$OUT"
res=$OUT/blocked-copy.txt
B=/tmp/gdrshim-blocked; mkdir -p "$B"
nvcc -O1 -arch=sm_90 -o "$B/blocked_copy" tests/gpu/blocked_copy.cu -lcuda -lpthread 2>&1 | grep -i error | tee "$res"
for way in same ctx2 proc; do
  timeout 30 "$B/blocked_copy" "$way" 2>&1 | tee -a "$res"
done
