#!/usr/bin/env bash
# Gated, atomic deployment of a gdrshim release (dist/ from the source tree's build-release.sh).
#
#   scripts/deploy.sh [--prefix DIR] DIST_DIR     verify DIST_DIR, install it, switch to it
#   scripts/deploy.sh [--prefix DIR] --rollback   switch back to the previous release
#   scripts/deploy.sh [--prefix DIR] --status     show the current and previous releases
#   scripts/deploy.sh [--prefix DIR] --list       every release under PREFIX: current, previous,
#                                                 and what deploy.sh did not install
#   scripts/deploy.sh [--prefix DIR] --prune      remove the releases deploy.sh installed, but
#                                                 not current and previous
#   scripts/deploy.sh [--prefix DIR] --uninstall  remove current, previous and every release
#                                                 deploy.sh installed
#   --cdi-dir DIR  where the Container Device Interface spec goes (default /etc/cdi;
#                  GDR_DEPLOY_CDI_DIR, tests only, changes the default)
#   --version  gdrshim's version;  -h, --help  this text.  One action at a time.
#
# NCCL's flush: where the release's `gdrshim-tool gpu-facts` finds a GPU of sm_90 or later whose
# libcuda answers GPU_DIRECT_RDMA_WRITES_ORDERING below OWNER, an install adds the line
# NCCL_NET_FORCE_FLUSH=1 to /etc/nccl.conf, after a comment "# added by gdrshim VERSION: ..."
# that marks it (docs/nccl-flush.md); every line already there stays, a file that sets
# NCCL_NET_FORCE_FLUSH itself is left alone, and nothing is written where the facts cannot be
# read. --uninstall removes that pair, and only it, once no release is current
# (GDR_DEPLOY_NCCL_CONF, tests only, names another file).
#
# Default prefix /opt/rtx4090-gdr. Layout: PREFIX/releases/<version>-<manifest hash>/ (never
# changed once installed), PREFIX/current and PREFIX/previous (symbolic links, each switched by
# one rename). Nothing is installed unless `sha256sum -c --strict` passes in DIST_DIR and DIST_DIR
# holds exactly the files its SHA256SUMS lists; on any refusal PREFIX is left exactly as it was.
# It writes under PREFIX, the NCCL line above and, for containers, CDI_DIR/gdrshim.json only (the release's
# `gdrshim-tool cdi`: the RDMA NICs and the release for --device gdrshim/rdma=all; written again
# whenever current changes, removed with --uninstall): the system's libnccl.so.2 is never
# touched, and a process that has the old release loaded keeps its copy (no file is overwritten
# in place). --prune and
# --uninstall remove only what deploy.sh installed: a release folder named <version>-<the first
# 12 hex digits of the sha256 of its SHA256SUMS>, holding exactly the files that SHA256SUMS lists,
# all of them intact, owned by no package (dpkg -S: the .deb's releases are dpkg's) and mapped by no
# running process; current and previous go only with the release they point to. Anything else
# under PREFIX stays, and they say so.
# Exit status: 0 done; 1 refused or failed (PREFIX as it was); 2 bad arguments.
set -euo pipefail
prefix=/opt/rtx4090-gdr
cdi_dir="${GDR_DEPLOY_CDI_DIR:-/etc/cdi}"
action="" dist=""
die() { echo "deploy: $*" >&2; exit 1; }
usage() { sed -n '2,39s/^# \{0,1\}//p' "$0"; }
bad_usage() { echo "deploy: $* (try --help)" >&2; exit 2; }
set_action() {
  [ -z "$action" ] || [ "$action" = "$1" ] || bad_usage "$2 and ${action_flag} together are ambiguous: one action at a time"
  action="$1" action_flag="$2"
}
action_flag=""
while [ $# -gt 0 ]; do
  case "$1" in
    --prefix) { [ $# -ge 2 ] && [ -n "$2" ]; } || bad_usage "--prefix needs a folder"; prefix="$2"; shift ;;
    --prefix=*) prefix="${1#--prefix=}"; [ -n "$prefix" ] || bad_usage "--prefix needs a folder" ;;
    --cdi-dir) { [ $# -ge 2 ] && [ -n "$2" ]; } || bad_usage "--cdi-dir needs a folder"; cdi_dir="$2"; shift ;;
    --rollback) set_action rollback "$1" ;;
    --status) set_action status "$1" ;;
    --list) set_action list "$1" ;;
    --prune) set_action prune "$1" ;;
    --uninstall) set_action uninstall "$1" ;;
    -h|--help) usage; exit 0 ;;
    --version)
      # shellcheck source=scripts/gdrshim-version.sh
      source "$(dirname "${BASH_SOURCE[0]}")/gdrshim-version.sh"
      gdrshim_version deploy.sh
      exit 0
      ;;
    --)
      shift
      for a in "$@"; do
        [ -z "$dist" ] || bad_usage "two release folders: $dist and $a (one at a time)"
        dist="$a"
        set_action install "$a"
      done
      break ;;
    -*) bad_usage "unknown option $1" ;;
    *)
      [ -z "$dist" ] || bad_usage "two release folders: $dist and $1 (one at a time)"
      dist="$1"
      set_action install "$1" ;;
  esac
  shift
done
[ -n "$action" ] || bad_usage "nothing to do: give a release folder or an action"
case "$(realpath -m "$prefix")" in
  /|/usr|/usr/lib|/usr/local|/lib|/lib64|/usr/lib/x86_64-linux-gnu|/etc|/bin|/sbin) die "refusing prefix $prefix: a system folder" ;;
esac

# shellcheck source=scripts/nccl-conf.sh
source "$(dirname "${BASH_SOURCE[0]}")/nccl-conf.sh"

switch_link() { # name target: PREFIX/name -> target, by one rename
  ln -sfn "$2" "$prefix/.$1.new"
  mv -T "$prefix/.$1.new" "$prefix/$1"
}

# The CDI spec of what current names, by that release's own tool; one a release of ours wrote
# before and that cannot be written now is removed (it would mount a release that is not current).
cdi_spec() {
  local spec="$cdi_dir/gdrshim.json" rel out
  rel="$(cd "$prefix/current" && pwd -P)"
  if mkdir -p "$cdi_dir" 2>/dev/null && out="$("$rel/bin/gdrshim-tool" cdi --release "$rel" --out "$spec" 2>&1)"; then
    echo "deploy: $spec written for containers ($(grep -o 'RDMA NIC[^:]*' <<<"$out" | head -n1 || true)): --device gdrshim/rdma=all"
  else
    echo "deploy: note: no CDI spec written: $(tail -n1 <<<"$out")"
    cdi_unspec
  fi
}
cdi_unspec() { # removes CDI_DIR/gdrshim.json where it mounts a release under this prefix
  local spec="$cdi_dir/gdrshim.json"
  if [ -f "$spec" ] && grep -qF "\"hostPath\": \"$(cd "$prefix" 2>/dev/null && pwd -P)/releases/" "$spec"; then
    rm -f "$spec" && echo "deploy: removed $spec"
  fi
}

if [ "$action" = status ]; then
  for l in current previous; do
    if [ -L "$prefix/$l" ]; then echo "$l: $(readlink "$prefix/$l")"; else echo "$l: none"; fi
  done
  exit 0
fi

# Is PREFIX/releases/$1 a release deploy.sh installed (see the header)? If not, prints why.
ours() {
  local d="$prefix/releases/$1" v h sums listed present
  if ! [[ "$1" =~ ^([0-9A-Za-z.+-]+)-([0-9a-f]{12})$ ]]; then echo "not named <version>-<manifest hash>"; return 1; fi
  v="${BASH_REMATCH[1]}" h="${BASH_REMATCH[2]}"
  if [ -L "$d" ] || [ ! -d "$d" ]; then echo "not a folder"; return 1; fi
  if [ ! -f "$d/SHA256SUMS" ] || [ -L "$d/SHA256SUMS" ]; then echo "no SHA256SUMS"; return 1; fi
  sums="$(sha256sum <"$d/SHA256SUMS")"
  if [ "${sums:0:12}" != "$h" ]; then echo "its SHA256SUMS is not the one its name was made from"; return 1; fi
  if [ "$(sed -n '1s/^gdrshim //p' "$d/BUILD-INFO" 2>/dev/null)" != "$v" ]; then echo "its BUILD-INFO does not name version $v"; return 1; fi
  listed="$(sed -E 's/^[0-9a-f]{64}  //' "$d/SHA256SUMS" | LC_ALL=C sort)"
  present="$(cd "$d" && find . ! -type d ! -path ./SHA256SUMS -printf '%P\n' | LC_ALL=C sort)"
  if [ "$listed" != "$present" ] || [ -n "$(find "$d" -mindepth 1 -type d -empty -print -quit)" ]; then
    echo "it holds files its SHA256SUMS does not list, or lacks some"
    return 1
  fi
  if ! (cd "$d" && sha256sum -c --strict --quiet SHA256SUMS >/dev/null 2>&1); then echo "its files do not match its SHA256SUMS (changed since)"; return 1; fi
  # the same layout from the .deb (scripts/dev/build-deb.sh) is dpkg's to remove, not ours
  if command -v dpkg-query >/dev/null 2>&1; then
    local p o
    for p in "$(realpath -ms -- "$d")" "$(cd "$d" && pwd -P)"; do
      if o="$(dpkg-query -S -- "$p/SHA256SUMS" 2>/dev/null)"; then
        echo "installed by the package ${o%%:*}: apt or dpkg removes it"
        return 1
      fi
    done
  fi
  return 0
}

# Prints the pids of processes that have a file of folder $1 mapped (the shim loaded from it).
users() {
  local real m
  real="$(cd "$1" && pwd -P)/"
  for m in /proc/[0-9]*/maps; do
    if grep -qF -- "$real" "$m" 2>/dev/null; then m="${m#/proc/}"; printf '%s ' "${m%/maps}"; fi
  done
}

# Every entry of PREFIX/releases, one a line (names starting with a dot too).
entries() {
  [ -d "$prefix/releases" ] || return 0
  find "$prefix/releases" -mindepth 1 -maxdepth 1 -printf '%f\n' | LC_ALL=C sort
}

# Where link $1 points, as "releases/<name>" whenever it resolves into this prefix's releases
# folder (a link written absolute, or by another tool, names the same release); else as written.
link_of() {
  [ -L "$prefix/$1" ] || return 0
  local r base
  r="$(realpath -m -- "$prefix/$1")" base="$(realpath -m -- "$prefix/releases")"
  if [ "$(dirname -- "$r")" = "$base" ]; then echo "releases/$(basename -- "$r")"; else readlink "$prefix/$1"; fi
}

if [ "$action" = list ]; then
  cur="$(link_of current)" prev="$(link_of previous)"
  if [ -z "$(entries)" ]; then
    echo "no releases under $prefix"
    exit 0
  fi
  echo "releases under $prefix/releases:"
  while IFS= read -r n; do
    why=""
    if [ "releases/$n" = "$cur" ]; then tag=current
    elif [ "releases/$n" = "$prev" ]; then tag=previous
    elif why="$(ours "$n")"; then tag=""
    else tag="not installed by deploy.sh ($why): --prune and --uninstall leave it"
    fi
    printf '  %-28s %s\n' "$n" "$tag"
  done < <(entries)
  for l in current previous; do
    t="$(link_of "$l")"
    if [ -n "$t" ] && [ ! -d "$prefix/$t" ]; then echo "  $l -> $t: missing"; fi
  done
  exit 0
fi

if [ "$action" = prune ] || [ "$action" = uninstall ]; then
  if [ "$(id -u)" != 0 ]; then
    echo "deploy: note: not root: a release another user's process has mapped cannot be seen here (run it with sudo)"
  fi
  cur="$(link_of current)" prev="$(link_of previous)"
  remove=() kept=()
  while IFS= read -r n; do
    if [ "$action" = prune ] && { [ "releases/$n" = "$cur" ] || [ "releases/$n" = "$prev" ]; }; then
      continue
    fi
    # what a removal cut short left: a release of ours renamed out of the way, to finish
    if [[ "$n" == .removing.* ]] && [ -d "$prefix/releases/$n" ] && [ ! -L "$prefix/releases/$n" ] && [ -z "$(users "$prefix/releases/$n")" ]; then
      rm -rf -- "${prefix:?}/releases/$n"
      echo "deploy: finished removing releases/${n#.removing.} (an earlier removal was cut short)"
      continue
    fi
    if ! why="$(ours "$n")"; then
      kept+=("releases/$n: not installed by deploy.sh ($why)")
      continue
    fi
    pids="$(users "$prefix/releases/$n")"
    if [ -n "$pids" ]; then
      [ "$action" = prune ] || die "refused: releases/$n is in use by pid ${pids% }: stop those processes first; nothing removed"
      kept+=("releases/$n: in use by pid ${pids% }")
      continue
    fi
    remove+=("$n")
  done < <(entries)
  if [ "$action" = uninstall ]; then
    # a link goes with the release it points to; one to anything else stays
    for l in current previous; do
      t="$(link_of "$l")"
      if [ -n "$t" ] && [[ " ${remove[*]} " == *" ${t#releases/} "* ]] && [ "releases/${t#releases/}" = "$t" ]; then
        rm -f "$prefix/$l"
        echo "deploy: removed $l -> $t"
      elif [ -e "$prefix/$l" ] || [ -L "$prefix/$l" ]; then
        kept+=("$l${t:+ -> $t}: not a release deploy.sh removes")
      fi
    done
  fi
  for n in "${remove[@]}"; do
    # out of the way by one rename first: a removal cut short leaves no half release under its name
    gone="$prefix/releases/.removing.$n"
    mv -T "$prefix/releases/$n" "$gone"
    rm -rf -- "$gone"
    echo "deploy: removed releases/$n"
  done
  [ ${#remove[@]} -gt 0 ] || echo "deploy: no release to remove"
  if [ "$action" = uninstall ]; then
    if [ ! -e "$prefix/current" ]; then
      cdi_unspec
      nccl_conf_remove | sed 's/^gdrshim: /deploy: /'
    fi
    rmdir "$prefix/releases" 2>/dev/null || true
    rmdir "$prefix" 2>/dev/null || true
  fi
  for k in "${kept[@]}"; do echo "deploy: left in place: $k"; done
  if [ "$action" = uninstall ] && [ -d "$prefix" ]; then echo "deploy: $prefix stays: it holds what deploy.sh did not install"; fi
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
  cdi_spec
  exit 0
fi

# ---- install: every check before anything is written --------------------------------------
[ -n "$dist" ] || bad_usage "name a release folder (deploy.sh DIST) or an action"
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
for f in lib/libgdrshim.so lib/libgdrshim-core.so bin/gdrshim-tool scripts/gdr-env.sh BUILD-INFO; do
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
  cdi_spec
  nccl_conf_add "$prefix/current/bin/gdrshim-tool" "$version" | sed 's/^gdrshim: /deploy: /'
  exit 0
fi
switch_link current "releases/$name"
if [ -n "$cur" ]; then switch_link previous "$cur"; fi
echo "deploy: current -> releases/$name${cur:+ (previous -> $cur, for --rollback)}"
cdi_spec
nccl_conf_add "$prefix/current/bin/gdrshim-tool" "$version" | sed 's/^gdrshim: /deploy: /'
echo "use it with: source $prefix/current/scripts/gdr-env.sh --prefix $prefix/current [options]"
