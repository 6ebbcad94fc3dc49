#!/usr/bin/env bash
# Two builds of libgdrshim.so (the test knobs build, target/knobs/release/libgdrshim.so, copied
# aside) against each other, alternating in the same minutes: the scale rig's `scalebench ops
# SAMPLES N` under each, ROUNDS times. The rig is the one benches/scale.rs builds
# (tests/common/scale.rs); RIG is its folder, which `cargo bench --bench scale` leaves as
# $TMPDIR/gdrshim-scale-bench-<pid>.
#   bash docs/results/scale-2026-12-03d/ab.sh RIG A.so B.so [ROUNDS] [SAMPLES] [N]
set -euo pipefail
rig=$1 a=$2 b=$3 rounds=${4:-3} samples=${5:-2000} n=${6:-1000000}
for f in "$rig/scalebench" "$rig/libscalefake.so" "$a" "$b"; do
  [[ -e $f ]] || { echo "ab.sh: no $f" >&2; exit 2; }
done
for ((r = 1; r <= rounds; r++)); do
  for so in "$a" "$b"; do
    printf 'round %d %s ' "$r" "$so"
    LD_LIBRARY_PATH=$rig LD_PRELOAD="$so:$rig/libscalefake.so" GDRSHIM_TEST_DEV_DIR=$rig/dev \
      GDRSHIM_MODE=register GDRSHIM_ROUTE=nv503c GDRSHIM_LOG_LEVEL=warn \
      "$rig/scalebench" ops "$samples" "$n" 2>/dev/null |
      sed -n 's/^scale N=[0-9]* op=\(reg_gpu\|reg_gpu_again\|free_with_[0-9]*_regs\|reg_host\) /\1 /p' | tr '\n' ' '
    echo
  done
done
