# Sourced by scripts/deploy.sh; the .deb's maintainer scripts carry the same text
# (scripts/dev/build-deb.sh). POSIX sh.
#
# NCCL flushes received GPUDirect RDMA data itself only below sm_90; a GPU of sm_90 or later whose
# libcuda answers GPU_DIRECT_RDMA_WRITES_ORDERING below OWNER (an RTX 5090 class GeForce) needs
# the flush forced, and gdrshim tells NCCL that GDR works there only then. NCCL reads
# /etc/nccl.conf at its first parameter read and never lets a line override the job's own
# variable, so one line NCCL_NET_FORCE_FLUSH=1 there gives such a node GDR with nothing in the job
# (docs/nccl-flush.md).
#
# nccl_conf_add TOOL VERSION: where TOOL's `gpu-facts` names such a GPU, appends our two lines
#   (a comment that marks them, then NCCL_NET_FORCE_FLUSH=1) to the file; every line already
#   there stays byte for byte, and a file that names NCCL_NET_FORCE_FLUSH already (the site's own
#   value) is left alone. Nothing is written where the facts cannot be read.
# nccl_conf_remove: removes our two lines (and the file, where we created it and nothing else is
#   left in it); nothing else.
# The file: /etc/nccl.conf under DPKG_ROOT; GDR_DEPLOY_NCCL_CONF (tests only) names another.
# shellcheck shell=sh

nccl_conf_file() { printf '%s\n' "${GDR_DEPLOY_NCCL_CONF:-${DPKG_ROOT:-}/etc/nccl.conf}"; }

# prints our pair's line numbers (the comment's) in file $1, none when it has none
nccl_conf_ours() {
  awk 'prev && $0 == "NCCL_NET_FORCE_FLUSH=1" { print NR - 1 }
       { prev = ($0 ~ /^# added by gdrshim [^:]*: /) }' "$1"
}

nccl_conf_add() {
  _tool="$1" _version="$2" _conf="$(nccl_conf_file)"
  if ! _facts="$("$_tool" gpu-facts 2>/dev/null)"; then
    echo "gdrshim: $_conf left alone: the GPU facts cannot be read here (gdrshim-tool gpu-facts); where a GPU of sm_90 or later does not order remote writes, set NCCL_NET_FORCE_FLUSH=1 in the job"
    return 0
  fi
  _need="$(printf '%s\n' "$_facts" | sed -n 's/.*| sm=\([0-9]*\) writes_ordering=\([0-9-]*\) needs_forced_flush=1$/sm_\1 (118 = \2)/p' | sort -u | tr '\n' ' ')"
  if [ -z "$_need" ]; then
    echo "gdrshim: $_conf left alone: no GPU here needs NCCL's flush forced"
    return 0
  fi
  if [ -f "$_conf" ] && [ -n "$(nccl_conf_ours "$_conf")" ]; then
    echo "gdrshim: $_conf already has gdrshim's NCCL_NET_FORCE_FLUSH=1"
    return 0
  fi
  if [ -f "$_conf" ] && grep -q '^NCCL_NET_FORCE_FLUSH=' "$_conf"; then
    echo "gdrshim: $_conf left alone: it sets NCCL_NET_FORCE_FLUSH itself ($(grep -m1 '^NCCL_NET_FORCE_FLUSH=' "$_conf")); GPUs ${_need}need it non-zero for GPUDirect RDMA"
    return 0
  fi
  _new="" _made=""
  if [ -e "$_conf" ] || [ -L "$_conf" ]; then
    [ -f "$_conf" ] || { echo "gdrshim: $_conf left alone: not a regular file"; return 0; }
  else
    _new=" (new file)"
  fi
  mkdir -p "${_conf%/*}" || return 0
  _tmp="${_conf%/*}/.nccl.conf.gdrshim.$$"
  if [ -z "$_new" ]; then
    cp -p "$_conf" "$_tmp" || { rm -f "$_tmp"; return 0; }
    # a last line without its end would run into ours
    if [ -s "$_tmp" ] && [ "$(tail -c 1 "$_tmp" | od -An -tx1 | tr -d ' ')" != 0a ]; then echo >>"$_tmp"; fi
  else
    : >"$_tmp" && chmod 0644 "$_tmp"
  fi
  {
    echo "# added by gdrshim $_version$_new: NCCL's receive flush forced for GPUDirect RDMA on GPUs ${_need}(removed with gdrshim)"
    echo "NCCL_NET_FORCE_FLUSH=1"
  } >>"$_tmp" && mv -f "$_tmp" "$_conf" && _made=1
  rm -f "$_tmp"
  [ -n "$_made" ] && echo "gdrshim: $_conf: NCCL_NET_FORCE_FLUSH=1 added (GPUs ${_need}need NCCL's flush forced)"
  return 0
}

nccl_conf_remove() {
  _conf="$(nccl_conf_file)"
  [ -f "$_conf" ] || return 0
  _at="$(nccl_conf_ours "$_conf")"
  [ -n "$_at" ] || return 0
  _tmp="${_conf%/*}/.nccl.conf.gdrshim.$$"
  _created="$(awk -v n="$_at" 'NR == n + 0 && / \(new file\): / { print 1 }' "$_conf")"
  cp -p "$_conf" "$_tmp" || { rm -f "$_tmp"; return 0; }
  awk -v at=" $(echo "$_at" | tr '\n' ' ') " 'index(at, " " NR " ") || index(at, " " (NR - 1) " ") { next } { print }' "$_conf" >"$_tmp" || { rm -f "$_tmp"; return 0; }
  if [ -n "$_created" ] && [ ! -s "$_tmp" ]; then
    rm -f "$_tmp" "$_conf"
    echo "gdrshim: $_conf removed (gdrshim made it for its line alone)"
  else
    mv -f "$_tmp" "$_conf"
    echo "gdrshim: $_conf: gdrshim's NCCL_NET_FORCE_FLUSH=1 removed; every other line kept"
  fi
  return 0
}
