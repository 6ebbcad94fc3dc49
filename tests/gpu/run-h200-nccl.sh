#!/usr/bin/env bash
# NCCL's GDR gate under gdrshim on the H200 (issue 4), with NCCL built elsewhere (not by us here):
#   tests/gpu/run-h200-nccl.sh OUTDIR PATCHED_NCCL_LIBDIR ALL_REDUCE_PERF
# The H200 reports GPUDirect RDMA natively, so GDRSHIM_TEST_HIDE_GDR=1 makes the driver attribute
# read 0 (as on a GeForce); the GPU node's gdr="…" in NCCL's topology dump shows NCCL's decision.
# The stock NCCL is whatever libnccl.so.2 the machine has (its version is printed).
set -u
OUT=${1:?outdir}; PATCHED=${2:?patched nccl lib dir}; ARP=${3:?all_reduce_perf}
# GDRSHIM_TEST_HIDE_GDR is a test knob: the knobs build (--features knobs, target/knobs)
SHIM=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}")
STOCK=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
[ -e "$STOCK/libnccl.so.2" ] || STOCK=$(dirname "$(ldconfig -p | awk '/libnccl.so.2 /{print $NF; exit}')")
L=$OUT/logs; mkdir -p "$L"; res=$OUT/nccl.txt; : >"$res"
log() { echo "$@" | tee -a "$res"; }
export NCCL_NVLS_ENABLE=0 NCCL_DEBUG=INFO
log "stock NCCL: $STOCK/libnccl.so.2 ($(strings "$STOCK/libnccl.so.2" | grep -m1 -o 'NCCL version [0-9.a-z+-]*'))"
log "patched NCCL: $PATCHED/libnccl.so.2 ($(strings "$PATCHED/libnccl.so.2" | grep -m1 -o 'NCCL version [0-9.a-z+-]*'))"
run() { # name, libdir, env...
  local name=$1 lib=$2; shift 2
  log "### $name: LD_LIBRARY_PATH=<$( [ "$lib" = "$PATCHED" ] && echo patched || echo stock )> $*"
  env LD_LIBRARY_PATH="$lib" NCCL_TOPO_DUMP_FILE="$L/$name.topo.xml" GDRSHIM_LOG_LEVEL=info "$@" \
    timeout 240 "$ARP" -b 8 -e 64M -f 4 -g 1 >"$L/$name.log" 2>&1
  log "exit=$?"
  grep -E '^# Out of bounds|^# Avg bus|Collective test concluded|gdrshim [0-9]|through gdrshim|forced on|not enabled for GPU|answered|not advertised|registered for the NIC by gdrshim|NCCL version' "$L/$name.log" | sed 's/^[^ ]* [0-9]*:[0-9]* //' | cut -c1-240 | sort -u | tee -a "$res"
  awk '/^ +[0-9]+ +[0-9]+ +float/ {w += $9 + $13; n++} END {printf "sizes=%d wrong_total=%d\n", n, w}' "$L/$name.log" | tee -a "$res"
  grep -o '<gpu [^>]*>' "$L/$name.topo.xml" 2>/dev/null | grep -o 'gdr="[0-9]*"' | sed 's/^/topo gpu /' | tee -a "$res"
  grep -h '^gdrshim: summary' "$L/$name.log" | grep -o 'mode=[a-z]*\|gdr_answers=[0-9]*\|rm_errors=[0-9]*' | tr '\n' ' ' | sed 's/^/summary: /' | tee -a "$res"; echo | tee -a "$res"
}
run patched-noshim "$PATCHED"
run patched-shim-off "$PATCHED" LD_PRELOAD="$SHIM" GDRSHIM_MODE=off GDRSHIM_TEST_HIDE_GDR=1
run patched-shadow-hidden "$PATCHED" LD_PRELOAD="$SHIM" GDRSHIM_MODE=shadow GDRSHIM_TEST_HIDE_GDR=1
run patched-register-hidden "$PATCHED" LD_PRELOAD="$SHIM" GDRSHIM_MODE=register GDRSHIM_TEST_HIDE_GDR=1
run patched-register-native "$PATCHED" LD_PRELOAD="$SHIM" GDRSHIM_MODE=register
run patched-register-hidden-noflush "$PATCHED" LD_PRELOAD="$SHIM" GDRSHIM_MODE=register GDRSHIM_TEST_HIDE_GDR=1 NCCL_GDR_FLUSH_DISABLE=1
run patched-force-hidden "$PATCHED" LD_PRELOAD="$SHIM" GDRSHIM_MODE=shadow GDRSHIM_TEST_HIDE_GDR=1 NCCL_GPU_GDR_FORCE=1
run stock-noshim "$STOCK"
run stock-register-hidden "$STOCK" LD_PRELOAD="$SHIM" GDRSHIM_MODE=register GDRSHIM_TEST_HIDE_GDR=1   # advertised by default since issue 28
run stock-advertise-hidden "$STOCK" LD_PRELOAD="$SHIM" GDRSHIM_MODE=register GDRSHIM_TEST_HIDE_GDR=1 GDRSHIM_ADVERTISE_GDR=1
run stock-advertise-shadow-hidden "$STOCK" LD_PRELOAD="$SHIM" GDRSHIM_MODE=shadow GDRSHIM_TEST_HIDE_GDR=1 GDRSHIM_ADVERTISE_GDR=1
# issue 28: zero configuration (register and the gate answered by default; the H200 is sm_90, so
# its GPU_DIRECT_RDMA_WRITES_ORDERING decides, printed with any refusal), and the opt-out
run stock-zeroconf-hidden "$STOCK" LD_PRELOAD="$SHIM" GDRSHIM_TEST_HIDE_GDR=1
run stock-zeroconf-hidden-forceflush "$STOCK" LD_PRELOAD="$SHIM" GDRSHIM_TEST_HIDE_GDR=1 NCCL_NET_FORCE_FLUSH=1
run stock-advertise0-hidden "$STOCK" LD_PRELOAD="$SHIM" GDRSHIM_TEST_HIDE_GDR=1 GDRSHIM_ADVERTISE_GDR=0
