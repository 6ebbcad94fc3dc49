#!/usr/bin/env bash
# shellcheck disable=SC2012 # the wheel and library names are ours or pip's: plain
# The consumer lab on the H200 (issue 28 item 6): released consumers move GPU memory over the fake
# wire (tests/lab: a libibverbs.so.1 stand-in, libmlx5 stub, sysfs overlay), a GeForce emulated,
# each consumer with gdrshim and without.
#
# GeForce emulation, both rows: the knobs build of gdrshim is preloaded with
# GDRSHIM_TEST_HIDE_DMABUF=1 (libcuda's DMA_BUF_SUPPORTED, 124, reads 0 and its
# cuMemGetHandleForAddressRange dma-buf answers NOT_SUPPORTED, 801; its real export is taken back)
# and GDRSHIM_TEST_HIDE_GDR=1 (GPU_DIRECT_RDMA_SUPPORTED, 116, reads 0), behind suppress503c.so
# (libcuda's own NV503C traffic never reaches RM). The NIC side is an inbox kernel without
# nvidia-peermem: the fake wire takes GPU memory only as a dma-buf MR, refuses a plain MR over GPU
# memory (EFAULT), answers the fd -1 dma-buf probe EBADF; no peermem sysfs is faked.
#   with:    GDRSHIM_MODE unset (register, the default): zero configuration, LD_PRELOAD alone.
#   without: GDRSHIM_MODE=shadow. Not "off": off is a pure pass-through that applies no knob, so
#            libcuda's native dma-buf export would work (an H200 is no GeForce). In shadow gdrshim
#            decides no route and registers nothing (src/shim/registrations.rs: serve_dmabuf needs
#            register mode; the verbs hooks convert nothing), while the hide knobs still answer
#            (src/advertise.rs: with no route, 116 and 124 keep the hidden 0; src/hooks/cuda.rs:
#            the dma-buf request is answered 801): what a GeForce gives a consumer.
# GDRSHIM_TEST_HIDE_GDR=1 hides CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_WITH_CUDA_VMM_SUPPORTED (110) too.
#
# Rows: consumer x with/without, one process each (every direction inside it, one verdict line
# per direction): UCX (ucp_loop, ours, on NIXL's bundled UCX 1.23: one process per direction),
# NIXL 1.5.1 (two agents, UCX backend), Mooncake 0.3.14 (loopback; its default
# WITH_NVIDIA_PEERMEM on = plain ibv_reg_mr of GPU memory, and WITH_NVIDIA_PEERMEM=0 = dma-buf),
# NCCL (PyTorch's, one rank: the init lines on the fake HCA and checked collectives).
# OUT/lab.txt: the table (exit, directions ok, gdrshim's summary counts, the fake wire's counts,
# wrong registrations), the NCCL init lines, the UCX lanes; OUT/lab-logs.tgz: every log.
# Most important rows first; every run is bounded (SIGINT, then SIGKILL 5 s later) and the whole
# lab stops starting runs at 390 s after its start: under 7 minutes even if everything hangs.
#   tests/gpu/run-h200-lab.sh OUT   (carry .whl from tests/lab/slim-wheels.sh and target/knobs/release/libgdrshim.so)
set -u
OUT=${1:?outdir}; mkdir -p "$OUT"
KNOBS=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}")
B=/tmp/gdrshim-lab; S=/tmp/site; L=$S/nixl_cu13.libs
rm -rf "$B" /tmp/fakewire-sys; mkdir -p "$B/fw" "$B/logs"
res=$OUT/lab.txt; : >"$res"
log() { echo "$@" | tee -a "$res"; }
t0=$(date +%s); DEADLINE=$((t0 + 390))
log "### $(date -u +%FT%TZ) $(python3 --version 2>&1); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
[ -f "$KNOBS" ] || { log "no knobs build at $KNOBS"; exit 1; }
# the real machine's peer-memory state: consumers (and gdrshim's route choice) read it through the overlay's gaps
log "peermem here: $(ls -d /sys/module/nvidia_peermem /sys/module/nv_peer_mem /sys/kernel/mm/memory_peers/nv_mem 2>/dev/null | tr '\n' ' ')(none listed = not loaded); libibverbs here: $(ldconfig -p | grep -oE 'libibverbs\.so[.0-9]*' | sort -u | tr '\n' ' ')"
log "### install wheels, build the fake wire ($(ls .whl | tr '\n' ' '))"
timeout 120 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$S" .whl/*.whl 2>&1 | tail -3 | tee -a "$res"
if [ ! -d "$S/mooncake" ] || [ ! -d "$S/nixl_cu13" ]; then log "wheels did not install"; exit 1; fi
export PYTHONPATH=$S${PYTHONPATH:+:$PYTHONPATH}
W=tests/lab
# the lab's build (tests/lab/build.sh: libibverbs.so.1 and .so, libmlx5, fakesys.so); one process
# per consumer row, so no FAKEWIRE_LAB: the wire stays inside each process, as host 0
CC=gcc bash $W/build.sh "$B/lab" >/dev/null || exit 1
# The lab is now a provider of rdma-core's own libibverbs (no stand-in libibverbs.so.1 to copy
# over NIXL's renamed copy): this run needs a provider patched to NIXL's copy, as
# tests/lab_copies.rs makes one with patchelf, which the GPU machine lacks. Not ported yet.
[ -f "$B/lab/lib/libibverbs.so.1" ] || { log "run-h200-lab.sh: not ported to the lab's rdma-core provider (tests/lab_copies.rs shows how); nothing run"; exit 1; }
cp -P "$B/lab/lib/"* "$B/fw/" && cp "$B/lab/fakesys.so" "$B/fakesys.so" || exit 1
suppress503c_build "$B" || exit 1
# NIXL's wheel carries its own rdma-core (auditwheel names): the fake takes their place
cp "$B/fw/libibverbs.so.1" "$L"/libibverbs-*.so.*; cp "$B/fw/libmlx5.so.1" "$L"/libmlx5-*.so.*
for f in "$L"/ucx/*.so.0.0.0; do ln -sf "$(basename "$f")" "${f%.0.0}"; done
gcc -O1 -I"$S/libucx/include" -o "$B/ucp_loop" $W/ucp_loop.c "$L"/libucp-*.so.0.0.0 "$L"/libucs-*.so.0.0.0 -Wl,-rpath,"$L" -ldl || exit 1
# Mooncake links libibverbs.so.1 / libmlx5.so.1 / libnuma.so.1 / libcurl.so.4 / libcudart.so.13 from the system
for n in libnuma.so.1 libcurl.so.4; do ldconfig -p | grep -q "$n " || ln -sf "$(ls "$L"/"${n%%.so*}"-*.so* 2>/dev/null | head -1)" "$B/fw/$n"; done
CUDART=$(dirname "$(python3 -c 'import nvidia, glob, os; print(next(iter(glob.glob(os.path.join(list(nvidia.__path__)[0], "**/libcudart.so.13*"), recursive=True)), ""))' 2>/dev/null)" 2>/dev/null)
[ "$CUDART" = . ] && CUDART=
log "libcudart: ${CUDART:-system}; knobs lib: $KNOBS; built in $(( $(date +%s) - t0 )) s"
export UCX_TLS=rc_verbs,ud_verbs,cuda_copy UCX_NET_DEVICES=fwroce_0:1 UCX_IB_ROCE_REACHABILITY_MODE=all UCX_MODULE_DIR=$L/ucx
export NIXL_PLUGIN_DIR=$S/.nixl_cu13.mesonpy.libs/plugins NCCL_NVLS_ENABLE=0 MC_TRANSFER_TIMEOUT=5 MC_LOG_LEVEL=INFO
export NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,GRAPH,ENV NCCL_IB_HCA=fwroce_0 NCCL_SOCKET_IFNAME=lo
# NCCL 2.28.9 dereferences its "undecided" GIN plugin ((ncclGin_t *)-1) when the GDAKI one
# initialises but finds no device (src/plugin/net.cc:204-216: SIGSEGV at :216, with and without
# gdrshim, h200-run26-lab): the proxy GIN is asked for by name
export NCCL_GIN_TYPE=2
hdr=$(printf '%-15s %-7s %-4s %-26s | %-52s | %-62s | %s' row gdrshim exit "directions ok/total" "gdrshim: dmabuf_mrs dmabuf_exports pass0_hits registered" "fakewire: gpu_dmabuf_mr gpu_plain_refused host_mr moved(g2g,g2h,h2g,h2h)" wrong)
log "$hdr"
sum_field() { tr ' ' '\n' <"$1" 2>/dev/null | grep "^$2=" | tail -1 | cut -d= -f2; }
num() { local v; v=$(sum_field "$@"); echo "${v:-0}"; }
# every program prints one verdict line per direction (or collective): "PROG[ SRC->DST]: ... bytes=N", FAILED where not ok
VERDICT='^(nixl_loop|mooncake_loop|ucp_loop|nccl_loop)[^:]*: .*bytes='

run() { # row name, with|without, cap seconds, command... (extra env as NAME=VALUE words first in the command)
  local row=$1 w=$2 cap=$3; shift 3
  local name=$row-$w rep=$B/logs/$row-$w.fw gl=$B/logs/$row-$w.gdrshim now left mode
  now=$(date +%s); left=$((DEADLINE - now)); [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -lt 8 ]; then log "$(printf '%-15s %-7s skipped: the lab is out of time (%s s)' "$row" "$w" $((now - t0)))"; return; fi
  mode=(); [ "$w" = without ] && mode=(GDRSHIM_MODE=shadow)
  # "noshim": no gdrshim loaded at all (the H200 as it is: libcuda's own dma-buf answers), to tell
  # a consumer's or the wire's trouble from gdrshim's
  local pre="$B/fakesys.so:$B/suppress503c.so:$KNOBS"; [ "$w" = noshim ] && pre="$B/fakesys.so"
  echo "... $name (cap ${cap}s, at $((now - t0)) s)"
  env ${mode[@]+"${mode[@]}"} GDRSHIM_TEST_HIDE_DMABUF=1 GDRSHIM_TEST_HIDE_GDR=1 GDRSHIM_LOG_LEVEL=info GDRSHIM_LOG_FILE="$gl" \
    SUPPRESS_LOG="$B/logs/$name.native" FAKEWIRE_REPORT="$rep" LD_LIBRARY_PATH="$B/fw${CUDART:+:$CUDART}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    LD_PRELOAD="$pre" timeout -s INT -k 5 "$cap" "$@" >"$B/logs/$name.out" 2>&1
  local rc=$? ok tot gs g fw wrong
  tot=$(grep -cE "$VERDICT" "$B/logs/$name.out")
  ok=$(grep -E "$VERDICT" "$B/logs/$name.out" | grep -vc FAILED)
  # gdrshim's exit summary (stderr or its log file); the fake wire's (FAKEWIRE_REPORT)
  grep -h '^gdrshim: summary' "$B/logs/$name.out" "$gl" 2>/dev/null | tail -1 >"$B/logs/$name.sum"
  gs=""; for f in dmabuf_mrs dmabuf_exports pass0_hits registered; do g=$(sum_field "$B/logs/$name.sum" $f); gs+="${g:--} "; done
  [ -s "$B/logs/$name.sum" ] || gs="no summary (killed?)"
  fw=""; for f in gpu_dmabuf_mr gpu_plain_refused host_mr; do g=$(sum_field "$rep" $f); fw+="${g:--} "; done
  fw+="($(sum_field "$rep" bytes_g2g),$(sum_field "$rep" bytes_g2h),$(sum_field "$rep" bytes_h2g),$(sum_field "$rep" bytes_h2h))"
  [ -s "$rep" ] || fw="no report (verbs never loaded, or killed)"
  # wrong: a dma-buf MR the fake refused (fd/range/iova not the GPU memory asked), a wire error,
  # an RM error of gdrshim's, an export whose answer disagreed with libcuda's hidden one
  wrong=$(( $(num "$rep" dmabuf_refused) + $(num "$rep" wire_errors) + $(num "$B/logs/$name.sum" rm_errors) + $(num "$B/logs/$name.sum" export_oracle_disagree) ))
  log "$(printf '%-15s %-7s %-4s %-26s | %-52s | %-62s | %s' "$row" "$w" "$rc" "$ok/$tot" "$gs" "$fw" "$wrong")"
  grep -hE '^(nixl_loop|mooncake_loop|ucp_loop|nccl_loop)' "$B/logs/$name.out" | sed 's/^/      /' | cut -c1-200 >>"$res"
}
DIRS=(gpu-gpu gpu-host host-gpu host-host)
NB=1048576
# LAB_ROWS=quick: a short pass that tells the wire's trouble from gdrshim's (each consumer's first
# direction, with, without and with no gdrshim at all), with the logs' ends in lab.txt
if [ "${LAB_ROWS:-all}" = nccl ]; then
  for w in with without; do run nccl $w 90 python3 $W/nccl_loop.py; done
  DEADLINE=0
fi
if [ "${LAB_ROWS:-all}" = quick ]; then
  for w in noshim with; do run ucx-host-host $w 15 "$B/ucp_loop" host host $NB; done
  for w in noshim with; do run ucx-gpu-gpu $w 15 "$B/ucp_loop" gpu gpu $NB; done
  for w in noshim with; do run nccl $w 40 python3 $W/nccl_loop.py; done
  for w in noshim with; do run mooncake-dmabuf $w 25 env WITH_NVIDIA_PEERMEM=0 python3 $W/mooncake_loop.py $NB gpu-gpu; done
  for w in noshim with; do run nixl $w 30 python3 $W/nixl_loop.py $NB gpu-gpu; done
  DEADLINE=0
fi
for w in with without; do run nccl $w 90 python3 $W/nccl_loop.py; done
for w in with without; do run nixl $w 60 python3 $W/nixl_loop.py $NB "${DIRS[@]}"; done
for w in with without; do run mooncake $w 60 python3 $W/mooncake_loop.py $NB "${DIRS[@]}"; done
for w in with without; do run mooncake-dmabuf $w 60 env WITH_NVIDIA_PEERMEM=0 python3 $W/mooncake_loop.py $NB "${DIRS[@]}"; done
for d in "${DIRS[@]}"; do for w in with without; do
  run "ucx-$d" $w 20 "$B/ucp_loop" "${d%-*}" "${d#*-}" $NB
done; done
log "### $(( $(date +%s) - t0 )) s: NCCL's init lines on the fake HCA (with, then without)"
for w in with without; do
  grep -hE 'NET/IB : Using|GPU Direct RDMA|DMA-BUF|NET/Socket : Using|Using network|Failed to|WARN' "$B/logs/nccl-$w.out" 2>/dev/null | sort -u | head -12 | cut -c1-220 | sed "s/^/nccl-$w: /" | tee -a "$res"
done
log "### Mooncake's registration lines (the refusals say why)"
grep -hE 'Failed to register|Failed to retrieve dmabuf|DMA BUF supported required|Installing|installTransport|RDMA device' "$B"/logs/mooncake*.out 2>/dev/null | sort | uniq -c | sort -rn | head -10 | cut -c1-220 | tee -a "$res"
log "### the ucp endpoint lanes (the transport that ran), per run"
grep -H 'lane\[' "$B"/logs/ucx-*.out 2>/dev/null | sed "s|$B/logs/||" | cut -c1-200 | tee -a "$res"
log "### total $(( $(date +%s) - t0 )) s"
# where NCCL died (SIGSEGV with and without gdrshim: the wire's or NCCL's, not gdrshim's): a
# backtrace from cuda-gdb, the one debugger the GPU machine has
if grep -qE '^nccl +(noshim|without) +139' "$res" && command -v cuda-gdb >/dev/null; then
  log "### NCCL's SIGSEGV without gdrshim, cuda-gdb's backtrace"
  env LD_LIBRARY_PATH="$B/fw${CUDART:+:$CUDART}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" FAKEWIRE_REPORT=/dev/null \
    timeout -k 5 90 cuda-gdb -q -batch -ex 'set pagination off' -ex "set environment LD_PRELOAD=$B/fakesys.so" -ex run -ex bt -ex 'info sharedlibrary fakewire' \
    --args python3 $W/nccl_loop.py 2>&1 | grep -E '^#[0-9]|signal|SIGSEGV' | head -25 | cut -c1-220 | tee -a "$res"
fi
log "### the end of each run's output, and the fake wire's own lines"
for f in "$B"/logs/*.out; do
  [ -s "$f" ] || continue
  echo "--- ${f##*/}" >>"$res"
  { grep -h '^fakewire' "$f" | head -8; tail -n 14 "$f"; } | cut -c1-220 >>"$res"
done
# (the suppressed native traffic logs are big and not needed here)
(cd "$B/logs" && find . -type f ! -name '*.native' -size -4M -print0 | tar czf "$OUT/lab-logs.tgz" --null -T -) 2>/dev/null
ls "$OUT"
