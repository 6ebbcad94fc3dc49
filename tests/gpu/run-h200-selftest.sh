#!/usr/bin/env bash
# gdrshim-tool selftest on the GPU machine (one H200, the real driver and libcuda, no HCA):
#  1. the system's libibverbs (or none): steps 1-3 for real (route, cuMemAlloc, the DMA-BUF
#     export), the RDMA steps "could not check: no HCA", exit 2;
#  2. the stub NIC (tests/gpu/stubverbs.c: one RoCE port, an RC QP that copies between the
#     registered ranges with cuMemcpy): steps 3-5 on real GPU memory, every byte checked, exit 0
#     (text, then --json);
#  3. with the knobs build (target/knobs/release/libgdrshim.so), GeForce emulation (libcuda's own
#     dma-buf export hidden, its 503C suppressed): the shim serves the export and turns
#     ibv_reg_mr into its own dma-buf MR; then the NV503C route the same way; exit 0 each;
#  4. the stub's faults: a corrupted byte and a bad completion status, exit 1 naming the transfer.
# Artifacts built elsewhere (no cargo here): target/release/gdrshim-tool, target/release/libgdrshim.so
# (and target/knobs/release/libgdrshim.so for 3). Usage: tests/gpu/run-h200-selftest.sh OUTDIR
set -u
OUT=${1:?outdir}
mkdir -p "$OUT"
TOOL=$(readlink -f target/release/gdrshim-tool)
SHIM=$(readlink -f "${GDRSHIM_H200_SHIM:-target/release/libgdrshim.so}")
KNOBS=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}" 2>/dev/null || true)
# shellcheck source=tests/gpu/lib-stubnic.sh
source tests/gpu/lib-stubnic.sh
B=/tmp/gdrshim-selftest
rm -rf "$B"; mkdir -p "$B"
res="$OUT/selftest.txt"; : >"$res"
log() { echo "$@" | tee -a "$res"; }
nvidia-smi -L 2>&1 | head -2 | tee -a "$res"
log "libibverbs on this machine: $(ldconfig -p 2>/dev/null | grep -c 'libibverbs.so.1 ') entries; HCAs: $(find /sys/class/infiniband -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)"
if ! stubnic_build "$B" 2>"$B/stub.err"; then
  log "FAILED: the stub NIC does not build"; tee -a "$res" <"$B/stub.err"; exit 1
fi
suppress503c_build "$B"
mismatches=0
expect() { # name, expected exit code, VAR=value... command...
  local name=$1 want=$2 rc; shift 2
  log "### $name (expect exit $want): $*"
  timeout 120 env "$@" >"$B/$name.out" 2>"$B/$name.err"
  rc=$?
  tee -a "$res" <"$B/$name.out"
  grep -h '^gdrshim: summary' "$B/$name.err" | tr ' ' '\n' | grep -E '^(route|pass0|rm_errors|registered|stood_aside|mismatched|dmabuf_(exports|served|mrs|refused|native|matched))=' | tr '\n' ' ' | tee -a "$res"; echo | tee -a "$res"
  log "exit=$rc (expected $want)"
  if [ "$rc" != "$want" ]; then
    mismatches=$((mismatches + 1)); log "MISMATCH: $name"; tail -20 "$B/$name.err" | tee -a "$res"
  fi
}
STUB="LD_LIBRARY_PATH=$B/stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
expect real-verbs 2 GDRSHIM_LOG_LEVEL=info "$TOOL" selftest --shim "$SHIM" --size 8388608
expect stub 0 "$STUB" "$TOOL" selftest --shim "$SHIM" --size 67108864
expect stub-json 0 "$STUB" "$TOOL" selftest --shim "$SHIM" --size 16777216 --json
cp "$B/stub-json.out" "$OUT/selftest-stub.json"
if [ -n "$KNOBS" ] && [ -f "$KNOBS" ]; then
  expect emulate-dmabuf 0 "$STUB" GDRSHIM_MODE=register GDRSHIM_TEST_HIDE_DMABUF=1 SUPPRESS_LOG=/dev/null \
    LD_PRELOAD="$B/suppress503c.so:$KNOBS" "$TOOL" selftest --size 16777216
  expect emulate-nv503c 0 "$STUB" GDRSHIM_MODE=register GDRSHIM_ROUTE=nv503c GDRSHIM_TEST_ASSUME_PEERMEM=1 SUPPRESS_LOG=/dev/null \
    LD_PRELOAD="$B/suppress503c.so:$KNOBS" "$TOOL" selftest --route nv503c --size 16777216
else
  log "### GeForce emulation: not run (no target/knobs/release/libgdrshim.so)"
fi
expect stub-corrupt 1 "$STUB" SELFTESTVERBS_FAULT=corrupt "$TOOL" selftest --shim "$SHIM" --size 1048576 --no-bandwidth
expect stub-status 1 "$STUB" SELFTESTVERBS_FAULT=status "$TOOL" selftest --shim "$SHIM" --size 1048576 --no-bandwidth
log "### selftest runs done: $mismatches exit code(s) not as expected"
cd "$B" && tar czf "$OUT/selftest-logs.tgz" ./*.out ./*.err 2>/dev/null
[ "$mismatches" = 0 ]
