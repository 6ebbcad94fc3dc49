#!/usr/bin/env bash
# Issue 47 part 1 on the GPU machine, in one call: the lab's wire with its pinned bounce buffer
# (tests/lab/fakewire.c) under the blocking pattern that stalled (run-h200-hosts-stall.sh: native,
# with, without; torchrun 2 ranks, `t.cpu()` after each collective), then what libcuda sends when
# a context ends (run-h200-ctx.sh, issue 46 defect 5), then, only if every stall row exited 0,
# the collectives' main and flush rows (run-h200-hosts-collectives.sh) in the time left.
#   tests/gpu/run-h200-wire-fix.sh OUTDIR   (carry target/knobs/release/libgdrshim.so; WIRE_FIX_S: the
#   seconds the whole may take, 560 by default)
# OUTDIR/stall, OUTDIR/ctx, OUTDIR/coll: each script's own files (the captures in one tgz).
set -u
OUT=${1:?outdir}
t0=$(date +%s)
STALL_CAP_S=${STALL_CAP_S:-75} bash tests/gpu/run-h200-hosts-stall.sh "$OUT/stall" >/dev/null 2>&1
grep -E '^### stall|ok$|a GPU copy never returned' "$OUT/stall/run-h200-hosts-stall.txt"
# the context ends (issue 46) were measured in h200-run30-ctx: WIRE_FIX_CTX=0 leaves them out
if [ "${WIRE_FIX_CTX:-1}" = 1 ]; then
  bash tests/gpu/run-h200-ctx.sh "$OUT/ctx" >/dev/null 2>&1
  # at most 8 files come back from a call: the captures as one
  (cd "$OUT/ctx" && tar czf ctx-captures.tgz ctx-*.cap.gz && rm -f ctx-*.cap.gz)
  grep -cE '^ask ' "$OUT/ctx/ctx.txt" | sed 's/^/ctx: answers recorded: /'
fi
stalled=$(grep -E '^### stall-' "$OUT/stall/run-h200-hosts-stall.txt" | grep -cvE 'exits 0 0 $')
if [ "$stalled" != 0 ]; then
  echo "wire-fix: $stalled stall row(s) did not exit 0 0: the collectives not run"
  exit 1
fi
left=$((${WIRE_FIX_S:-560} - ($(date +%s) - t0)))
echo "wire-fix: every stall row exited 0; the collectives in ${left} s"
HOSTS_DEADLINE_S=$left COLL_ROWS="${COLL_ROWS:-main flush}" bash tests/gpu/run-h200-hosts-collectives.sh "$OUT/coll" >/dev/null 2>&1
grep -E '^### |GDRDMA' "$OUT/coll/run-h200-hosts-collectives.txt" | cut -c1-200
