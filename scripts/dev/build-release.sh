#!/usr/bin/env bash
# Reproducible release: builds with --locked, a fixed SOURCE_DATE_EPOCH (Cargo.toml's) and
# the source tree and cargo home remapped out of the binaries, then lays out
#   dist/lib/libgdrshim.so  dist/bin/gdrshim-tool  dist/include/gdrshim.h
#   dist/nccl-patches/  dist/scripts/ (every file directly in scripts/; scripts/dev/ does not ship)
#   dist/BUILD-INFO  dist/SHA256SUMS (sha256sum format, sorted)
# Two builds of one commit, from any directories and cargo homes, give the same SHA256SUMS; the
# repository's top-level SHA256SUMS is that manifest.
#
#   scripts/dev/build-release.sh [--out DIR] [--check-manifest] [--update-manifest]
#     --out DIR            where dist/ goes (default: ./dist)
#     --check-manifest     fail if dist/SHA256SUMS differs from the repository's SHA256SUMS
#     --update-manifest    copy dist/SHA256SUMS to the repository's SHA256SUMS
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
out="$src/dist"
check=0 update=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out="$2"; shift ;;
    --check-manifest) check=1 ;;
    --update-manifest) update=1 ;;
    *) sed -n '2,14s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
  esac
  shift
done
cd "$src"
epoch="$(sed -n 's/^source-date-epoch = \([0-9]*\)$/\1/p' Cargo.toml)"
[ -n "$epoch" ] || { echo "build-release: no source-date-epoch in Cargo.toml" >&2; exit 1; }
export SOURCE_DATE_EPOCH="$epoch"
cargo_home="${CARGO_HOME:-$HOME/.cargo}"
target="$src/target/release-build"
# No build id and remapped paths: nothing of this machine or directory ends up in the binaries.
export RUSTFLAGS="--remap-path-prefix=$src=/gdrshim --remap-path-prefix=$cargo_home=/cargo -C link-arg=-Wl,--build-id=none"
export CARGO_TARGET_DIR="$target"
cargo build --release --locked --workspace --lib --bins -q

# glibc: nothing newer than Ubuntu 22.04's 2.35
for f in "$target/release/libgdrshim.so" "$target/release/gdrshim-tool"; do
  newest="$(objdump -T "$f" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)"
  if [ "$(printf '%s\n2.35\n' "$newest" | sort -V | tail -n1)" != "2.35" ]; then
    echo "build-release: $(basename "$f") needs GLIBC_$newest, newer than Ubuntu 22.04's 2.35" >&2
    exit 1
  fi
done

rm -rf "$out"
mkdir -p "$out/lib" "$out/bin" "$out/include" "$out/scripts"
install -m 0755 "$target/release/libgdrshim.so" "$out/lib/libgdrshim.so"
install -m 0755 "$target/release/gdrshim-tool" "$out/bin/gdrshim-tool"
install -m 0644 include/gdrshim.h "$out/include/gdrshim.h"
# what ships is what lies directly in scripts/ (developer tools are in scripts/dev/, GPU-machine ones in tests/gpu/)
find scripts -mindepth 1 -maxdepth 1 -type f -printf '%P\n' | LC_ALL=C sort | while IFS= read -r s; do
  install -m 0755 "scripts/$s" "$out/scripts/$s"
done
find nccl-patches -type f -print0 | while IFS= read -r -d '' f; do
  install -D -m 0644 "$f" "$out/$f"
done
{
  echo "gdrshim $(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
  echo "rustc: $(rustc -V)"
  echo "cargo: $(cargo -V)"
  echo "SOURCE_DATE_EPOCH: $epoch"
  echo "built with: cargo build --release --locked --workspace; RUSTFLAGS remap the source tree and cargo home, --build-id=none"
} >"$out/BUILD-INFO"
# every file the same mode and time, so a tarball of dist/ is reproducible too
find "$out" -exec touch -h -d "@$epoch" {} +
sums="$(cd "$out" && find . -type f -printf '%P\n' | LC_ALL=C sort | xargs -d '\n' sha256sum)"
printf '%s\n' "$sums" >"$out/SHA256SUMS"
touch -d "@$epoch" "$out/SHA256SUMS"
echo "build-release: $(wc -l <"$out/SHA256SUMS") files in $out, manifest $out/SHA256SUMS"
if [ "$update" = 1 ]; then
  cp "$out/SHA256SUMS" "$src/SHA256SUMS"
  echo "build-release: SHA256SUMS updated"
fi
if [ "$check" = 1 ]; then
  if ! diff -u "$src/SHA256SUMS" "$out/SHA256SUMS"; then
    echo "build-release: the repository's SHA256SUMS is not the manifest of this commit's release." >&2
    echo "  A change to the library, the tool, a shipped script or a patch must update it in the same commit:" >&2
    echo "  scripts/dev/build-release.sh --update-manifest" >&2
    exit 1
  fi
  echo "build-release: SHA256SUMS matches this commit's release"
fi
