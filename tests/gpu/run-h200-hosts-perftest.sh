#!/usr/bin/env bash
# Many hosts on one GPU (issue 37 B): perftest's ib_write_bw, ib_read_bw and ib_send_bw with
# --use_cuda=0 --use_cuda_dmabuf between two lab hosts (tests/lab/perftest.sh), GPU memory on both
# ends as dma-buf MRs, in the emulated GeForce of tests/gpu/hosts-lab.sh: with gdrshim (it serves
# the dma-buf libcuda refuses) and without (perftest should stop at "DMA-BUF is not supported on
# this GPU"), then host memory as a control. perftest is built here from a copy fetched elsewhere
# and carried (never committed), with CUDA (CUDA_H_PATH); where its build tools (autoconf,
# automake, libtool, rdma-core's and libpci's headers) are missing it says so and stops.
#   tests/gpu/run-h200-hosts-perftest.sh OUTDIR PERFTEST_SRC   (carry target/knobs/release/libgdrshim.so)
set -u
OUT=${1:?outdir}
SRC=$(readlink -f "${2:?a copy of linux-rdma/perftest}")
B=/tmp/gdrshim-hosts-pt
rm -rf "$B"
mkdir -p "$B"
# shellcheck source=tests/gpu/hosts-lab.sh
source tests/gpu/hosts-lab.sh
hosts_build
missing=""
for t in autoreconf automake libtoolize; do command -v "$t" >/dev/null || missing+="$t "; done
for h in infiniband/verbs.h rdma/rdma_cma.h infiniband/umad.h pci/pci.h; do
  printf '#include <%s>\n' "$h" | gcc -E -x c - >/dev/null 2>&1 || missing+="$h "
done
CUDA_H=${CUDA_HOME:-/usr/local/cuda}/include/cuda.h
[ -f "$CUDA_H" ] || missing+="cuda.h "
if [ -n "$missing" ]; then log "perftest cannot be built here: missing $missing"; hosts_pack; exit 0; fi
cp -r "$SRC" "$B/src"
(cd "$B/src" && ./autogen.sh && ./configure CUDA_H_PATH="$CUDA_H" && make -j16) >"$B/logs/build.log" 2>&1 ||
  { log "perftest did not build:"; tail -5 "$B/logs/build.log" | tee -a "$res"; hosts_pack; exit 1; }
# perftest dlopens "libcuda.so" (no .so.1 fallback): the driver's library under that name
mkdir -p "$B/cudalib"
ln -sf "$(ldconfig -p | awk '/libcuda.so.1 /{print $NF; exit}')" "$B/cudalib/libcuda.so"
export LD_LIBRARY_PATH=$B/cudalib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
cp -r "$B/src" "$LAB/perftest"
touch "$LAB/perftest/ib_write_bw" # newer than the copy: tests/lab/perftest.sh keeps this build
emulate=(GDRSHIM_TEST_HIDE_DMABUF=1 GDRSHIM_TEST_HIDE_GDR=1 SUPPRESS_LOG=/dev/null GDRSHIM_LOG_LEVEL=info)
pre="$B/suppress503c.so:$KNOBS"
for w in with without; do
  mode=()
  [ "$w" = without ] && mode=(GDRSHIM_MODE=shadow)
  log "### GPU memory, dma-buf MRs, gdrshim $w"
  env ${mode[@]+"${mode[@]}"} "${emulate[@]}" GDRSHIM_LOG_FILE="$B/logs/gdrshim-$w" LD_PRELOAD="$pre" \
    timeout 200 bash tests/lab/perftest.sh "$LAB" "$SRC" --use_cuda=0 --use_cuda_dmabuf 2>&1 | tee -a "$res"
  grep -h 'DMA-BUF\|dmabuf\|Couldn' "$LAB/perftest-state/"*.out 2>/dev/null | sort -u | head -4 | cut -c1-200 | tee -a "$res"
  grep -h '^gdrshim: summary' "$B/logs/gdrshim-$w" 2>/dev/null | tr ' ' '\n' |
    grep -E '^(pid|route|dmabuf_served|dmabuf_exports|dmabuf_mrs|rm_errors|export_oracle_disagree)=' | tr '\n' ' ' | tee -a "$res"
  echo | tee -a "$res"
done
log "### host memory (control), gdrshim with"
env "${emulate[@]}" LD_PRELOAD="$pre" timeout 200 bash tests/lab/perftest.sh "$LAB" "$SRC" 2>&1 | tee -a "$res"
cp "$LAB/perftest-state/"*.out "$B/logs/" 2>/dev/null
hosts_pack
