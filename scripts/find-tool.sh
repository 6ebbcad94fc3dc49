# Sourced by scripts/doctor, scripts/report, scripts/verify-run, scripts/dmabuf-probe and scripts/selftest.
# `find_tool` sets `tool` to the gdrshim-tool of this release (../bin) or of this source tree
# (../target/release), or, where there is none, says so (exit 2) as the tool says an error that
# stops a command: the line on stderr, and on stdout the RESULT line, or the one JSON object when
# --json is among the arguments. `run_tool SUBCOMMAND ARG...` runs it; --help and --version are
# answered without it (a fresh clone has none built yet): the help from the calling script's
# header (the tool's own help when it is there), the version from gdrshim-version.sh. Before
# anything runs, every argument is checked against the calling script's `opts` (its long options,
# `--name=` for one that takes a value): an unknown one is a usage error, one line ending in
# "(try --help)", exit 2, whether the tool is built or not. The tool names the script in its own
# messages (GDRSHIM_TOOL_AS).
# shellcheck shell=bash
_scripts="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
_tool_me="$(basename "$0")"
opts="${opts:-}" # the calling script's options
export GDRSHIM_TOOL_AS="$_tool_me"
find_tool() {
  tool=""
  local t
  for t in "$_scripts/../bin/gdrshim-tool" "$_scripts/../target/release/gdrshim-tool"; do
    if [ -x "$t" ]; then tool="$t"; return 0; fi
  done
  stop_error "gdrshim-tool is not built: not next to this script (../bin) nor in ../target/release; build it with cargo build --release --workspace" "$@"
}
# stop_error WHY ARG...: an error that stops the command, said as the tool says one (exit 2).
stop_error() {
  local why="$1" a json=0 v
  shift
  for a in "$@"; do [ "$a" != --json ] || json=1; done
  if [ "$json" = 1 ]; then
    # shellcheck source=scripts/gdrshim-version.sh
    source "$_scripts/gdrshim-version.sh"
    v="$(gdrshim_version x)" v="${v#x (gdrshim) }"
    printf '{"tool":"%s","version":"%s","checks":[],"could_not_check":"%s","result":"COULD NOT CHECK","exit":2}\n' \
      "${_tool_me%.sh}" "$v" "$why"
  else
    echo "RESULT: COULD NOT CHECK (0 checks: 0 PASS, 0 WARN, 0 FAIL, 0 INFO, 0 COULD NOT CHECK); could not check here: $why"
  fi
  echo "$_tool_me: $why" >&2
  exit 2
}
# check_args ARG...: every argument is one of $opts (a value after a `--name=` option), or a
# usage error.
check_args() {
  local a
  while [ $# -gt 0 ]; do
    a="$1"
    case "$a" in
      --*=*)
        [[ " $opts " == *" ${a%%=*}= "* ]] || { echo "$_tool_me: unknown option ${a%%=*} (try --help)" >&2; exit 2; } ;;
      --*)
        if [[ " $opts " == *" $a= "* ]]; then
          [ $# -ge 2 ] || { echo "$_tool_me: $a needs a value (try --help)" >&2; exit 2; }
          shift
        elif [[ " $opts " != *" $a "* ]]; then
          echo "$_tool_me: unknown option $a (try --help)" >&2
          exit 2
        fi ;;
      *) echo "$_tool_me: unexpected argument '$a' (try --help)" >&2; exit 2 ;;
    esac
    shift
  done
}
run_tool() {
  local sub=$1 a first=""
  shift
  # help or version anywhere among the arguments, as the tool takes them
  for a in "$@"; do
    case "$a" in -h|--help|--version) first="$a"; break ;; esac
  done
  case "$first" in
    --version)
      # shellcheck source=scripts/gdrshim-version.sh
      source "$_scripts/gdrshim-version.sh"
      gdrshim_version "$_tool_me"
      exit 0
      ;;
    -h|--help)
      if { [ -x "$_scripts/../bin/gdrshim-tool" ] || [ -x "$_scripts/../target/release/gdrshim-tool" ]; }; then
        find_tool
        exec "$tool" "$sub" --help
      fi
      sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//p}' "$0"
      echo
      echo "(gdrshim-tool is not built here: this is the summary; cargo build --release --workspace, then --help lists every option)"
      exit 0
      ;;
  esac
  check_args "$@"
  find_tool "$@"
  exec "$tool" "$sub" "$@"
}
