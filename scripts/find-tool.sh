# Sourced by scripts/doctor, scripts/report, scripts/verify-run, scripts/dmabuf-probe and scripts/selftest.
# `find_tool` sets `tool` to the gdrshim-tool of this release (../bin) or of this source tree
# (../target/release), or exits 2 naming how to build it. `run_tool SUBCOMMAND ARG...` runs it;
# --help and --version are answered without it (a fresh clone has none built yet): the help from
# the calling script's header (the tool's own help when it is there), the version from
# gdrshim-version.sh.
# shellcheck shell=bash
_scripts="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
find_tool() {
  tool=""
  local t
  for t in "$_scripts/../bin/gdrshim-tool" "$_scripts/../target/release/gdrshim-tool"; do
    if [ -x "$t" ]; then tool="$t"; return 0; fi
  done
  echo "gdrshim-tool not found next to this script (../bin) or in ../target/release: build it with cargo build --release --workspace" >&2
  exit 2
}
run_tool() {
  local sub=$1
  shift
  case "${1:-}" in
    --version)
      # shellcheck source=scripts/gdrshim-version.sh
      source "$_scripts/gdrshim-version.sh"
      gdrshim_version "$(basename "$0")"
      exit 0
      ;;
    -h|--help)
      if [ "$#" = 1 ] && { [ -x "$_scripts/../bin/gdrshim-tool" ] || [ -x "$_scripts/../target/release/gdrshim-tool" ]; }; then
        find_tool
        exec "$tool" "$sub" --help
      fi
      sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//p}' "$0"
      echo
      echo "(gdrshim-tool is not built here: this is the summary; cargo build --release --workspace, then --help lists every option)"
      exit 0
      ;;
  esac
  find_tool
  exec "$tool" "$sub" "$@"
}
