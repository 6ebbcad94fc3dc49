#!/usr/bin/env bash
# The shadow-mode oracle run on the GPU machine (H200, driver with native registration).
# Usage: tests/gpu/run-h200.sh OUTDIR   (needs target/release/libgdrshim.so built on our machine)
set -u
OUT=${1:?outdir}
mkdir -p "$OUT"
SHIM=$(readlink -f "${GDRSHIM_H200_SHIM:-target/release/libgdrshim.so}")
B=/tmp/gdrshim-gpu; mkdir -p "$B"
res="$OUT/results.txt"; : >"$res"
log() { echo "$@" | tee -a "$res"; }
log "## host: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader) $(head -1 /proc/driver/nvidia/version)"
log "## torch: $(python3 -c 'import torch;print(torch.__version__, torch.version.cuda, torch.cuda.nccl.version())' 2>&1)"
for p in alloc_probe bar1_readback bench; do
  nvcc -O2 -arch=sm_90 -o "$B/$p" "tests/gpu/$p.cu" -lcuda -ldl 2>&1 | tail -3 || log "build $p failed"
done
shadow() { # name, command...
  local name=$1; shift
  log "### $name: GDRSHIM_MODE=shadow GDRSHIM_CAPTURE=$name.cap LD_PRELOAD=libgdrshim.so $*"
  GDRSHIM_MODE=shadow GDRSHIM_LOG_LEVEL=info GDRSHIM_LOG_FILE="$B/$name.log" GDRSHIM_CAPTURE="$B/$name.cap" \
    LD_PRELOAD="$SHIM" timeout 300 "$@" >"$B/$name.out" 2>&1
  log "exit=$?"
  grep -v '^gdrshim: summary' "$B/$name.out" | tail -4 | tee -a "$res"
  grep -h '^gdrshim: summary' "$B/$name.out" "$B/$name.log" 2>/dev/null | tee -a "$res"
  grep -hE 'WARN|ERROR' "$B/$name.log" 2>/dev/null | sed 's/^[^[]*\[gdrshim\]//' | sort | uniq -c | sort -rn | head -12 | tee -a "$res"
}
shadow alloc-probe "$B/alloc_probe"
shadow torch-alloc python3 tests/gpu/torch_alloc.py
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True shadow torch-exp python3 tests/gpu/torch_alloc.py
NCCL_DEBUG=INFO NCCL_NVLS_ENABLE=0 shadow torch-nccl python3 tests/gpu/torch_nccl.py
shadow bar1-readback "$B/bar1_readback" 120
log "### benchmark (interleaved 5 times: none, shadow; each figure a median of 9 batches)"
for _ in 1 2 3 4 5; do
  "$B/bench" | sed 's/^/none /' | tee -a "$res"
  GDRSHIM_MODE=shadow GDRSHIM_SUMMARY=0 LD_PRELOAD="$SHIM" "$B/bench" | sed 's/^/shadow /' | tee -a "$res"
done
log "### same programs without the shim (identical results expected)"
python3 tests/gpu/torch_alloc.py 2>&1 | tail -1 | tee -a "$res"
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 tests/gpu/torch_alloc.py 2>&1 | tail -1 | tee -a "$res"
cd "$B" && for f in *.cap; do gzip -9 -c "$f" >"$OUT/$f.gz"; done
tar czf "$OUT/logs.tgz" ./*.log ./*.out 2>/dev/null
ls -la "$OUT"
