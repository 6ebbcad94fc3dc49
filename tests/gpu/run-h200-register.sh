#!/usr/bin/env bash
# NV503C registration path on the GPU machine with libcuda's native 503C suppressed (GeForce emulation).
# Usage: tests/gpu/run-h200-register.sh OUTDIR
set -u
OUT=${1:?outdir}
mkdir -p "$OUT"
# the test knobs (GDRSHIM_TEST_*, GDRSHIM_TIMING, GDRSHIM_BENCH_PAUSE) are in the knobs build only:
# cargo build --release --lib --features knobs, with CARGO_TARGET_DIR=target/knobs
SHIM=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}")
# shellcheck source=tests/gpu/lib-stubnic.sh
source tests/gpu/lib-stubnic.sh
B=/tmp/gdrshim-reg; mkdir -p "$B"
res="$OUT/register.txt"; : >"$res"
log() { echo "$@" | tee -a "$res"; }
stubnic "$B"
nvcc -O2 -arch=sm_90 -o "$B/reg_cycle" tests/gpu/reg_cycle.cu -lcuda -ldl -L"$B/stub" -l:libibverbs.so.1 2>&1 | grep -v _GNU_SOURCE | grep -i error
# the NV503C route against the real RM: no nvidia-peermem here (nothing reads the registrations),
# so the test knob takes it as loaded; the DMA-BUF route has its own run (run-h200-dmabuf.sh)
export GDRSHIM_ROUTE=nv503c GDRSHIM_TEST_ASSUME_PEERMEM=1
run() { # name, command...
  local name=$1; shift
  log "### $name: LD_PRELOAD=suppress503c.so:libgdrshim.so GDRSHIM_MODE=register $*"
  SUPPRESS_LOG="$B/$name.native" GDRSHIM_MODE=register GDRSHIM_LOG_LEVEL=info GDRSHIM_LOG_FILE="$B/$name.log" \
    LD_PRELOAD="$B/suppress503c.so:$SHIM" timeout 300 "$@" >"$B/$name.out" 2>&1
  log "exit=$?"
  grep -v '^gdrshim: summary' "$B/$name.out" | tail -5 | tee -a "$res"
  grep -h '^gdrshim: summary' "$B/$name.out" "$B/$name.log" 2>/dev/null | tee -a "$res"
  grep -hE 'WARN|ERROR' "$B/$name.log" 2>/dev/null | sed 's/^[^[]*\[gdrshim\]//' | sed 's/0x[0-9a-f]*/X/g' | sort | uniq -c | sort -rn | head -8 | tee -a "$res"
  python3 tests/gpu/compare_tuples.py "$B/$name.log" "$B/$name.native" | tee -a "$res"
}
run reg-cycle "$B/reg_cycle" 10000
run torch-reg python3 tests/gpu/torch_reg.py
log "### eager mode (GDRSHIM_EAGER=1): every user allocation registered at map time"
SUPPRESS_LOG="$B/eager.native" GDRSHIM_EAGER=1 GDRSHIM_MODE=register GDRSHIM_LOG_LEVEL=info GDRSHIM_LOG_FILE="$B/eager.log" LD_PRELOAD="$B/suppress503c.so:$SHIM" "$B/reg_cycle" 1000 >"$B/eager.out" 2>&1; log "exit=$?"
grep -h "reg_cycle" "$B/eager.out" | tee -a "$res"; grep -h "^gdrshim: summary" "$B/eager.log" | tee -a "$res"
log "### import torch + training steps, register mode, with and without suppression, vs no shim"
python3 tests/gpu/torch_alloc.py 2>&1 | tail -1 | sed 's/^/none: /' | tee -a "$res"
GDRSHIM_MODE=register LD_PRELOAD="$SHIM" python3 tests/gpu/torch_alloc.py 2>&1 | grep -E "torch_alloc|summary" | cut -c1-300 | sed 's/^/register: /' | tee -a "$res"
GDRSHIM_MODE=register LD_PRELOAD="$B/suppress503c.so:$SHIM" SUPPRESS_LOG=/dev/null python3 tests/gpu/torch_alloc.py 2>&1 | grep -E "torch_alloc|summary" | cut -c1-300 | sed 's/^/register+suppressed: /' | tee -a "$res"
log "### native registration present (no suppression): the shim must stand aside"
GDRSHIM_MODE=register GDRSHIM_LOG_LEVEL=info LD_PRELOAD="$SHIM" "$B/reg_cycle" 100 2>&1 | grep -E "reg_cycle|summary|native registration present" | head -4 | tee -a "$res"
log "### real NCCL, one rank, register mode (real libibverbs, no HCA): verbs lookups"
LD_LIBRARY_PATH="" NCCL_DEBUG=INFO NCCL_NVLS_ENABLE=0 GDRSHIM_MODE=register GDRSHIM_LOG_LEVEL=info LD_PRELOAD="$SHIM" python3 tests/gpu/torch_nccl.py >"$B/nccl.out" 2>&1; log "exit=$?"
grep -E "resolved to gdrshim|torch_nccl|NET/|summary" "$B/nccl.out" | head -12 | tee -a "$res"
log "### benchmark: verbs registration latency (stub NIC), without / with the shim (register mode, suppressed native)"
for _ in 1 2 3 4 5; do
  "$B/reg_cycle" 0 bench | sed 's/^/none /' | tee -a "$res"
  GDRSHIM_MODE=register GDRSHIM_SUMMARY=0 LD_PRELOAD="$B/suppress503c.so:$SHIM" "$B/reg_cycle" 0 bench | sed 's/^/shim /' | tee -a "$res"
done
cd "$B" && tar czf "$OUT/register-logs.tgz" ./*.log ./*.out ./*.native 2>/dev/null
