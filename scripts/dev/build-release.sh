#!/usr/bin/env bash
# Reproducible release: builds with --locked, a fixed SOURCE_DATE_EPOCH (Cargo.toml's) and the
# source tree and cargo home remapped out of the binaries, then lays out the release folder:
#   lib/libgdrshim.so (the front: src/front)  lib/libgdrshim-core.so (the rest, which the front
#   loads when a process first touches a GPU)  bin/gdrshim-tool  bin/gdrshim-replay  include/gdrshim.h
#   nccl-patches/  scripts/ (every file directly in scripts/; scripts/dev/ does not ship)
#   README.md  CHANGELOG.md  LICENSE-MIT  LICENSE-APACHE  BUILD-INFO  SHA256SUMS (sha256sum format, sorted)
# Two builds of one commit, from any directories and cargo homes, give the same SHA256SUMS; the
# repository's top-level SHA256SUMS is that manifest.
#
#   scripts/dev/build-release.sh [--out DIR] [--deb] [--check-manifest] [--update-manifest]
#     --out DIR            the release folder (default: dist/ of the source tree). One that exists must be
#                          empty or a release this script built (nothing but the files its
#                          SHA256SUMS lists); anything else is refused and left untouched
#     --deb                also build the .deb of the release (scripts/dev/build-deb.sh) into
#                          target/deb/ of the source tree
#     --check-manifest     fail if DIR/SHA256SUMS differs from the repository's SHA256SUMS
#     --update-manifest    copy DIR/SHA256SUMS to the repository's SHA256SUMS
#     -h, --help           this text;  --version  the version being released
# Exit status: 0 built; 1 the build, a check or the manifest failed, or DIR was refused; 2 usage.
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
usage() { sed -n '2,20s/^# \{0,1\}//p' "$0"; }
version() { sed -n 's/^version = "\(.*\)"/\1/p' "$src/Cargo.toml" | head -n1; }
bad_usage() { echo "build-release: $1 (try --help)" >&2; exit 2; }
out="$src/dist"
check=0 update=0 deb=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out)
      if [ $# -lt 2 ] || [ -z "$2" ]; then bad_usage "--out needs a folder"; fi
      out="$2"; shift ;;
    --out=*) out="${1#--out=}"; [ -n "$out" ] || bad_usage "--out needs a folder" ;;
    --deb) deb=1 ;;
    --check-manifest) check=1 ;;
    --update-manifest) update=1 ;;
    -h|--help) usage; exit 0 ;;
    --version) echo "build-release.sh (gdrshim) $(version)"; exit 0 ;;
    *) bad_usage "unknown argument $1" ;;
  esac
  shift
done
out="$(realpath -m -- "$out")"

# Whether $1 is a release folder this script built, intact: SHA256SUMS and BUILD-INFO of gdrshim;
# only regular files and folders (no link anywhere); every listed path relative and without "..";
# every listed file as listed (sha256sum -c); nothing that SHA256SUMS does not list or that is not
# a folder of a file it lists. Anything else is not ours to delete.
ours() {
  local d=$1 listed present
  [ -f "$d/SHA256SUMS" ] && [ ! -L "$d/SHA256SUMS" ] && [ -f "$d/BUILD-INFO" ] && head -n1 "$d/BUILD-INFO" | grep -q '^gdrshim ' || return 1
  [ -z "$(find "$d" -mindepth 1 ! -type f ! -type d -print -quit)" ] || return 1
  ! sed -E 's/^[0-9a-f]{64}  //' "$d/SHA256SUMS" | grep -qE '^/|(^|/)\.\.(/|$)' || return 1
  (cd "$d" && sha256sum -c --strict --quiet SHA256SUMS >/dev/null 2>&1) || return 1
  listed="$(sed -E 's/^[0-9a-f]{64}  //' "$d/SHA256SUMS" | awk -F/ '{ print; p = $1; for (i = 2; i <= NF; i++) { print p; p = p "/" $i } }' | LC_ALL=C sort -u)"
  present="$(cd "$d" && find . -mindepth 1 ! -path ./SHA256SUMS -printf '%P\n' | LC_ALL=C sort)"
  [ -z "$(comm -13 <(printf '%s\n' "$listed") <(printf '%s\n' "$present"))" ]
}
# Refuses an --out that is not ours to replace (before the build, and again before the swap).
check_out() {
  if [ -L "$out" ] || { [ -e "$out" ] && [ ! -d "$out" ]; }; then
    echo "build-release: $out exists and is not a folder: refused, nothing written" >&2; exit 1
  fi
  if [ -d "$out" ] && [ -n "$(ls -A "$out")" ] && ! ours "$out"; then
    echo "build-release: $out is not empty and not a release this script built (files its SHA256SUMS does not list, or no SHA256SUMS): refused, left untouched; name a new or empty folder" >&2
    exit 1
  fi
}
check_out

cd "$src"
epoch="$(sed -n 's/^source-date-epoch = \([0-9]*\)$/\1/p' Cargo.toml)"
[ -n "$epoch" ] || { echo "build-release: no source-date-epoch in Cargo.toml" >&2; exit 1; }
export SOURCE_DATE_EPOCH="$epoch"
# shellcheck source=scripts/dev/release-env.sh
source "$src/scripts/dev/release-env.sh"
release_env "$src"
# The tree's own target folder: after scripts/dev/test.sh (which builds with these flags) the
# release is built already. A plain `cargo build --release` between two runs of this script builds
# without them, and the next run builds again.
target="$src/target"
export CARGO_TARGET_DIR="$target"
t0=$SECONDS
# cargo's own lines are the progress (about 30 s from cold); a failure is this script's exit 1
build() {
  local what=$1 rc=0
  shift
  echo "build-release: building $what" >&2
  "$@" || rc=$?
  if [ "$rc" != 0 ]; then
    echo "build-release: building $what failed (cargo exited $rc; its messages are above): nothing written" >&2
    exit 1
  fi
}
build "the library and the tools" cargo build --release --locked --workspace --lib --bins
# the front is a cargo workspace of its own (src/front/Cargo.toml says why)
front_target="$src/target/front"
build "the front library" env CARGO_TARGET_DIR="$front_target" cargo build --release --locked --manifest-path src/front/Cargo.toml
echo "build-release: built in $((SECONDS - t0)) s; laying out the release" >&2

# glibc: nothing newer than Ubuntu 22.04's 2.35
for f in "$target/release/libgdrshim.so" "$front_target/release/libgdrshim_front.so" "$target/release/gdrshim-tool" "$target/release/gdrshim-replay"; do
  newest="$(objdump -T "$f" | grep -o 'GLIBC_[0-9][0-9.]*' | sed 's/GLIBC_//' | sort -uV | tail -n1)"
  if [ "$(printf '%s\n2.35\n' "$newest" | sort -V | tail -n1)" != "2.35" ]; then
    echo "build-release: $(basename "$f") needs GLIBC_$newest, newer than Ubuntu 22.04's 2.35" >&2
    exit 1
  fi
done

# Laid out in a fresh folder of its own next to --out, then moved into place: --out is never
# written into, and of an old release only the files its SHA256SUMS lists are removed.
mkdir -p "$(dirname "$out")"
new="$(mktemp -d "$(dirname "$out")/.$(basename "$out").new.XXXXXX")"
trap 'rm -rf -- "$new"' EXIT
chmod 0755 "$new"
mkdir -p "$new/lib" "$new/bin" "$new/include" "$new/scripts"
install -m 0755 "$front_target/release/libgdrshim_front.so" "$new/lib/libgdrshim.so"
install -m 0755 "$target/release/libgdrshim.so" "$new/lib/libgdrshim-core.so"
install -m 0755 "$target/release/gdrshim-tool" "$new/bin/gdrshim-tool"
install -m 0755 "$target/release/gdrshim-replay" "$new/bin/gdrshim-replay"
install -m 0644 include/gdrshim.h "$new/include/gdrshim.h"
# what ships is what lies directly in scripts/ (developer tools are in scripts/dev/, GPU-machine ones in tests/gpu/)
find scripts -mindepth 1 -maxdepth 1 -type f -printf '%P\n' | LC_ALL=C sort | while IFS= read -r s; do
  install -m 0755 "scripts/$s" "$new/scripts/$s"
done
find nccl-patches -type f -print0 | while IFS= read -r -d '' f; do
  install -D -m 0644 "$f" "$new/$f"
done
install -m 0644 CHANGELOG.md LICENSE-MIT LICENSE-APACHE "$new/"
sed "s/@VERSION@/$(version)/g" docs/release-README.md >"$new/README.md"
chmod 0644 "$new/README.md"
{
  echo "gdrshim $(version)"
  echo "rustc: $(rustc -V)"
  echo "cargo: $(cargo -V)"
  echo "SOURCE_DATE_EPOCH: $epoch"
  echo "built with: cargo build --release --locked --workspace, and --manifest-path src/front/Cargo.toml; RUSTFLAGS remap the source tree and cargo home, --build-id=none"
} >"$new/BUILD-INFO"
chmod 0644 "$new/BUILD-INFO"
# every file the same time, so a tarball of the release is reproducible too
sums="$(cd "$new" && find . -type f -printf '%P\n' | LC_ALL=C sort | xargs -d '\n' sha256sum)"
printf '%s\n' "$sums" >"$new/SHA256SUMS"
chmod 0644 "$new/SHA256SUMS"
find "$new" -exec touch -h -d "@$epoch" {} +

check_out
if [ -d "$out" ]; then
  if [ -f "$out/SHA256SUMS" ]; then
    # an old release of this script: exactly its listed files, then the folders they leave empty
    (cd "$out" && sed -E 's/^[0-9a-f]{64}  //' SHA256SUMS | xargs -r -d '\n' rm -f -- && rm -f SHA256SUMS)
    find "$out" -mindepth 1 -depth -type d -empty -delete
  fi
  rmdir -- "$out" || { echo "build-release: $out is not empty after removing the old release: left as it is, the new one is in $new" >&2; trap - EXIT; exit 1; }
fi
mv -T -- "$new" "$out"
trap - EXIT
echo "build-release: $(wc -l <"$out/SHA256SUMS") files in $out, manifest $out/SHA256SUMS"
if [ "$update" = 1 ]; then
  cp "$out/SHA256SUMS" "$src/SHA256SUMS"
  echo "build-release: SHA256SUMS updated"
fi
if [ "$check" = 1 ]; then
  if ! diff -u "$src/SHA256SUMS" "$out/SHA256SUMS"; then
    echo "build-release: the repository's SHA256SUMS is not the manifest of this commit's release." >&2
    echo "  A change to the library, the tools, a shipped script, a patch, the README template or a licence" >&2
    echo "  must update it in the same commit: scripts/dev/build-release.sh --update-manifest" >&2
    echo "  (built with $(rustc -V); the manifest is of the toolchain in the repository's README)" >&2
    exit 1
  fi
  echo "build-release: SHA256SUMS matches this commit's release"
fi
if [ "$deb" = 1 ]; then
  bash "$src/scripts/dev/build-deb.sh" --dist "$out" --out "$src/target/deb"
fi
