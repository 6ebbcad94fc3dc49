#!/usr/bin/env bash
# Gated, atomic deployment of a gdrshim release (dist/ from the source tree's build-release.sh).
#
#   scripts/deploy.sh [--prefix DIR] DIST_DIR    verify DIST_DIR, install it, switch to it
#   scripts/deploy.sh [--prefix DIR] --rollback  switch back to the previous release
#   scripts/deploy.sh [--prefix DIR] --status    show the current and previous releases
#
# Default prefix /opt/rtx4090-gdr. Layout: PREFIX/releases/<version>-<manifest hash>/ (never
# changed once installed), PREFIX/current and PREFIX/previous (symbolic links, each switched by
# one rename). Nothing is installed unless `sha256sum -c --strict` passes in DIST_DIR and DIST_DIR
# holds exactly the files its SHA256SUMS lists; on any refusal PREFIX is left exactly as it was.
# It writes under PREFIX only: the system's libnccl.so.2 is never touched, and a process that has
# the old release loaded keeps its copy (no file is overwritten in place).
set -euo pipefail
prefix=/opt/rtx4090-gdr
action=install dist=""
die() { echo "deploy: $*" >&2; exit 1; }
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) prefix="${2:?--prefix needs a folder}"; shift ;;
    --rollback) action=rollback ;;
    --status) action=status ;;
    -h|--help) sed -n '2,14s/^# \{0,1\}//p' "$0"; exit 0 ;;
    -*) echo "deploy: unknown option $1" >&2; exit 2 ;;
    *) dist="$1" ;;
  esac
  shift
done
case "$(realpath -m "$prefix")" in
  /|/usr|/usr/lib|/usr/local|/lib|/lib64|/usr/lib/x86_64-linux-gnu|/etc|/bin|/sbin) die "refusing prefix $prefix: a system folder" ;;
esac

switch_link() { # name target: PREFIX/name -> target, by one rename
  ln -sfn "$2" "$prefix/.$1.new"
  mv -T "$prefix/.$1.new" "$prefix/$1"
}

if [ "$action" = status ]; then
  for l in current previous; do
    if [ -L "$prefix/$l" ]; then echo "$l: $(readlink "$prefix/$l")"; else echo "$l: none"; fi
  done
  exit 0
fi

if [ "$action" = rollback ]; then
  [ -L "$prefix/previous" ] || die "no previous release under $prefix to roll back to"
  prev="$(readlink "$prefix/previous")"
  [ -d "$prefix/$prev" ] || die "the previous release $prefix/$prev is gone"
  cur="$(readlink "$prefix/current" 2>/dev/null || true)"
  (cd "$prefix/$prev" && sha256sum -c --strict --quiet SHA256SUMS) || die "the previous release $prev fails its own SHA256SUMS: not switching"
  switch_link current "$prev"
  if [ -n "$cur" ]; then switch_link previous "$cur"; fi
  echo "deploy: rolled back: current -> $prev${cur:+ (previous -> $cur)}"
  exit 0
fi

# ---- install: every check before anything is written --------------------------------------
[ -n "$dist" ] || { sed -n '2,14s/^# \{0,1\}//p' "$0" >&2; exit 2; }
[ -d "$dist" ] || die "$dist is not a folder"
dist="$(cd "$dist" && pwd)"
[ -f "$dist/SHA256SUMS" ] || die "$dist has no SHA256SUMS: not a release folder"
if ! out="$(cd "$dist" && sha256sum -c --strict SHA256SUMS 2>&1)"; then
  echo "$out" | grep -v ': OK$' | sed 's/^/  /' >&2
  die "refused: $dist does not match its SHA256SUMS (changed, damaged or missing files); nothing installed"
fi
listed="$(sed -E 's/^[0-9a-f]{64}  //' "$dist/SHA256SUMS" | LC_ALL=C sort)"
present="$(cd "$dist" && find . \( -type f -o -type l \) ! -path ./SHA256SUMS -printf '%P\n' | LC_ALL=C sort)"
extra="$(comm -13 <(printf '%s\n' "$listed") <(printf '%s\n' "$present"))"
[ -z "$extra" ] || { while read -r f; do echo "  extra: $f"; done <<<"$extra" >&2; die "refused: $dist holds files its SHA256SUMS does not list; nothing installed"; }
for f in lib/libgdrshim.so bin/gdrshim-tool scripts/gdr-env.sh BUILD-INFO; do
  grep -qxF "$f" <<<"$listed" || die "refused: the release lacks $f"
done
version="$(head -n1 "$dist/BUILD-INFO" | awk '{print $2}')"
[[ "$version" =~ ^[0-9A-Za-z.+-]+$ ]] || die "refused: cannot read the version from BUILD-INFO"
name="$version-$(sha256sum "$dist/SHA256SUMS" | cut -c1-12)"

# ---- write: into a fresh folder, verified again, then renamed into place ---------------------
made_prefix=0; [ -d "$prefix" ] || made_prefix=1
made_releases=0; [ -d "$prefix/releases" ] || made_releases=1
tmp=""
cleanup() {
  [ -z "$tmp" ] || rm -rf "$tmp"
  if [ "$made_releases" = 1 ]; then rmdir "$prefix/releases" 2>/dev/null || true; fi
  if [ "$made_prefix" = 1 ]; then rmdir "$prefix" 2>/dev/null || true; fi
}
trap 'cleanup; echo "deploy: failed; $prefix left as it was" >&2' ERR
mkdir -p "$prefix/releases"
if [ -d "$prefix/releases/$name" ]; then
  (cd "$prefix/releases/$name" && sha256sum -c --strict --quiet SHA256SUMS) || { cleanup; die "$prefix/releases/$name exists but fails its SHA256SUMS: remove it by hand"; }
  echo "deploy: $name is already installed"
else
  tmp="$(mktemp -d "$prefix/releases/.incoming.XXXXXX")"
  cp -a "$dist/." "$tmp/"
  (cd "$tmp" && sha256sum -c --strict --quiet SHA256SUMS) || { cleanup; die "the copy under $prefix fails SHA256SUMS (disk full?); nothing switched"; }
  chmod 0755 "$tmp"
  mv -T "$tmp" "$prefix/releases/$name"
  tmp=""
fi
trap - ERR
cur="$(readlink "$prefix/current" 2>/dev/null || true)"
if [ "$cur" = "releases/$name" ]; then
  echo "deploy: current already is releases/$name"
  exit 0
fi
switch_link current "releases/$name"
if [ -n "$cur" ]; then switch_link previous "$cur"; fi
echo "deploy: current -> releases/$name${cur:+ (previous -> $cur, for --rollback)}"
echo "use it with: source $prefix/current/scripts/gdr-env.sh --prefix $prefix/current [options]"
