# shellcheck shell=bash
# What the many-hosts runs (issue 37 B; tests/gpu/run-h200-hosts-*.sh) share, sourced by each.
# Every rank is a lab host of its own on the one H200 (tests/lab: DIR/host N gives it HCA
# fwroce_N and host name labhostN) with NCCL_HOSTID=labhostN, so NCCL sees N nodes and takes
# NET/IB between them (nccl-hosts facts: P2P and SHM refuse across host hashes). The GeForce is
# emulated as the other device runs do: the knobs build of gdrshim with libcuda's dma-buf and GDR
# answers hidden (GDRSHIM_TEST_HIDE_DMABUF=1, GDRSHIM_TEST_HIDE_GDR=1), libcuda's own NV503C
# traffic suppressed (suppress503c.so).
#   with:    gdrshim in register mode (the default): LD_PRELOAD alone
#   without: GDRSHIM_MODE=shadow: gdrshim registers nothing, the hidden answers stay 0, so NCCL
#            stages through host memory (what a GeForce gives NCCL without gdrshim)
#   native:  nothing of ours preloaded and no GeForce emulation: the H200's libcuda exports
#            dma-bufs itself, so NCCL takes GDR over the lab's wire with no gdrshim in the process
#            (what tells the lab's own faults from gdrshim's)
# HOSTS_TRACE=1: the lab's wire traces every message and GPU copy (FAKEWIRE_TRACE) into
# $B/logs/ROW.trace.HOST.PID.
# Callers set OUT and B (a scratch folder), then call hosts_build once.
# shellcheck source=tests/gpu/lib-stubnic.sh
source tests/gpu/lib-stubnic.sh
KNOBS=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}")
LAB=$B/lab
res=$OUT/$(basename "$0" .sh).txt
log() { echo "$@" | tee -a "$res"; }

hosts_build() {
  mkdir -p "$B/logs" "$OUT"
  : >"$res"
  log "### $(date -u +%FT%TZ) $(python3 --version 2>&1); $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  [ -f "$KNOBS" ] || { log "no knobs build at $KNOBS"; exit 1; }
  CC=gcc bash tests/lab/build.sh "$LAB" >"$B/logs/lab-build.log" 2>&1 || { log "the lab did not build:"; tail -8 "$B/logs/lab-build.log" | tee -a "$res"; exit 1; }
  suppress503c_build "$B" || exit 1
  log "torch $(python3 -c 'import torch; print(torch.__version__, "nccl", ".".join(map(str, torch.cuda.nccl.version())))' 2>&1)"
}

# The environment of every rank: NCCL's internal IB transport only, on the lab's HCA of the
# rank's host (set by hosts_rank), one socket interface for its bootstrap, GDR at any distance
# (the lab's NIC hangs off its own fake PCI bus), NVLS and MNNVL off (one GPU), the proxy GIN
# asked for by name (NCCL 2.28.9 dereferences its undecided GIN plugin when GDAKI finds no
# device: h200-run26-lab), and NCCL's init, net and graph lines.
hosts_nccl_env() {
  export NCCL_NET=IB NCCL_NET_PLUGIN=none NCCL_SOCKET_IFNAME=lo NCCL_NET_GDR_LEVEL=SYS NCCL_IB_GID_INDEX=3 \
    NCCL_NVLS_ENABLE=0 NCCL_MNNVL_ENABLE=0 NCCL_GIN_TYPE=2 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,NET,GRAPH \
    CUDA_VISIBLE_DEVICES=0 MASTER_ADDR=127.0.0.1
  export FAKEWIRE_LAB=$B/state
  # the hosts share one GPU, time-sliced: few channels keep NCCL's kernels from starving each other
  export NCCL_MAX_NCHANNELS=${NCCL_MAX_NCHANNELS:-4}
}

# hosts_rank ROW W N CMD...: CMD as lab host N of row ROW, gdrshim W (with|without|native); its NCCL
# log, gdrshim log and the fake wire's summary under $B/logs/ROW.*.N.
hosts_rank() {
  local row=$1 w=$2 n=$3; shift 3
  local unset=() mode=()
  case $w in
    without) mode=(GDRSHIM_MODE=shadow) ;;
    native) unset=(-u LD_PRELOAD) ;;
    *) ;;
  esac
  [ "$w" = native ] || mode+=(GDRSHIM_TEST_HIDE_DMABUF=1 GDRSHIM_TEST_HIDE_GDR=1 SUPPRESS_LOG=/dev/null
    LD_PRELOAD="$B/suppress503c.so:$KNOBS")
  [ "${HOSTS_TRACE:-0}" = 1 ] && mode+=(FAKEWIRE_TRACE="$B/logs/$row.trace")
  env ${unset[@]+"${unset[@]}"} NCCL_HOSTID="labhost$n" NCCL_IB_HCA="=fwroce_$n" \
    NCCL_DEBUG_FILE="$B/logs/$row.nccl.$n.%p" GDRSHIM_LOG_FILE="$B/logs/$row.gdrshim.$n" GDRSHIM_LOG_LEVEL=info \
    FAKEWIRE_REPORT="$B/logs/$row.fw.$n" ${mode[@]+"${mode[@]}"} "$LAB/host" "$n" "$@"
}

# hosts_torchrun ROW W N CAP PY [NAME=VALUE | -u NAME ...] (env's arguments): N lab hosts at once, each one torchrun node of
# one process running PY (static rendezvous on 127.0.0.1), bounded by CAP seconds (SIGINT, then
# SIGKILL 10 s later); each host's output in $B/logs/ROW.out.N. Prints the exit statuses.
hosts_torchrun() {
  local row=$1 w=$2 n=$3 cap=$4 py=$5 r rcs="" pids=()
  shift 5
  local port=$((29500 + RANDOM % 3000))
  for ((r = 0; r < n; r++)); do
    hosts_rank "$row" "$w" "$r" env "$@" timeout -s INT -k 10 "$cap" torchrun --nnodes "$n" --node-rank "$r" \
      --nproc-per-node 1 --master-addr 127.0.0.1 --master-port "$port" "$py" >"$B/logs/$row.out.$r" 2>&1 &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r"; rcs+="$? "; done
  echo "$rcs"
}

# hosts_clean ROW [FAULTS]: a fresh lab state for the row, with its fault file (tests/lab/README.md).
hosts_clean() {
  rm -rf "$B/state"
  mkdir -p "$B/state"
  printf '%s' "${2:-}" >"$B/state/faults"
  rm -f "$B/logs/$1".*
}

# num FILE FIELD: FIELD summed over every summary line in FILE (each process of a host writes
# its own: torchrun's agent, which touches no GPU, writes zeros after its worker's counts)
num() { tr ' ' '\n' <"$1" 2>/dev/null | grep "^$2=" | cut -d= -f2 | awk '{ s += $1 } END { print s + 0 }'; }

# hosts_verdict ROW W NRANKS: one line per rank: NCCL's inter-host channels and how many are
# GDRDMA, lines that must not appear, gdrshim's counts, the fake wire's judgment.
hosts_verdict() {
  local row=$1 w=$2 n=$3 r nl net gdr bad g fw
  for ((r = 0; r < n; r++)); do
    nl=$(find "$B/logs" -name "$row.nccl.$r.*" | head -1)
    nl=${nl:-/dev/null}
    net=$(grep -c 'via NET/IB' "$nl")
    gdr=$(grep 'via NET/IB' "$nl" | grep -c '/GDRDMA')
    bad=$(grep -cE 'via P2P|via SHM|NET/Socket|Duplicate GPU|Could not find real path' "$nl")
    grep -h '^gdrshim: summary' "$B/logs/$row.gdrshim.$r" 2>/dev/null >"$B/logs/$row.sum.$r"
    g="registered=$(num "$B/logs/$row.sum.$r" registered) dmabuf_mrs=$(num "$B/logs/$row.sum.$r" dmabuf_mrs)"
    g+=" pass0_misses=$(num "$B/logs/$row.sum.$r" pass0_misses) rm_errors=$(num "$B/logs/$row.sum.$r" rm_errors)"
    g+=" export_oracle_disagree=$(num "$B/logs/$row.sum.$r" export_oracle_disagree)"
    fw="gpu_dmabuf_mr=$(num "$B/logs/$row.fw.$r" gpu_dmabuf_mr) wrong_regs=$(num "$B/logs/$row.fw.$r" dmabuf_refused)"
    fw+=" no_dmabuf_answers=$(num "$B/logs/$row.fw.$r" dmabuf_unsupported)"
    fw+=" wire_errors=$(num "$B/logs/$row.fw.$r" wire_errors) flush_reads_g2h=$(num "$B/logs/$row.fw.$r" bytes_g2h)"
    fw+=" g2g=$(num "$B/logs/$row.fw.$r" bytes_g2g) h2h=$(num "$B/logs/$row.fw.$r" bytes_h2h)"
    log "$(printf '%-22s %-7s rank %d | NET/IB channels %3s GDRDMA %3s forbidden %s | %s | %s' "$row" "$w" "$r" "$net" "$gdr" "$bad" "$g" "$fw")"
    grep -hE 'NET/IB : Using|GPU Direct RDMA|DMA-BUF is available|NCCL_HOSTID|nNodes|via NET' "$nl" 2>/dev/null |
      sed 's/^[^ ]* [0-9]*:[0-9]* //' | sort | uniq -c | sort -rn | head -6 | cut -c1-200 >>"$res"
  done
}

# hosts_pack: every log into OUT/logs.tgz (at most 8 files come back from a device run)
hosts_pack() { (cd "$B/logs" && tar czf "$OUT/$(basename "$0" .sh)-logs.tgz" .) 2>/dev/null; ls -la "$OUT"; }
