#!/usr/bin/env bash
# Many hosts on one GPU (issue 37 B): torchrun with 2 and 4 ranks, each a lab host of its own
# (tests/gpu/hosts-lab.sh), so NCCL's inter-node path runs: net_ib between GPU buffers registered
# as dma-bufs on both ends, over the lab's wire. tests/gpu/hosts_collectives.py checks every
# collective (all_reduce, all_gather, reduce_scatter, all_to_all, broadcast, send/recv) in fp32,
# bf16 and int8 from 1 B to 256 MiB and odd sizes against a CPU reference. Rows, each with
# gdrshim, without, and native (nothing of ours, the H200's libcuda exporting) where it matters: 2 and 4 ranks; each protocol forced once (NCCL_PROTO);
# NCCL_NET_FORCE_FLUSH=1 (set for every row: docs/nccl-flush.md) and once =0, to see what NCCL
# then does (its flush READs are the fake wire's bytes_g2h); NCCL_CUMEM_ENABLE=0 and =1; user
# buffers (ncclMemAlloc + ncclCommRegister through torch's MemPool) on expandable (VMM) segments.
# Per rank: NCCL's inter-host channels and how many say GDRDMA, gdrshim's summary, the fake
# wire's judgment of every registration (tests/gpu/hosts-lab.sh: hosts_verdict). Step times are
# recorded in the lines (ms=), for the record only: the wire is a copy.
#   tests/gpu/run-h200-hosts-collectives.sh OUTDIR   (carry target/knobs/release/libgdrshim.so)
# OUTDIR/run-h200-hosts-collectives.txt: the table; OUTDIR/run-h200-hosts-collectives-logs.tgz.
# Bounded: rows stop starting 540 s after the start.
set -u
OUT=${1:?outdir}
B=/tmp/gdrshim-hosts-coll
rm -rf "$B"
mkdir -p "$B"
# shellcheck source=tests/gpu/hosts-lab.sh
source tests/gpu/hosts-lab.sh
hosts_build
hosts_nccl_env
export NCCL_NET_FORCE_FLUSH=1
t0=$(date +%s)
DEADLINE=$((t0 + ${HOSTS_DEADLINE_S:-540}))
row() { # NAME W N CAP [NAME=VALUE...]
  local name=$1 w=$2 n=$3 cap=$4 left rcs
  shift 4
  left=$((DEADLINE - $(date +%s)))
  [ "$left" -lt "$cap" ] && cap=$left
  if [ "$cap" -lt 30 ]; then log "$name $w: not run, out of time"; return; fi
  hosts_clean "$name-$w"
  rcs=$(hosts_torchrun "$name-$w" "$w" "$n" "$cap" tests/gpu/hosts_collectives.py "$@")
  log "### $name $w ($n ranks; $*): exits $rcs at $(($(date +%s) - t0)) s"
  grep -h ': [0-9]*/[0-9]* ok' "$B/logs/$name-$w".out.* | tee -a "$res"
  grep -h 'FAILED\|Error\|error' "$B/logs/$name-$w".out.* | head -5 | cut -c1-220 | tee -a "$res"
  hosts_verdict "$name-$w" "$w" "$n"
}
# COLL_ROWS: which groups, in this order (default all): main (2 and 4 ranks, with, native,
# without), pair (2 ranks with and native), proto, flush (the variable at 0; /etc/nccl.conf alone; neither), cumem
for group in ${COLL_ROWS:-main proto flush cumem}; do
  case $group in
    main)
      for w in with native without; do row coll2 "$w" 2 200; done
      for w in with native without; do row coll4 "$w" 4 200 HOSTS_MAX_BYTES=$((64 << 20)); done
      ;;
    pair) # coll2 with gdrshim and native only (run-h200-hosts-nccl232.sh)
      for w in with native; do row coll2 "$w" 2 200; done
      ;;
    proto)
      for p in LL LL128 Simple; do row "proto-$p" with 2 60 NCCL_PROTO="$p" HOSTS_MAX_BYTES=$((4 << 20)); done
      ;;
    flush)
      # NCCL's flush READs (the receiving rank's bytes_g2h) with the variable at 0, with a line
      # NCCL_NET_FORCE_FLUSH=1 in /etc/nccl.conf and no variable (what deploy.sh writes on an
      # sm_90+ GeForce: docs/nccl-flush.md), and with neither
      row noforceflush with 2 60 NCCL_NET_FORCE_FLUSH=0 HOSTS_MAX_BYTES=$((4 << 20))
      conf_kept=""
      [ -e /etc/nccl.conf ] && conf_kept=$(cat /etc/nccl.conf)
      printf '%s\nNCCL_NET_FORCE_FLUSH=1\n' "$conf_kept" >/etc/nccl.conf
      row conffile with 2 60 -u NCCL_NET_FORCE_FLUSH HOSTS_MAX_BYTES=$((4 << 20))
      if [ -n "$conf_kept" ]; then printf '%s\n' "$conf_kept" >/etc/nccl.conf; else rm -f /etc/nccl.conf; fi
      row neither with 2 60 -u NCCL_NET_FORCE_FLUSH HOSTS_MAX_BYTES=$((4 << 20))
      ;;
    cumem)
      row cumem0 with 2 60 NCCL_CUMEM_ENABLE=0 HOSTS_MAX_BYTES=$((4 << 20))
      row cumem1-vmm-pool with 2 60 NCCL_CUMEM_ENABLE=1 HOSTS_POOL=1 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
        HOSTS_MAX_BYTES=$((4 << 20))
      ;;
  esac
done
log "### total $(($(date +%s) - t0)) s"
hosts_pack
