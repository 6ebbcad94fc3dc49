#!/usr/bin/env bash
# Issue 28 on the H200, with the NCCL PyTorch brings (stock): `LD_PRELOAD` alone gives GDR. The H200
# reports GPUDirect RDMA natively, so GDRSHIM_TEST_HIDE_GDR=1 (knobs build) makes libcuda's
# answers to 116/110 read 0, as on a GeForce; NCCL's decision is its topology dump's gdr="…" for the
# GPU, and gdrshim's answer line says why. The H200 is sm_90: NCCL flushes nothing there, so the
# ordering rule (attribute 118) decides, and NCCL_NET_FORCE_FLUSH=1 is the fix it names.
# Usage: tests/gpu/run-h200-zeroconf.sh OUTDIR
set -u
OUT=${1:?outdir}
mkdir -p "$OUT/logs"
SHIM=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}")
res=$OUT/zeroconf.txt; : >"$res"
log() { echo "$@" | tee -a "$res"; }
run() { # name, env...
  local name=$1; shift
  log "### $name: $*"
  env -u GDRSHIM_MODE -u GDRSHIM_ADVERTISE_GDR NCCL_DEBUG=INFO NCCL_NVLS_ENABLE=0 NCCL_TOPO_DUMP_FILE="$OUT/logs/$name.topo.xml" \
    GDRSHIM_LOG_LEVEL=info "$@" timeout 120 python3 tests/gpu/torch_nccl.py >"$OUT/logs/$name.log" 2>&1
  log "exit=$?"
  grep -hE 'torch_nccl ok|answered|GPU Direct RDMA|NET_FORCE_FLUSH' "$OUT/logs/$name.log" | sed 's/^[^ ]* [0-9]*:[0-9]* //' | cut -c1-260 | sort -u | tee -a "$res"
  grep -o '<gpu [^>]*>' "$OUT/logs/$name.topo.xml" 2>/dev/null | grep -o 'gdr="[0-9]*"' | sed 's/^/topo gpu /' | tee -a "$res"
  grep -h '^gdrshim: summary' "$OUT/logs/$name.log" | grep -o 'mode=[a-z]*\|gdr_answers=[0-9]*\|rm_errors=[0-9]*\|mismatched=[0-9]*' | tr '\n' ' ' | sed 's/^/summary: /' | tee -a "$res"
  echo | tee -a "$res"
}
run noshim
run noshim-hidden-control LD_PRELOAD="$SHIM" GDRSHIM_MODE=off GDRSHIM_TEST_HIDE_GDR=1
run zeroconf-native LD_PRELOAD="$SHIM"
run zeroconf-hidden LD_PRELOAD="$SHIM" GDRSHIM_TEST_HIDE_GDR=1
run zeroconf-hidden-forceflush LD_PRELOAD="$SHIM" GDRSHIM_TEST_HIDE_GDR=1 NCCL_NET_FORCE_FLUSH=1
run shadow-hidden LD_PRELOAD="$SHIM" GDRSHIM_MODE=shadow GDRSHIM_TEST_HIDE_GDR=1
run advertise0-hidden LD_PRELOAD="$SHIM" GDRSHIM_TEST_HIDE_GDR=1 GDRSHIM_ADVERTISE_GDR=0
