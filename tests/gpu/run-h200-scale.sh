#!/usr/bin/env bash
# The dev VM's scale and start-up benchmarks (benches/scale.rs, benches/startup.rs) on the GPU
# machine's CPU, whose memory is not the 2-core dev VM's: no cargo there, so the C parts are built
# here with gcc and the table is joined with awk. The fake driver and NIC are the dev VM's
# (tests/c/scalefake.c, fakeverbs.c): no GPU is touched. Artifacts built elsewhere:
# target/knobs/release/libgdrshim.so (the scale rig needs the knobs' device folder) and
# target/release/libgdrshim.so (start-up: the library as it ships), and if present
# target/floor/libfloor.so (the Rust floor of the start-up benchmark: tests/rust/floor_preload.rs as
# `cargo bench --bench startup` builds it, copied there).
# Usage: tests/gpu/run-h200-scale.sh OUTDIR [SAMPLES]
set -u
OUT=${1:?outdir}
SAMPLES=${2:-2000}
mkdir -p "$OUT"
B=/tmp/gdrshim-scale
rm -rf "$B"; mkdir -p "$B/dev/sys/module/nvidia_peermem"
KNOBS=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}")
SHIM=$(readlink -f "${GDRSHIM_H200_SHIM:-target/release/libgdrshim.so}")
# ld.so ignores a preload it cannot find: without this, "with" would silently measure "without"
if [ ! -f "$KNOBS" ] || [ ! -f "$SHIM" ]; then
  echo "run-h200-scale: build and carry target/knobs/release/libgdrshim.so and target/release/libgdrshim.so" >&2
  exit 1
fi
C=tests/c
gcc -O2 -Wall -Werror -o "$B/scalebench" "$C/scalebench.c" -ldl || exit 1
gcc -shared -fPIC -O2 -Wall -Werror -o "$B/libscalefake.so" "$C/scalefake.c" -ldl || exit 1
gcc -shared -fPIC -O2 "-Wl,--version-script=$C/fakeverbs.map" -Wl,-soname,libibverbs.so.1 \
  -o "$B/libibverbs.so.1" "$C/fakeverbs.c" -ldl -lpthread || exit 1
gcc -O2 -o "$B/spawnbench" "$C/spawnbench.c" || exit 1
gcc -shared -fPIC -O2 -o "$B/libminimal.so" "$C/minimal_preload.c" -ldl || exit 1
: >"$B/dev/nvidiactl"; : >"$B/dev/nvidia-uvm"; : >"$B/dev/nvidia0"
echo "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  580.159.04  Release Build" >"$B/dev/version"

run() { # run WITH_SHIM ARGS...
  local pre="$B/libscalefake.so"
  [ "$1" = 1 ] && pre="$KNOBS:$B/libscalefake.so"
  shift
  (cd "$B" && LD_LIBRARY_PATH="$B" LD_PRELOAD="$pre" GDRSHIM_TEST_DEV_DIR="$B/dev" GDRSHIM_MODE=register \
    GDRSHIM_ROUTE=nv503c GDRSHIM_LOG_LEVEL=warn ./scalebench "$@")
}
{
  echo "# $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-)"
  echo "# scalebench ops $SAMPLES 1000 10000 100000 1000000, with then without the shim"
} >"$OUT/scale-raw.txt"
{
  run 1 ops "$SAMPLES" 1000 10000 100000 1000000 2>"$OUT/scale-with.err" | sed 's/^/with /'
  run 0 ops "$SAMPLES" 1000 10000 100000 1000000 2>/dev/null | sed 's/^/without /'
  run 1 heap 1000 10000 100000 1000000 2>/dev/null | sed 's/^/with /'
  run 0 heap 1000 10000 100000 1000000 2>/dev/null | sed 's/^/without /'
  grep '^gdrshim: summary' "$OUT/scale-with.err" | tail -1
} >>"$OUT/scale-raw.txt"
grep -q '^gdrshim: summary' "$OUT/scale-with.err" || { echo "run-h200-scale: the shim did not run (no summary)" >&2; exit 1; }
# the dev VM's tables: added = with - without, per (N, op); heap = with - without, per allocation
awk '
  $2 == "scale" && $4 ~ /^op=/ {
    split($3, n, "="); split($4, o, "="); split($5, a, "="); split($6, b, "=")
    k = n[2] " | " o[2]; p50[$1, k] = a[2] + 0; p99[$1, k] = b[2] + 0; keys[k] = 1
  }
  $2 == "scale" && $4 ~ /^heap=/ { split($3, n, "="); split($4, h, "="); heap[$1, n[2]] = h[2] + 0; ns[n[2]] = 1 }
  END {
    for (k in keys) printf "O| %s | %d / %d | %d / %d | %d / %d |\n", k, p50["without", k], p99["without", k], p50["with", k], p99["with", k], p50["with", k] - p50["without", k], p99["with", k] - p99["without", k]
    for (m in ns) printf "H| %d | %.1f |\n", m, (heap["with", m] - heap["without", m]) / m
  }' "$OUT/scale-raw.txt" >"$B/rows"
{
  echo "| live allocations | operation | without p50 / p99 (ns) | with p50 / p99 (ns) | added p50 / p99 (ns) |"
  echo "|---:|---|---:|---:|---:|"
  sed -n 's/^O|/|/p' "$B/rows" | sort -t'|' -k2,2n -k3,3
  echo
  echo "| live allocations | shim heap per live allocation (bytes) |"
  echo "|---:|---:|"
  sed -n 's/^H|/|/p' "$B/rows" | sort -t'|' -k2,2n
} >"$OUT/scale.md"
FLOOR=$(readlink -f target/floor/libfloor.so)
CORE=$(readlink -f target/release/libgdrshim.so)
if [ -f "$FLOOR" ]; then
  echo "gdrshim = $SHIM" >"$OUT/startup.txt"
  "$B/spawnbench" 200 /bin/true "$B/libminimal.so" "$SHIM" "$FLOOR" 100 >>"$OUT/startup.txt"
  if [ "$SHIM" != "$CORE" ]; then
    # through the front (tests/gpu/front-pair.sh): the core preloaded itself too, in the same call
    echo "gdrshim = $CORE (the core preloaded itself)" >>"$OUT/startup.txt"
    "$B/spawnbench" 200 /bin/true "$B/libminimal.so" "$CORE" "$FLOOR" 100 >>"$OUT/startup.txt"
  fi
else
  echo "no target/floor/libfloor.so: start-up without the Rust floor" >"$OUT/startup.txt"
  "$B/spawnbench" 2000 /bin/true "$B/libminimal.so" "$SHIM" >>"$OUT/startup.txt"
fi
cat "$OUT/scale.md" "$OUT/startup.txt"
