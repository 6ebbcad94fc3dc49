#!/usr/bin/env bash
# The release is reproducible and is what SHA256SUMS says: builds it twice, in this checkout and
# from a copy elsewhere with another cargo home, with its .deb each time (build-deb.sh), compares
# the two manifests and the two .debs byte for byte, then the manifest with the repository's
# SHA256SUMS. Used by scripts/dev/test.sh (CI).
#
#   scripts/dev/check-release.sh [-h|--help] [--version]
#
# The repository's SHA256SUMS is the manifest of the toolchain the README records
# ("`rustc -V` of the builds recorded here: `rustc …`"). With another toolchain the check says so
# first, and then only the two builds of this toolchain are compared with each other.
# Exit status: 0 reproducible (and the manifest matches, with the recorded toolchain); 1 not; 2 usage.
set -euo pipefail
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
case "${1:-}" in
  -h|--help) sed -n '2,12s/^# \{0,1\}//p' "$0"; exit 0 ;;
  --version)
    # shellcheck source=scripts/gdrshim-version.sh
    source "$src/scripts/gdrshim-version.sh"
    gdrshim_version check-release.sh
    exit 0
    ;;
  "") ;;
  *) echo "check-release: unknown argument $1 (try --help)" >&2; exit 2 ;;
esac
# shellcheck disable=SC2016 # the backquotes are the README's, not a command
recorded="$(sed -n 's/.*`rustc -V` of the builds recorded here: `\(rustc [^`]*\)`.*/\1/p' "$src/README.md" | head -n1)"
have="$(rustc -V)"
same_toolchain=1
if [ -n "$recorded" ] && [ "$have" != "$recorded" ]; then
  same_toolchain=0
  echo "check-release: NOTE: this toolchain is $have; SHA256SUMS is the manifest of $recorded (README)."
  echo "check-release: two builds with this toolchain are compared with each other; the manifest is not (a release built with another rustc has other bytes)."
fi
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
home_a="${CARGO_HOME:-$HOME/.cargo}"
home_b="$work/cargo-home-b"
mkdir -p "$home_b"
# the second cargo home gets the downloaded crates, not the first one's paths
[ ! -d "$home_a/registry" ] || cp -r "$home_a/registry" "$home_b/"
# the first build in the checkout itself (its target/, built already where the suite ran: it builds
# with the release's flags), the second from a copy at a deeper path, cold, with the other cargo home
tree_a="$src"
tree_b="$work/b/deeper/still"
mkdir -p "$tree_b"
git -C "$src" ls-files -z | (cd "$src" && xargs -0 cp --parents -t "$tree_b")
t0=$SECONDS
# progress: one line per build (each about a minute from cold); cargo's lines stay out of the way
step() { echo "check-release: $1 ($((SECONDS - t0)) s so far)"; }
step "build 1 of 2, in this checkout ($tree_a)"
(cd "$tree_a" && CARGO_HOME="$home_a" bash scripts/dev/build-release.sh --out "$work/dist-a" >/dev/null 2>"$work/build-a.log") ||
  { cat "$work/build-a.log" >&2; exit 1; }
step "build 2 of 2, in $tree_b, another cargo home"
(cd "$tree_b" && CARGO_HOME="$home_b" CARGO_NET_OFFLINE=true bash scripts/dev/build-release.sh --out "$work/dist-b" >/dev/null 2>"$work/build-b.log") ||
  { cat "$work/build-b.log" >&2; exit 1; }
if ! diff -u "$work/dist-a/SHA256SUMS" "$work/dist-b/SHA256SUMS"; then
  echo "check-release: two builds of one tree differ: the release is not reproducible" >&2
  exit 1
fi
echo "check-release: two builds ($tree_a, $tree_b; two cargo homes) are identical: $(wc -l <"$work/dist-a/SHA256SUMS") files"
# the .deb of each build, each by its own tree's script, at a different time of day
step "the .deb of each build"
(cd "$tree_a" && bash scripts/dev/build-deb.sh --dist "$work/dist-a" --out "$work/deb-a" >/dev/null)
sleep 1
(cd "$tree_b" && bash scripts/dev/build-deb.sh --dist "$work/dist-b" --out "$work/deb-b" >/dev/null)
deb_a="$(find "$work/deb-a" -name '*.deb')"
deb_b="$(find "$work/deb-b" -name '*.deb')"
if ! cmp "$deb_a" "$deb_b"; then
  echo "check-release: the two .debs of one release differ: the package is not reproducible" >&2
  exit 1
fi
echo "check-release: the two .debs are identical: $(basename "$deb_a") sha256 $(sha256sum "$deb_a" | cut -c1-64)"
if [ "$same_toolchain" = 0 ]; then
  echo "check-release: SHA256SUMS not compared (another toolchain, see the NOTE above)"
  exit 0
fi
if ! diff -u "$src/SHA256SUMS" "$work/dist-a/SHA256SUMS"; then
  echo "check-release: SHA256SUMS is not the manifest of this tree's release (built with the recorded $have):" >&2
  echo "  a change to the library, the tools, a shipped script, a patch, the release README or a licence" >&2
  echo "  updates it in the same commit: scripts/dev/build-release.sh --update-manifest, and commit SHA256SUMS" >&2
  exit 1
fi
echo "check-release: SHA256SUMS matches"
