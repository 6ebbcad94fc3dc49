#!/usr/bin/env bash
# Many hosts on one GPU (issue 37 B): a short DDP training (tests/gpu/hosts_ddp.py) between 2 and
# 4 ranks that are lab hosts of their own, with gdrshim and without, NCCL's algorithm, protocol
# and channels pinned (Ring, Simple, 2): the losses must be equal bit for bit; the steps' times
# are recorded, nothing is claimed of them (the wire is a copy). Per rank, hosts_verdict's line.
#   tests/gpu/run-h200-hosts-ddp.sh OUTDIR   (carry target/knobs/release/libgdrshim.so)
set -u
OUT=${1:?outdir}
B=/tmp/gdrshim-hosts-ddp
rm -rf "$B"
mkdir -p "$B"
# shellcheck source=tests/gpu/hosts-lab.sh
source tests/gpu/hosts-lab.sh
hosts_build
hosts_nccl_env
export NCCL_NET_FORCE_FLUSH=1 NCCL_ALGO=Ring NCCL_PROTO=Simple NCCL_MIN_NCHANNELS=2 NCCL_MAX_NCHANNELS=2 \
  CUBLAS_WORKSPACE_CONFIG=:4096:8
for n in ${HOSTS_DDP_RANKS:-2 4}; do
  for w in with without; do
    hosts_clean "ddp$n-$w"
    rcs=$(hosts_torchrun "ddp$n-$w" "$w" "$n" 200 tests/gpu/hosts_ddp.py)
    log "### ddp $n ranks $w: exits $rcs"
    grep -h '^hosts_ddp rank 0:' "$B/logs/ddp$n-$w.out.0" | sed 's/ ms=.*//' >"$B/logs/ddp$n-$w.losses"
    log "steps: $(wc -l <"$B/logs/ddp$n-$w.losses"); step ms (rank 0): $(grep -ho 'ms=[0-9.]*' "$B/logs/ddp$n-$w.out.0" | tr '\n' ' ')"
    hosts_verdict "ddp$n-$w" "$w" "$n"
  done
  if [ -s "$B/logs/ddp$n-with.losses" ] && cmp -s "$B/logs/ddp$n-with.losses" "$B/logs/ddp$n-without.losses"; then
    log "ddp $n ranks: the losses with gdrshim equal those without, bit for bit ($(wc -l <"$B/logs/ddp$n-with.losses") steps)"
  else
    log "ddp $n ranks: the losses DIFFER (or a run failed):"
    diff "$B/logs/ddp$n-with.losses" "$B/logs/ddp$n-without.losses" | head -6 | tee -a "$res"
  fi
done
hosts_pack
