#!/usr/bin/env bash
# One device call for a merged build, within the device's 10-minute limit: the zero-configuration
# NCCL runs (run-h200-zeroconf.sh), the program's-own-memory rule against libcuda
# (run-h200-owned.sh), then the four oracle and registration suites (run-h200-all.sh). Run it
# after `eval "$(bash tests/gpu/front-pair.sh)"` to preload the front with its core. At most 8
# files come back: the result tables in OUTDIR, every log in OUTDIR/rest.tgz.
# Usage: tests/gpu/run-h200-session.sh OUTDIR
set -u
OUT=${1:?outdir}
mkdir -p "$OUT"
W=/tmp/gdrshim-session; rm -rf "$W"; mkdir -p "$W"
t0=$(date +%s)
step() { echo "$1 done $(($(date +%s) - t0)) s (exit $2)"; }
timeout 150 bash tests/gpu/run-h200-zeroconf.sh "$W/zeroconf" >/dev/null 2>&1; step zeroconf $?
timeout 150 bash tests/gpu/run-h200-owned.sh "$W/owned" >/dev/null 2>&1; step owned $?
timeout 280 bash tests/gpu/run-h200-all.sh "$W/all" >/dev/null 2>&1; step all $?
cp "$W/zeroconf/zeroconf.txt" "$W/owned/owned.txt" "$OUT/" 2>/dev/null
for f in oracle register real dmabuf; do cp "$W/all/$f.txt" "$OUT/" 2>/dev/null; done
tar czf "$OUT/rest.tgz" -C "$W" . 2>/dev/null
ls -la "$OUT"
