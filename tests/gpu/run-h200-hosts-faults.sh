#!/usr/bin/env bash
# Many hosts on one GPU (issue 37 B): faults through NCCL, ranks as lab hosts of their own
# (tests/gpu/hosts-lab.sh), gdrshim preloaded (register):
#   no-dmabuf  host 1's kernel has no dma-buf MRs ("no-dmabuf 1" in the lab's fault file): rank
#              1's NCCL should say GPU Direct RDMA Disabled for its HCA and stage through host
#              memory, rank 0 keeps GDRDMA; every collective still exact
#   peermem    host 1 has nvidia-peermem ("peermem 1"): NCCL sees both kinds of GDR there; exact
#   kill-N     N ranks (2, 4), rank 1 SIGKILLs itself 5 s into a loop of all_reduce: the others
#              must fail with NCCL's error in bounded time (NCCL_IB_TIMEOUT=12, 7 retries: about
#              0.13 s on the wire, then NCCL's and torch's own handling), and nothing of the run
#              may stay behind (no process, no GPU context)
#   tests/gpu/run-h200-hosts-faults.sh OUTDIR   (carry target/knobs/release/libgdrshim.so)
set -u
OUT=${1:?outdir}
B=/tmp/gdrshim-hosts-faults
rm -rf "$B"
mkdir -p "$B"
# shellcheck source=tests/gpu/hosts-lab.sh
source tests/gpu/hosts-lab.sh
hosts_build
hosts_nccl_env
export NCCL_NET_FORCE_FLUSH=1
t0=$(date +%s)
for f in no-dmabuf peermem; do
  hosts_clean "$f" "$f 1"$'\n'
  rcs=$(hosts_torchrun "$f" with 2 150 tests/gpu/hosts_collectives.py HOSTS_MAX_BYTES=$((4 << 20)))
  log "### $f 1: exits $rcs at $(($(date +%s) - t0)) s"
  grep -h ': [0-9]*/[0-9]* ok' "$B/logs/$f".out.* | tee -a "$res"
  grep -h 'FAILED' "$B/logs/$f".out.* | head -3 | tee -a "$res"
  hosts_verdict "$f" with 2
done
for n in 2 4; do
  row=kill-$n
  hosts_clean "$row"
  start=$(date +%s)
  rcs=$(hosts_torchrun "$row" with "$n" 200 tests/gpu/hosts_collectives.py HOSTS_DIE=1:5 NCCL_IB_TIMEOUT=12 NCCL_IB_RETRY_CNT=7)
  log "### $row: rank 1 killed 5 s in; exits $rcs; the run took $(($(date +%s) - start)) s"
  grep -h 'killing myself\|error after' "$B/logs/$row".out.* | cut -c1-240 | tee -a "$res"
  grep -hE 'NCCL WARN|ncclRemoteError|remote process exited|Watchdog caught|DistBackendError' "$B/logs/$row".out.* \
    "$B/logs/$row".nccl.* 2>/dev/null | sed 's/^[^ ]* [0-9]*:[0-9]* //' | sort | uniq -c | sort -rn | head -6 | cut -c1-220 | tee -a "$res"
  left=$(pgrep -f hosts_collectives.py | tr '\n' ' ')
  ctx=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr '\n' ' ')
  log "left behind: processes [${left}] GPU contexts [${ctx}]"
  hosts_verdict "$row" with "$n"
done
log "### total $(($(date +%s) - t0)) s"
hosts_pack
