#!/usr/bin/env bash
# Many hosts on one GPU (issue 37 B): NVSHMEM's IBRC transport between two PEs that are lab hosts
# of their own (tests/gpu/hosts-lab.sh; NVSHMEM tells nodes apart by gethostname(), which the lab
# answers labhostN), with gdrshim and without, or what NVSHMEM says when it refuses.
# tests/gpu/hosts_nvshmem.cu (host-initiated puts, unique-id bootstrap) is built here against the
# NVSHMEM wheel (`pip download nvidia-nvshmem-cu12` or -cu13 to match PyTorch's CUDA, carried).
#   tests/gpu/run-h200-hosts-nvshmem.sh OUTDIR NVSHMEM_WHEEL_OR_SLIM_TAR_XZ   (carry target/knobs/release/libgdrshim.so)
set -u
OUT=${1:?outdir}
WHL=$(readlink -f "${2:?the nvidia-nvshmem wheel}")
B=/tmp/gdrshim-hosts-nvshmem
rm -rf "$B"
mkdir -p "$B"
# shellcheck source=tests/gpu/hosts-lab.sh
source tests/gpu/hosts-lab.sh
hosts_build
# the wheel (182 MB for 3.8.0), or a slim copy of the files used here, its libnvshmem_host pruned to
# sm_90 (tests/gpu/prune-fatbin.py), under nvidia/nvshmem/ in a .tar.xz: what one call can carry
case $WHL in
  *.tar.xz)
    mkdir -p "$B/whl"
    tar xJf "$WHL" -C "$B/whl" || { log "the NVSHMEM copy did not unpack"; exit 1; }
    ;;
  *) python3 -m pip install -q --no-index --no-deps --target "$B/whl" "$WHL" || { log "the NVSHMEM wheel did not install"; exit 1; } ;;
esac
NV=$(find "$B/whl" -path '*nvshmem/include/nvshmem.h' | head -1)
NV=${NV%/include/nvshmem.h}
[ -n "$NV" ] || { log "no nvshmem.h in the wheel: $(find "$B/whl" -maxdepth 3 | head -20 | tr '\n' ' ')"; hosts_pack; exit 1; }
host_lib=$(find "$NV/lib" -name 'libnvshmem_host.so*' | head -1)
ln -sf "$host_lib" "$NV/lib/libnvshmem_host.so"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
"$CUDA_HOME/bin/nvcc" -O1 -arch=sm_90 -I"$NV/include" -o "$B/hosts_nvshmem" tests/gpu/hosts_nvshmem.cu -L"$NV/lib" \
  -lnvshmem_host -Xlinker -rpath -Xlinker "$NV/lib" >"$B/logs/build.log" 2>&1 ||
  { log "hosts_nvshmem did not build:"; tail -8 "$B/logs/build.log" | tee -a "$res"; hosts_pack; exit 1; }
log "NVSHMEM: $(basename "$WHL"); libraries: $(find "$NV/lib" -name '*.so*' -printf '%f ' | cut -c1-300)"
export LD_LIBRARY_PATH=$NV/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} CUDA_VISIBLE_DEVICES=0 FAKEWIRE_LAB=$B/state \
  NVSHMEM_REMOTE_TRANSPORT=ibrc NVSHMEM_IB_GID_INDEX=3 NVSHMEM_DEBUG=INFO NVSHMEM_BOOTSTRAP=UID \
  NVSHMEM_SYMMETRIC_SIZE=$((64 << 20)) NVSHMEM_DISABLE_CUDA_VMM=0
for w in with without; do
  hosts_clean "nvshmem-$w"
  mkdir -p "$B/rdv-$w"
  pids=()
  for pe in 0 1; do
    hosts_rank "nvshmem-$w" "$w" "$pe" env NVSHMEM_HCA_LIST="fwroce_$pe" timeout -k 5 90 "$B/hosts_nvshmem" "$B/rdv-$w" "$pe" 2 \
      >"$B/logs/nvshmem-$w.out.$pe" 2>&1 &
    pids+=($!)
  done
  rcs=""
  for p in "${pids[@]}"; do wait "$p"; rcs+="$? "; done
  log "### NVSHMEM IBRC, 2 PEs, gdrshim $w: exits $rcs"
  grep -h '^hosts_nvshmem' "$B/logs/nvshmem-$w".out.* | tee -a "$res"
  grep -hiE 'error|warn|transport|ibrc|dmabuf|peer' "$B/logs/nvshmem-$w".out.* | sed 's/^[^ ]*:[0-9]* //' | sort | uniq -c | sort -rn |
    head -10 | cut -c1-220 | tee -a "$res"
  for pe in 0 1; do
    log "pe $pe: gdrshim $(grep -h '^gdrshim: summary' "$B/logs/nvshmem-$w.gdrshim.$pe" 2>/dev/null | tr ' ' '\n' |
      grep -E '^(dmabuf_mrs|dmabuf_exports|registered|rm_errors)=' | tr '\n' ' ')| fake wire $(tr ' ' '\n' <"$B/logs/nvshmem-$w.fw.$pe" 2>/dev/null |
      grep -E '^(gpu_dmabuf_mr|gpu_plain_refused|dmabuf_refused|bytes_g2g|wire_errors)=' | tr '\n' ' ')"
  done
done
hosts_pack
