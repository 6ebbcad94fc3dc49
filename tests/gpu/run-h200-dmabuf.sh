#!/usr/bin/env bash
# The DMA-BUF route on the GPU machine (H200, driver with native dma-buf export):
#  1. shadow oracle: libcuda's own exports compared, piece by piece, with the map's plan
#     (dmabuf_matched = dmabuf_native, dmabuf_mismatched = 0) for every allocation kind, 1000
#     pieces, PyTorch's caching allocator and expandable segments;
#  2. GeForce emulation (GDRSHIM_TEST_HIDE_DMABUF=1, libcuda's 503C suppressed): gdrshim serves the
#     exports (nv_dmabuf fds of the right size; libcuda's export of the same range is made first and
#     compared: equal params), and 10^4 verbs registrations through the stub NIC's
#     ibv_reg_dmabuf_mr: no fd left, the GPU memory comes back after the last release;
#  3. first-registration latency: gdrshim's export + ibv_reg_dmabuf_mr against libcuda's export +
#     the same call, in separate processes and then interleaved in one (bench-ab).
# Usage: tests/gpu/run-h200-dmabuf.sh OUTDIR
set -u
OUT=${1:?outdir}
mkdir -p "$OUT"
# the test knobs (GDRSHIM_TEST_*, GDRSHIM_TIMING, GDRSHIM_BENCH_PAUSE) are in the knobs build only:
# cargo build --release --lib --features knobs, with CARGO_TARGET_DIR=target/knobs
SHIM=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}")
# shellcheck source=tests/gpu/lib-stubnic.sh
source tests/gpu/lib-stubnic.sh
B=/tmp/gdrshim-dmabuf; mkdir -p "$B"
res="$OUT/dmabuf.txt"; : >"$res"
log() { echo "$@" | tee -a "$res"; }
stubnic "$B"
nvcc -O2 -arch=sm_90 -o "$B/dmabuf" tests/gpu/dmabuf.cu -lcuda -ldl 2>&1 | grep -i error
run() { # name, mode (shadow | emulate), command...
  local name=$1 mode=$2; shift 2
  local pre="$SHIM" envs=(GDRSHIM_MODE=shadow)
  if [ "$mode" = emulate ]; then pre="$B/suppress503c.so:$SHIM"; envs=(GDRSHIM_MODE=register GDRSHIM_TEST_HIDE_DMABUF=1 SUPPRESS_LOG="$B/$name.native"); fi
  log "### $name ($mode): ${envs[*]} $*"
  env "${envs[@]}" GDRSHIM_LOG_LEVEL=info GDRSHIM_LOG_FILE="$B/$name.log" LD_PRELOAD="$pre" timeout 300 "$@" >"$B/$name.out" 2>&1
  log "exit=$?"
  grep -vE '^gdrshim: summary|^export piece' "$B/$name.out" | tail -14 | tee -a "$res"
  grep -h '^gdrshim: summary' "$B/$name.out" "$B/$name.log" 2>/dev/null | tr ' ' '\n' | grep -E '^(route|dmabuf_|pass0|rm_errors|registered|stood_aside|mismatched|matched|native)' | tr '\n' ' ' | tee -a "$res"; echo | tee -a "$res"
  grep -hE 'WARN|ERROR' "$B/$name.log" 2>/dev/null | sed 's/^[^[]*\[gdrshim\]//' | sed 's/0x[0-9a-f]*/X/g' | sort | uniq -c | sort -rn | head -8 | tee -a "$res"
}
run oracle-exports shadow "$B/dmabuf" exports
run oracle-torch shadow python3 tests/gpu/torch_dmabuf.py
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True run oracle-torch-exp shadow python3 tests/gpu/torch_dmabuf.py
run emulate-exports emulate "$B/dmabuf" exports
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True run emulate-torch-exp emulate python3 tests/gpu/torch_dmabuf.py
run emulate-cycles emulate "$B/dmabuf" cycles 10000
log "### without the shim: libcuda's exports (the same program)"
"$B/dmabuf" exports 2>&1 | tail -2 | tee -a "$res"
log "### first registration of a fresh 2 MiB allocation (stub NIC): native = libcuda export + ibv_reg_dmabuf_mr, shim = ibv_reg_mr turned into gdrshim's export + ibv_reg_dmabuf_mr"
for _ in 1 2 3; do
  "$B/dmabuf" bench 500 native | tee -a "$res"
  GDRSHIM_MODE=register GDRSHIM_TEST_HIDE_DMABUF=1 GDRSHIM_SUMMARY=0 SUPPRESS_LOG=/dev/null LD_PRELOAD="$B/suppress503c.so:$SHIM" "$B/dmabuf" bench 500 shim | tee -a "$res"
done
log "### the same three ways interleaved in one process under gdrshim (libcuda's export left as it is): native, shim, export = gdrshim_export_dmabuf + ibv_reg_dmabuf_mr"
GDRSHIM_MODE=register GDRSHIM_SUMMARY=0 SUPPRESS_LOG=/dev/null LD_PRELOAD="$B/suppress503c.so:$SHIM" "$B/dmabuf" bench-ab 1000 2>&1 | tail -5 | tee -a "$res"
cd "$B" && tar czf "$OUT/dmabuf-logs.tgz" ./*.log ./*.out 2>/dev/null
