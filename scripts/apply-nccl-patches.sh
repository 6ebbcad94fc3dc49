#!/usr/bin/env bash
# Applies gdrshim's NCCL patch series to a NCCL source tree, picked by the tree's own version
# (makefiles/version.mk). Checks before it writes: a tree that is already patched is left as it
# is (exit 0); an unknown version or a tree the series does not apply to cleanly is refused
# (exit 1) and left untouched.
#
#   scripts/apply-nccl-patches.sh [--check] [--patches DIR] NCCL_SOURCE_TREE
#
#   --check        say what would happen, change nothing
#   --patches DIR  the folder of series (default: nccl-patches/ next to this script's folder)
#   --version      gdrshim's version;  -h, --help  this text.
# Exit status: 0 patched (or already patched; --check: would be), 1 refused (tree untouched),
# 2 usage error.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
patches="$here/../nccl-patches"
check_only=0
tree=""
usage() { sed -n '2,14s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }
bad_usage() { echo "apply-nccl-patches: $1 (try --help)" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --check) check_only=1 ;;
    --patches) [ $# -ge 2 ] || bad_usage "--patches needs a folder"; patches="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    --version)
      # shellcheck source=scripts/gdrshim-version.sh
      source "$here/gdrshim-version.sh"
      gdrshim_version apply-nccl-patches.sh
      exit 0
      ;;
    -*) bad_usage "unknown option $1" ;;
    *) [ -z "$tree" ] || bad_usage "one source tree only"; tree="$1" ;;
  esac
  shift
done
[ -n "$tree" ] || bad_usage "name the NCCL source tree to patch: apply-nccl-patches.sh [--check] NCCL_SOURCE_TREE"
command -v git >/dev/null || { echo "apply-nccl-patches: needs git (git apply)" >&2; exit 2; }

mk="$tree/makefiles/version.mk"
if [ ! -f "$mk" ]; then
  echo "apply-nccl-patches: $tree is not a NCCL source tree (no makefiles/version.mk)" >&2
  exit 1
fi
field() { sed -n "s/^NCCL_$1[[:space:]]*:=[[:space:]]*\\([^[:space:]]*\\).*/\\1/p" "$mk" | head -n1; }
major="$(field MAJOR)"; minor="$(field MINOR)"; patch="$(field PATCH)"; suffix="$(field SUFFIX)"
if ! [[ "$major" =~ ^[0-9]+$ && "$minor" =~ ^[0-9]+$ && "$patch" =~ ^[0-9]+$ && "$suffix" =~ ^[A-Za-z0-9]*$ ]]; then
  echo "apply-nccl-patches: cannot read the NCCL version from $mk" >&2
  exit 1
fi
version="$major.$minor.$patch$suffix"
series="$patches/$version"
shopt -s nullglob
files=("$series"/*.patch)
if [ ! -d "$series" ] || [ ${#files[@]} -eq 0 ]; then
  known=()
  for d in "$patches"/*/; do
    ds=("$d"*.patch)
    [ ${#ds[@]} -eq 0 ] || known+=("$(basename "$d")")
  done
  list="$(IFS=,; echo "${known[*]:-}")"
  list="${list//,/, }"
  echo "apply-nccl-patches: NCCL $version has no gdrshim patch series (there are series for ${list:-no version}); tree left untouched" >&2
  exit 1
fi

tree_abs="$(cd "$tree" && pwd)"
# git must take paths relative to the NCCL tree, never to a repository the tree sits inside.
gitapply() { (cd "$tree_abs" && GIT_CEILING_DIRECTORIES="$(dirname "$tree_abs")" git apply "$@"); }
# "the patch" or "the N patches"
if [ ${#files[@]} -eq 1 ]; then count="the patch"; else count="the ${#files[@]} patches"; fi
reversed=()
for ((i = ${#files[@]} - 1; i >= 0; i--)); do reversed+=("${files[$i]}"); done

if gitapply --check "${files[@]}" 2>/dev/null; then
  if [ "$check_only" = 1 ]; then
    echo "apply-nccl-patches: NCCL $version: $count of $series $([ ${#files[@]} -eq 1 ] && echo applies || echo apply) cleanly (--check: nothing changed)"
    exit 0
  fi
  gitapply "${files[@]}"
  echo "apply-nccl-patches: NCCL $version: applied $count of $series"
  echo "Now build NCCL as you normally do (for example: make -j src.build NVCC_GENCODE=\"-gencode=arch=compute_89,code=sm_89\")"
  echo "and point the env script at the result: scripts/gdr-env.sh --nccl-lib $tree_abs/build/lib ..."
  exit 0
fi
if gitapply --reverse --check "${reversed[@]}" 2>/dev/null; then
  echo "apply-nccl-patches: NCCL $version: already patched ($series); nothing to do"
  exit 0
fi
echo "apply-nccl-patches: NCCL $version: the series in $series does not apply cleanly to $tree_abs" >&2
echo "  (locally modified, partly patched, or not the released $version sources); tree left untouched." >&2
echo "  What git says:" >&2
gitapply --check "${files[@]}" 2>&1 | sed 's/^/    /' >&2 || true
exit 1
