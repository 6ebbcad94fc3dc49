#!/usr/bin/env bash
# Prints the `export` lines that make the GPU-machine scripts preload the front (src/front) with
# the core beside it, as a release ships them, instead of the core itself:
#   eval "$(bash tests/gpu/front-pair.sh)"; bash tests/gpu/run-h200-all.sh OUT
# Artifacts built elsewhere (no cargo here): target/front/release/libgdrshim_front.so,
# target/knobs-front/release/libgdrshim_front.so (cargo build --release --manifest-path
# src/front/Cargo.toml [--features knobs], in those target folders) and the two cores.
set -eu
P=/tmp/gdrshim-pair
rm -rf "$P"; mkdir -p "$P/release" "$P/knobs"
for kind in release knobs; do
  front=target/front/release/libgdrshim_front.so core=target/release/libgdrshim.so
  [ "$kind" = release ] || { front=target/knobs-front/release/libgdrshim_front.so core=target/knobs/release/libgdrshim.so; }
  if [ ! -f "$front" ] || [ ! -f "$core" ]; then echo "front-pair: carry $front and $core" >&2; exit 1; fi
  cp "$front" "$P/$kind/libgdrshim.so"
  cp "$core" "$P/$kind/libgdrshim-core.so"
done
echo "export GDRSHIM_H200_SHIM=$P/release/libgdrshim.so GDRSHIM_H200_KNOBS=$P/knobs/libgdrshim.so"
