#!/usr/bin/env bash
# One device call for a build: the NV503C shadow oracle (run-h200.sh), the registration path with
# libcuda's 503C suppressed (run-h200-register.sh), the real programs in every mode
# (run-h200-real.sh) and the DMA-BUF route (run-h200-dmabuf.sh). The four result files go to
# OUTDIR; everything else (captures, logs, outputs) into OUTDIR/rest.tgz, as the device returns
# at most 8 files. Usage: tests/gpu/run-h200-all.sh OUTDIR
set -u
OUT=${1:?outdir}
mkdir -p "$OUT"
W=/tmp/gdrshim-all; rm -rf "$W"; mkdir -p "$W"/{oracle,register,real,dmabuf}
t0=$(date +%s)
bash tests/gpu/run-h200.sh "$W/oracle" >/dev/null 2>&1; echo "oracle done $(($(date +%s) - t0)) s"
bash tests/gpu/run-h200-register.sh "$W/register" >/dev/null 2>&1; echo "register done $(($(date +%s) - t0)) s"
bash tests/gpu/run-h200-real.sh "$W/real" >/dev/null 2>&1; echo "real done $(($(date +%s) - t0)) s"
bash tests/gpu/run-h200-dmabuf.sh "$W/dmabuf" >/dev/null 2>&1; echo "dmabuf done $(($(date +%s) - t0)) s"
cp "$W/oracle/results.txt" "$OUT/oracle.txt"; cp "$W/register/register.txt" "$OUT/register.txt"
cp "$W/real/real.txt" "$OUT/real.txt"; cp "$W/dmabuf/dmabuf.txt" "$OUT/dmabuf.txt"
tar czf "$OUT/rest.tgz" -C "$W" . 2>/dev/null
ls -la "$OUT"
