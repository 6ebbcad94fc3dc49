#!/usr/bin/env bash
# Why NCCL's first inter-host transfer stalled on the H200 with gdrshim (issue 37;
# docs/results/h200-run29-hosts: rank 1's 16-byte RDMA WRITE into rank 0's GPU memory was never
# answered, RETRY_EXC_ERR after 34 s). Rows of 2 ranks, each a lab host, small all_reduces only
# (HOSTS_MAX_BYTES=4096), the lab's wire traced (HOSTS_TRACE=1: every message and GPU copy, timed,
# per process), each row capped at CAP s:
#   native  no gdrshim and no GeForce emulation: the H200's libcuda exports the dma-bufs itself
#           and NCCL takes GDR over the wire. A stall here is the lab's wire, not gdrshim.
#   with    gdrshim, GeForce emulated: the row that stalled.
#   without gdrshim in shadow mode: NCCL stages through host memory (passed before).
# WATCH s into a row, if a worker still runs: every thread's stack of each worker (gdb where the
# machine has it, else each thread's name, wchan and syscall from /proc), the last lines of each
# trace, and which trace ends at "copy begin" (a GPU copy that never returned).
#   tests/gpu/run-h200-hosts-stall.sh OUTDIR   (carry target/knobs/release/libgdrshim.so)
# OUTDIR/run-h200-hosts-stall.txt, OUTDIR/run-h200-hosts-stall-logs.tgz (traces and stacks too).
set -u
OUT=${1:?outdir}
B=/tmp/gdrshim-hosts-stall
rm -rf "$B"
mkdir -p "$B"
# shellcheck source=tests/gpu/hosts-lab.sh
source tests/gpu/hosts-lab.sh
hosts_build
hosts_nccl_env
export NCCL_NET_FORCE_FLUSH=1 HOSTS_TRACE=1 HOSTS_MAX_BYTES=4096
CAP=${STALL_CAP_S:-100} WATCH=${STALL_WATCH_S:-45}
log "gdb: $(command -v gdb || echo none); eu-stack: $(command -v eu-stack || echo none)"

# stacks ROW: every worker of the row (python running hosts_collectives.py, not torchrun's agent)
stacks() {
  local row=$1 pid t f="$B/logs/$1.stacks"
  for pid in $(pgrep -f 'hosts_collectives.py' || true); do
    grep -qa torchrun "/proc/$pid/cmdline" 2>/dev/null && continue
    {
      echo "=== pid $pid host $(tr '\0' '\n' <"/proc/$pid/environ" 2>/dev/null | sed -n 's/^FAKEWIRE_HOST=//p')"
      if command -v gdb >/dev/null; then
        timeout 60 gdb -p "$pid" -batch -ex 'set pagination off' -ex 'thread apply all bt 25' 2>&1 | grep -v '^\[New LWP'
      elif command -v eu-stack >/dev/null; then
        timeout 60 eu-stack -p "$pid" 2>&1
      fi
      for t in /proc/"$pid"/task/*; do
        echo "tid ${t##*/} $(cat "$t/comm" 2>/dev/null) wchan=$(cat "$t/wchan" 2>/dev/null) syscall=$(cut -d' ' -f1 "$t/syscall" 2>/dev/null)"
      done
    } >>"$f" 2>&1
  done
  log "stacks of $row's workers: $(grep -c '^=== pid' "$f" 2>/dev/null || echo 0) processes ($f in the logs)"
}

# traces ROW: per process, its trace's last lines, and GPU copies begun but not ended
traces() {
  local row=$1 tr begun ended
  for tr in "$B/logs/$row".trace.*; do
    [ -f "$tr" ] || continue
    begun=$(grep -c ' copy begin ' "$tr")
    ended=$(grep -c ' copy end ' "$tr")
    log "trace ${tr##*/}: $(wc -l <"$tr") lines, GPU copies begun $begun ended $ended," \
      "requests received $(grep -c ' received REQ ' "$tr") answered $(grep -c ' answer qpn ' "$tr")," \
      "RETRY_EXC_ERR $(grep -c RETRY_EXC_ERR "$tr"), dropped $(grep -c ' dropped' "$tr")"
    [ "$begun" = "$ended" ] || log "  a GPU copy never returned: $(grep ' copy begin ' "$tr" | tail -1)"
    tail -4 "$tr" | cut -c1-220 | sed 's/^/  /' | tee -a "$res" >/dev/null
  done
}

row() { # W
  local w=$1 name="stall-$1" rcs watcher
  hosts_clean "$name"
  (sleep "$WATCH" && pgrep -f hosts_collectives.py >/dev/null && stacks "$name") &
  watcher=$!
  rcs=$(hosts_torchrun "$name" "$w" 2 "$CAP" tests/gpu/hosts_collectives.py)
  kill "$watcher" 2>/dev/null
  wait "$watcher" 2>/dev/null
  log "### $name (2 ranks): exits $rcs"
  grep -h ': [0-9]*/[0-9]* ok' "$B/logs/$name".out.* | tee -a "$res"
  grep -h 'FAILED\|RETRY_EXC\|Error' "$B/logs/$name".out.* | sort | uniq -c | head -6 | cut -c1-220 | tee -a "$res"
  hosts_verdict "$name" "$w" 2
  traces "$name"
}
for w in ${STALL_ROWS:-native with without}; do row "$w"; done
hosts_pack
