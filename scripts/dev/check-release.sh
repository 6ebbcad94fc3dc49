#!/usr/bin/env bash
# The release is reproducible and is what SHA256SUMS says: builds it twice, from two copies of
# this tree in different folders with different cargo homes, and compares both manifests with
# each other and with the repository's SHA256SUMS. Used by scripts/dev/test.sh.
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
home_a="${CARGO_HOME:-$HOME/.cargo}"
home_b="$work/cargo-home-b"
mkdir -p "$home_b"
# the second cargo home gets the downloaded crates, not the first one's paths
[ ! -d "$home_a/registry" ] || cp -r "$home_a/registry" "$home_b/"
tree_a="$work/a"
tree_b="$work/b/deeper/still"
for t in "$tree_a" "$tree_b"; do
  mkdir -p "$t"
  git -C "$src" ls-files -z | (cd "$src" && xargs -0 cp --parents -t "$t")
done
(cd "$tree_a" && CARGO_HOME="$home_a" bash scripts/dev/build-release.sh --out "$work/dist-a" >/dev/null)
(cd "$tree_b" && CARGO_HOME="$home_b" CARGO_NET_OFFLINE=true bash scripts/dev/build-release.sh --out "$work/dist-b" >/dev/null)
if ! diff -u "$work/dist-a/SHA256SUMS" "$work/dist-b/SHA256SUMS"; then
  echo "check-release: two builds of one tree differ: the release is not reproducible" >&2
  exit 1
fi
echo "check-release: two builds ($tree_a, $tree_b; two cargo homes) are identical: $(wc -l <"$work/dist-a/SHA256SUMS") files"
if ! diff -u "$src/SHA256SUMS" "$work/dist-a/SHA256SUMS"; then
  echo "check-release: SHA256SUMS is not the manifest of this tree's release; run scripts/dev/build-release.sh --update-manifest and commit it" >&2
  exit 1
fi
echo "check-release: SHA256SUMS matches"
