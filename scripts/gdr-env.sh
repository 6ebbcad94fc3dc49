#!/usr/bin/env bash
# Per-job (per-container) environment for P2P and GDR runs.
#
#   source scripts/gdr-env.sh [options]          set the variables in this shell
#   scripts/gdr-env.sh [options] -- COMMAND ...  run COMMAND with them (torchrun, mpirun, srun ...)
#   scripts/gdr-env.sh [options] --print         print them as `export NAME=VALUE` lines, set nothing
#
#   --mode p2p|gdr     p2p: single-node PCIe P2P only (no shim); gdr (default): p2p plus the shim
#   --prefix DIR       an installed release (default /opt/rtx4090-gdr/current); its SHA256SUMS
#                      must match lib/libgdrshim.so and lib/libgdrshim-core.so before
#                      LD_PRELOAD is set
#   --nccl-lib DIR     the patched NCCL's lib folder (put first in LD_LIBRARY_PATH)
#   --hca LIST         NCCL_IB_HCA in any form NCCL reads: mlx5_0,mlx5_1 (prefixes: mlx5 is every
#                      mlx5_N), =mlx5_0 (exact names), ^mlx5_1 (all but these), ^=mlx5_1, and
#                      name:port entries (mlx5_0:1). Checked against /sys/class/infiniband: an
#                      exact name must exist, a prefix must match an HCA, an exclusion must leave one.
#                      Without --hca (gdr mode): the only HCA there is; with several, the one the
#                      doctor names nearest each GPU (its topo.* record, as --gdr-level auto reads
#                      it: --state DIR or recorded now), in the exact form =mlx5_0,mlx5_1; no HCA,
#                      or several and no record: exit 2, saying so
#   --gid-index N      NCCL_IB_GID_INDEX (RoCE: the RoCE v2 IPv4 GID the doctor names; -1: NCCL picks)
#   --gdr-level L      NCCL_NET_GDR_LEVEL: LOC NVL NVB C2C PIX PXB P2C PXN PHB SYS, or NCCL's old
#                      numbers 0-4 (LOC PIX PXB PHB SYS; 5 and more are SYS). Default SYS.
#                      auto: from the doctor's record of each GPU's PCIe path to its nearest NIC
#                      (topo.*): the lowest level that lets GDR on for every such pair, never below
#                      NCCL's default PXB; the pairs it covers are named (SYS: across sockets, often
#                      slower than no GDR). No record or no tool: says so and sets none (NCCL's PXB)
#   --state DIR        with --gdr-level auto or without --hca: a state saved by
#                      scripts/gdr-state-record (default: recorded now); the doctor (gdrshim-tool,
#                      in PREFIX/bin or beside) judges it
#   --p2p-level L      NCCL_P2P_LEVEL, the same forms (default SYS)
#   --register-buffers keep NCCL_LOCAL_REGISTER/NCCL_GRAPH_REGISTER at NCCL's default (only with a
#                      large BAR1; with the 256 MiB default BAR1 they stay 0)
#   --shim-mode M      GDRSHIM_MODE (default register)
#   --route R          GDRSHIM_ROUTE: auto (default), dmabuf, nv503c (the doctor says which works)
#   --shim-log PATH    GDRSHIM_LOG_FILE (%h host, %p pid)
#   --no-advertise     GDRSHIM_ADVERTISE_GDR=0: stock NCCL is not told GDR works (by default the
#                      shim answers its GPU-side gate yes while a route works; --advertise, the
#                      old opt-in, is accepted and changes nothing)
#   --debug            NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,P2P,ENV (what verify-run reads)
#   --version          gdrshim's version;  -h, --help  this text
# Exit status: 0 done; 1 the installed shim cannot be used; 2 bad arguments. Sourced, it returns
# the same and never exits the shell. GDR_ENV_SYSFS (tests only) replaces /sys/class/infiniband,
# GDR_ENV_TOOL (tests only) the gdrshim-tool that judges the state.

_gdr_env_usage() { sed -n '2,45s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }

# The doctor's topo.* record of state $2 (recorded now when empty): each GPU's nearest NIC, one
# "GPU <bdf> ↔ <nic>: <PATH>" line each; where there is none, one line "!<why>".
_gdr_env_pairs() {
  local prefix="$1" state="$2" here tool="" t tmp="" json rest n=0
  here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
  local candidates=("$prefix/bin/gdrshim-tool" "$here/../bin/gdrshim-tool" "$here/../target/release/gdrshim-tool")
  [ -z "${GDR_ENV_TOOL:-}" ] || candidates=("$GDR_ENV_TOOL")
  for t in "${candidates[@]}"; do
    if [ -x "$t" ]; then tool="$t"; break; fi
  done
  if [ -z "$tool" ]; then
    echo "!no gdrshim-tool (in $prefix/bin or beside this script) to read the PCIe paths"
    return 0
  fi
  if [ -z "$state" ]; then
    tmp="$(mktemp -d)" || return 0
    state="$("$here/gdr-state-record" save "$tmp" 2>/dev/null)" || state=""
    if [ -z "$state" ]; then
      rm -rf "$tmp"
      echo "!could not record this machine's state ($here/gdr-state-record)"
      return 0
    fi
  fi
  json="$("$tool" doctor --from "$state" --json 2>/dev/null)"
  [ -z "$tmp" ] || rm -rf "$tmp"
  # each topo.<GPU> check's summary: "GPU <bdf> ↔ <nic>: <PATH> (...)..."
  rest="$json"
  while [[ "$rest" =~ \"id\":\"topo\.[^\"]*\",\"status\":\"[A-Z\ ]*\",\"summary\":\"GPU\ ([^\ \"]+)\ ↔\ ([^:\"]+):\ (PIX|PXB|PHB|SYS)\  ]]; do
    echo "GPU ${BASH_REMATCH[1]} ↔ ${BASH_REMATCH[2]}: ${BASH_REMATCH[3]}"
    n=$((n + 1))
    rest="${rest#*"${BASH_REMATCH[0]}"}"
  done
  if [ "$n" = 0 ]; then
    if [[ "$json" == *'"id":"topo.'* ]]; then echo "!no GPU↔NIC PCIe path in the doctor's record"; else echo "!the doctor gave no topo.* record (state $state)"; fi
  fi
}

# --gdr-level auto: prints the level for NCCL_NET_GDR_LEVEL from the pairs $1 (_gdr_env_pairs),
# or nothing when there is none to take; says why on stderr.
_gdr_env_auto_level() {
  local pairs=() rank max=1 line names
  local -A order=([PIX]=0 [PXB]=1 [PHB]=2 [SYS]=3)
  local byrank=(PIX PXB PHB SYS)
  mapfile -t pairs <<<"$1"
  if [ "${pairs[0]:0:1}" = "!" ]; then
    echo "gdr-env: --gdr-level auto: ${pairs[0]:1}: NCCL_NET_GDR_LEVEL not set (NCCL's default PXB applies)" >&2
    return 0
  fi
  for line in "${pairs[@]}"; do
    rank="${order[${line##*: }]}"
    [ "$rank" -le "$max" ] || max="$rank"
  done
  names="$(printf '%s\n' "${pairs[@]}" | sed -E 's/.*: //' | LC_ALL=C sort -u | tr '\n' ' ')"
  if [ "$(wc -w <<<"$names")" -gt 1 ]; then
    echo "gdr-env: --gdr-level auto: the paths differ per GPU (${names% }): NCCL_NET_GDR_LEVEL=${byrank[$max]} lets GDR on for every GPU with its nearest NIC:" >&2
  else
    echo "gdr-env: --gdr-level auto: NCCL_NET_GDR_LEVEL=${byrank[$max]} lets GDR on for every GPU with its nearest NIC:" >&2
  fi
  for line in "${pairs[@]}"; do echo "gdr-env:   $line" >&2; done
  case "${byrank[$max]}" in
    PHB) echo "gdr-env:   (PHB: through the CPU's root complex, at its peer-to-peer bandwidth)" >&2 ;;
    SYS) echo "gdr-env:   (SYS: across the link between sockets, often slower than NCCL's copy through host memory; better a NIC on each GPU's socket)" >&2 ;;
  esac
  echo "${byrank[$max]}"
}

# No --hca: the HCA the doctor names nearest each GPU (NCCL_IB_HCA's exact form, =a,b), or the
# only HCA here; prints it, or returns 2 saying why there is none to take. $1: sysfs, $2: the
# pairs (_gdr_env_pairs), asked for only where there is more than one HCA.
_gdr_env_auto_hca() {
  local sysfs="$1" pairs=() have=() d line nic picked=()
  if [ -d "$sysfs" ]; then
    for d in "$sysfs"/*; do [ -e "$d" ] && have+=("${d##*/}"); done
  fi
  if [ ${#have[@]} = 0 ]; then
    echo "gdr-env: no --hca given and no HCA in $sysfs to take: give --hca LIST (try --help)" >&2
    return 2
  fi
  if [ ${#have[@]} = 1 ]; then
    echo "gdr-env: no --hca given: ${have[0]}, the only HCA here" >&2
    echo "=${have[0]}"
    return 0
  fi
  mapfile -t pairs <<<"$2"
  if [ "${pairs[0]:0:1}" = "!" ]; then
    echo "gdr-env: no --hca given and ${#have[@]} HCAs here (${have[*]}); which is nearest each GPU is not known (${pairs[0]:1}): give --hca LIST (try --help)" >&2
    return 2
  fi
  for line in "${pairs[@]}"; do
    nic="${line#* ↔ }" nic="${nic%%: *}"
    [[ " ${have[*]} " == *" $nic "* ]] && [[ " ${picked[*]} " != *" $nic "* ]] && picked+=("$nic")
  done
  if [ ${#picked[@]} = 0 ]; then
    echo "gdr-env: no --hca given and none of the doctor's nearest NICs is an HCA here (${have[*]}): give --hca LIST (try --help)" >&2
    return 2
  fi
  echo "gdr-env: no --hca given: the HCA nearest each GPU, from the doctor's record:" >&2
  for line in "${pairs[@]}"; do echo "gdr-env:   $line" >&2; done
  local IFS=,
  echo "=${picked[*]}"
}

# A level as NCCL's ncclGetLevel reads NCCL_NET_GDR_LEVEL / NCCL_P2P_LEVEL: a path type name
# (case sensitive, strcmp) or, starting with a digit, an old number. Prints the name it means.
_gdr_env_level() {
  local old=(LOC PIX PXB PHB SYS SYS)
  case "$1" in
    LOC|NVL|NVB|C2C|PIX|PXB|P2C|PXN|PHB|SYS) echo "$1" ;;
    *)
      [[ "$1" =~ ^(0|[1-9][0-9]{0,8})$ ]] || return 1
      if [ "$1" -gt 5 ]; then echo SYS; else echo "${old[$1]}"; fi ;;
  esac
}

# Does NCCL_IB_HCA entry $4 (name:port, port "" = any) select HCA $2, port $3 ("" = any)? As
# NCCL's matchIfList decides: exact ($1 = 1) compares whole names, else the entry is a prefix.
_gdr_env_sel() {
  local n="${4%%:*}" q="${4#*:}"
  if [ "$1" = 1 ]; then [ "$2" = "$n" ] || return 1; else [ "${2:0:${#n}}" = "$n" ] || return 1; fi
  [ -z "$q" ] || [ -z "$3" ] || [ "$q" = "$3" ]
}

# NCCL_IB_HCA as NCCL's ncclIbInit reads it: '^' (exclude) first, then '=' (exact), then a comma
# list of name[:port]; without '=' a name matches every HCA it is a prefix of.
_gdr_env_check_hca() {
  local spec="$1" sysfs="$2" not=0 exact=0 list e name port d p hit named kept ports have=() entries=()
  [ "${spec:0:1}" != "^" ] || { not=1; spec="${spec:1}"; }
  [ "${spec:0:1}" != "=" ] || { exact=1; spec="${spec:1}"; }
  IFS=',' read -r -a list <<<"$spec"
  for e in "${list[@]}"; do
    [ -n "$e" ] || continue # NCCL skips empty entries
    name="${e%%:*}" port=""
    [ "$name" = "$e" ] || port="${e#*:}"
    [[ "$name" =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "gdr-env: bad HCA name '$e' in --hca $1 (try --help)" >&2; return 2; }
    if [ "$name" != "$e" ] && ! [[ "$port" =~ ^[0-9]+$ ]]; then
      echo "gdr-env: bad port in '$e' (--hca $1): NCCL takes name:port with a port number (try --help)" >&2
      return 2
    fi
    entries+=("$name:$port")
  done
  [ ${#entries[@]} -gt 0 ] || { echo "gdr-env: --hca '$1' names no HCA (NCCL would then use none) (try --help)" >&2; return 2; }
  if [ -d "$sysfs" ]; then
    for d in "$sysfs"/*; do [ -e "$d" ] && have+=("${d##*/}"); done
  fi
  if [ "$not" = 0 ]; then
    # every entry must select at least one port of an HCA that is here
    for e in "${entries[@]}"; do
      name="${e%%:*}" port="${e#*:}" hit=0 named=0
      for d in "${have[@]}"; do
        _gdr_env_sel "$exact" "$d" "" "$e" || continue
        named=1
        if [ -z "$port" ] || [ -d "$sysfs/$d/ports/$port" ]; then hit=1; break; fi
      done
      [ "$hit" = 0 ] || continue
      if [ "$named" = 1 ] && { [ "$exact" = 1 ] || [ -d "$sysfs/$name" ]; }; then
        echo "gdr-env: HCA '$name' has no port '$port' (try --help)" >&2
      elif [ "$named" = 1 ]; then
        echo "gdr-env: no HCA whose name starts with '$name' has a port '$port' (try --help)" >&2
      elif [ "$exact" = 1 ]; then
        echo "gdr-env: HCA '$name' does not exist (have: ${have[*]:-none}) (try --help)" >&2
      else
        echo "gdr-env: HCA '$name' does not exist, and no HCA's name starts with it (have: ${have[*]:-none}) (try --help)" >&2
      fi
      return 2
    done
    return 0
  fi
  # an exclusion needs no name to exist (a warning where it matches nothing), but it must leave
  # NCCL at least one port
  for e in "${entries[@]}"; do
    named=0
    for d in "${have[@]}"; do if _gdr_env_sel "$exact" "$d" "" "$e"; then named=1; break; fi; done
    [ "$named" = 1 ] || echo "gdr-env: warning: --hca $1 excludes '${e%:}', which matches no HCA here" >&2
  done
  hit=0
  for d in "${have[@]}"; do
    ports=()
    for p in "$sysfs/$d"/ports/*; do [ -e "$p" ] && ports+=("${p##*/}"); done
    [ ${#ports[@]} -gt 0 ] || ports=("")
    for p in "${ports[@]}"; do
      kept=1
      for e in "${entries[@]}"; do
        if _gdr_env_sel "$exact" "$d" "$p" "$e"; then kept=0; break; fi
      done
      [ "$kept" = 0 ] || hit=1
    done
  done
  if [ "$hit" = 0 ]; then
    echo "gdr-env: --hca '$1' excludes every HCA port here (have: ${have[*]:-none}): NCCL would have no IB device (try --help)" >&2
    return 2
  fi
  return 0
}

# Fills _GDR_ENV (NAME=VALUE lines) and _GDR_ENV_CMD; returns non-zero with a message on bad input
# (3: help or version printed, nothing to do).
_gdr_env_build() {
  local mode=gdr prefix=/opt/rtx4090-gdr/current nccl_lib="" hca="" gid="" gdr_level=SYS p2p_level=SYS
  local register=0 shim_mode=register shim_log="" advertise=1 debug=0 sysfs="${GDR_ENV_SYSFS:-/sys/class/infiniband}" route=auto state=
  local has_cmd=0 opt val
  _GDR_ENV="" _GDR_ENV_CMD=() _GDR_ENV_PRINT=0
  while [ $# -gt 0 ]; do
    opt="$1" val=""
    case "$opt" in
      --*=*) val="${opt#*=}"; opt="${opt%%=*}" ;;
      --mode|--prefix|--nccl-lib|--hca|--gid-index|--gdr-level|--p2p-level|--shim-mode|--route|--shim-log|--state)
        if [ $# -lt 2 ]; then
          echo "gdr-env: $opt needs a value (try --help)" >&2
          return 2
        fi
        val="$2"; shift ;;
    esac
    case "$opt" in
      --mode) mode="$val" ;;
      --prefix) prefix="$val" ;;
      --nccl-lib) nccl_lib="$val" ;;
      --hca) hca="$val" ;;
      --gid-index) gid="$val" ;;
      --gdr-level) gdr_level="$val" ;;
      --p2p-level) p2p_level="$val" ;;
      --shim-mode) shim_mode="$val" ;;
      --route) route="$val" ;;
      --shim-log) shim_log="$val" ;;
      --state) state="$val" ;;
      --register-buffers) register=1 ;;
      --advertise) advertise=1 ;;
      --no-advertise) advertise=0 ;;
      --debug) debug=1 ;;
      --print) _GDR_ENV_PRINT=1 ;;
      -h|--help) _gdr_env_usage; return 3 ;;
      --version) (
        # shellcheck source=scripts/gdrshim-version.sh
        source "$(dirname "${BASH_SOURCE[0]}")/gdrshim-version.sh" && gdrshim_version gdr-env.sh
      ); return 3 ;;
      --) shift; _GDR_ENV_CMD=("$@"); has_cmd=1; break ;;
      *) echo "gdr-env: unknown option $1 (try --help)" >&2; return 2 ;;
    esac
    shift
  done
  if [ "$_GDR_ENV_PRINT" = 1 ] && [ "$has_cmd" = 1 ]; then
    echo "gdr-env: --print and -- COMMAND together are ambiguous: --print runs nothing; drop one of them (try --help)" >&2
    return 2
  fi
  if [ "$has_cmd" = 1 ] && [ ${#_GDR_ENV_CMD[@]} -eq 0 ]; then
    echo "gdr-env: -- needs a COMMAND after it (try --help)" >&2
    return 2
  fi
  local levels="LOC NVL NVB C2C PIX PXB P2C PXN PHB SYS or 0-4"
  case "$mode" in p2p|gdr) ;; *) echo "gdr-env: --mode must be p2p or gdr, not '$mode' (try --help)" >&2; return 2 ;; esac
  local name
  name="$(_gdr_env_level "$p2p_level")" || { echo "gdr-env: --p2p-level must be one of $levels (upper case, as NCCL compares), not '$p2p_level' (try --help)" >&2; return 2; }
  [ "$name" != LOC ] || echo "gdr-env: warning: NCCL_P2P_LEVEL=$p2p_level means LOC: P2P off" >&2
  local vars=""
  _gdr_env_add() { vars+="$1=$2"$'\n'; }
  _gdr_env_add NCCL_P2P_LEVEL "$p2p_level"
  if [ "$register" = 0 ]; then
    # BAR1 is small (256 MiB) without Resizable BAR: user-buffer registration would exhaust it
    _gdr_env_add NCCL_LOCAL_REGISTER 0
    _gdr_env_add NCCL_GRAPH_REGISTER 0
  fi
  if [ "$mode" = gdr ]; then
    if [ -n "$state" ] && [ "$gdr_level" != auto ] && [ -n "$hca" ]; then echo "gdr-env: --state is read only with --gdr-level auto or without --hca (try --help)" >&2; return 2; fi
    if [ -n "$state" ] && [ ! -d "$state" ]; then echo "gdr-env: --state $state is not a folder (scripts/gdr-state-record save DIR makes one) (try --help)" >&2; return 2; fi
    # the doctor's record of each GPU's nearest NIC, read once where something needs it
    local topo="" nhca
    nhca="$(find "$sysfs" -mindepth 1 -maxdepth 1 2>/dev/null | wc -l)"
    if [ "$gdr_level" = auto ] || { [ -z "$hca" ] && [ "$nhca" -gt 1 ]; }; then
      topo="$(_gdr_env_pairs "$prefix" "$state")"
    fi
    if [ -z "$hca" ]; then hca="$(_gdr_env_auto_hca "$sysfs" "$topo")" || return 2; fi
    if [ "$gdr_level" = auto ]; then
      gdr_level="$(_gdr_env_auto_level "$topo")"
      name="${gdr_level:-PXB}"
    else
      name="$(_gdr_env_level "$gdr_level")" || { echo "gdr-env: --gdr-level must be one of $levels or auto (upper case, as NCCL compares), not '$gdr_level' (try --help)" >&2; return 2; }
    fi
    case "$name" in
      LOC|NVL|NVB|C2C) echo "gdr-env: warning: NCCL_NET_GDR_LEVEL=$gdr_level means $name: a NIC on PCIe is at least PIX from the GPU, so NCCL will not use GDR" >&2 ;;
    esac
    case "$shim_mode" in register|shadow|trace|off) ;; *) echo "gdr-env: --shim-mode must be register, shadow, trace or off (try --help)" >&2; return 2 ;; esac
    case "$route" in auto|dmabuf|nv503c) ;; *) echo "gdr-env: --route must be auto, dmabuf or nv503c, not '$route' (try --help)" >&2; return 2 ;; esac
    if [ "$route" != nv503c ] && [ "${NCCL_DMABUF_ENABLE:-1}" = 0 ]; then
      echo "gdr-env: NCCL_DMABUF_ENABLE=0 is set: NCCL would not use the DMA-BUF route's dma-bufs; unset it (or --route nv503c) (try --help)" >&2
      return 2
    fi
    if [ -n "${NCCL_GDR_FLUSH_DISABLE:-}" ] && [ "${NCCL_GDR_FLUSH_DISABLE// /}" != 0 ]; then
      echo "gdr-env: NCCL_GDR_FLUSH_DISABLE=$NCCL_GDR_FLUSH_DISABLE is set: without NCCL's flush a GeForce GPU can read received data stale (the shim then does not advertise GDR); unset it (try --help)" >&2
      return 2
    fi
    _gdr_env_check_hca "$hca" "$sysfs" || return 2
    if [ -n "$gid" ]; then
      [[ "$gid" =~ ^(-1|0|[1-9][0-9]*)$ ]] || { echo "gdr-env: --gid-index must be a number (decimal, or -1 for NCCL's own choice), not '$gid' (try --help)" >&2; return 2; }
    fi
    [ -z "$nccl_lib" ] || [ -f "$nccl_lib/libnccl.so.2" ] || { echo "gdr-env: no libnccl.so.2 in $nccl_lib (try --help)" >&2; return 2; }
    local shim="$prefix/lib/libgdrshim.so"
    [ -f "$shim" ] || { echo "gdr-env: no shim at $shim (install a release with scripts/deploy.sh, or pass --prefix)" >&2; return 1; }
    [ -f "$prefix/SHA256SUMS" ] || { echo "gdr-env: no SHA256SUMS in $prefix: refusing to preload an unverified shim" >&2; return 1; }
    # the front and the core it loads when a process first touches a GPU
    local lib
    for lib in 'libgdrshim\.so' 'libgdrshim-core\.so'; do
      if ! (cd "$prefix" && grep -E "^[0-9a-f]{64}  lib/$lib\$" SHA256SUMS | sha256sum -c --strict --status 2>/dev/null) \
         || ! grep -qE "^[0-9a-f]{64}  lib/$lib\$" "$prefix/SHA256SUMS"; then
        echo "gdr-env: $prefix/lib/${lib//\\/} does not match $prefix/SHA256SUMS: refusing to preload $shim" >&2
        return 1
      fi
    done
    # the verified file itself, not a path through "current" that a later deploy moves
    shim="$(cd "$(dirname "$shim")" && pwd -P)/libgdrshim.so"
    _gdr_env_add LD_PRELOAD "$shim${LD_PRELOAD:+:$LD_PRELOAD}"
    [ -z "$nccl_lib" ] || _gdr_env_add LD_LIBRARY_PATH "$(cd "$nccl_lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    _gdr_env_add GDRSHIM_MODE "$shim_mode"
    _gdr_env_add GDRSHIM_ROUTE "$route"
    [ -z "$shim_log" ] || _gdr_env_add GDRSHIM_LOG_FILE "$shim_log"
    # GDR is advertised to stock NCCL by default; only the opt-out is written
    [ "$advertise" = 1 ] || _gdr_env_add GDRSHIM_ADVERTISE_GDR 0
    # NCCL flushes received GDR data only below sm_90; from sm_90 on a GeForce that does not order
    # remote writes (RTX 5090) needs it forced, else the shim does not advertise GDR there. Below
    # sm_90 it changes nothing (NCCL flushes anyway). A value the job set is kept.
    [ -n "${NCCL_NET_FORCE_FLUSH+x}" ] || _gdr_env_add NCCL_NET_FORCE_FLUSH 1
    _gdr_env_add NCCL_IB_DISABLE 0
    _gdr_env_add NCCL_IB_HCA "$hca"
    [ -z "$gid" ] || _gdr_env_add NCCL_IB_GID_INDEX "$gid"
    [ -z "$gdr_level" ] || _gdr_env_add NCCL_NET_GDR_LEVEL "$gdr_level"
    # DMA-BUF route: NCCL's own DMA-BUF path takes gdrshim's dma-bufs (NCCL_DMABUF_ENABLE stays 1);
    # NV503C route: the internal IB transport is the one whose ibv_reg_mr the shim sees
    _gdr_env_add NCCL_NET_PLUGIN none
  fi
  if [ "$debug" = 1 ]; then
    _gdr_env_add NCCL_DEBUG INFO
    _gdr_env_add NCCL_DEBUG_SUBSYS INIT,NET,P2P,ENV
  fi
  _GDR_ENV="$vars"
  unset -f _gdr_env_add
  return 0
}

# `export NAME=VALUE`, VALUE bare where no shell (bash, sh, zsh) would change it, else in single
# quotes (a leading '=' is zsh's command expansion, '^' its glob operator, '~' a home folder)
_gdr_env_print() {
  local kv v
  while IFS= read -r kv; do
    [ -n "$kv" ] || continue
    v="${kv#*=}"
    if ! [[ "$v" =~ ^[A-Za-z0-9_./:,@%+-][A-Za-z0-9_./:,=@%+-]*$ ]]; then
      v="'${v//\'/\'\\\'\'}'"
    fi
    printf 'export %s=%s\n' "${kv%%=*}" "$v"
  done <<<"$_GDR_ENV"
}

if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
  # sourced: set the variables here, never exit the caller's shell
  _gdr_env_rc=0
  _gdr_env_build "$@" || _gdr_env_rc=$?
  if [ "$_gdr_env_rc" = 0 ] && [ ${#_GDR_ENV_CMD[@]} -gt 0 ]; then
    echo "gdr-env: sourced, it runs no COMMAND: run the script itself for -- ${_GDR_ENV_CMD[0]} ..." >&2
    _gdr_env_rc=2
  fi
  if [ "$_gdr_env_rc" = 0 ]; then
    if [ "$_GDR_ENV_PRINT" = 1 ]; then
      _gdr_env_print
    else
      while IFS= read -r _kv; do
        [ -n "$_kv" ] && export "${_kv%%=*}=${_kv#*=}"
      done <<<"$_GDR_ENV"
      unset _kv
      echo "gdr-env: set $(grep -c . <<<"$_GDR_ENV") variables (--print shows them)" >&2
    fi
  fi
  unset -f _gdr_env_build _gdr_env_print _gdr_env_usage _gdr_env_level _gdr_env_auto_level _gdr_env_auto_hca _gdr_env_pairs _gdr_env_check_hca _gdr_env_sel _gdr_env_add
  unset _GDR_ENV _GDR_ENV_CMD _GDR_ENV_PRINT
  [ "$_gdr_env_rc" != 3 ] || _gdr_env_rc=0
  set -- "$_gdr_env_rc"
  unset _gdr_env_rc
  return "$1"
else
  set -uo pipefail
  _gdr_env_build "$@"
  rc=$?
  [ "$rc" = 3 ] && exit 0
  [ "$rc" = 0 ] || exit "$rc"
  if [ ${#_GDR_ENV_CMD[@]} -eq 0 ]; then
    _gdr_env_print
    exit 0
  fi
  args=()
  while IFS= read -r kv; do [ -n "$kv" ] && args+=("$kv"); done <<<"$_GDR_ENV"
  exec env "${args[@]}" "${_GDR_ENV_CMD[@]}"
fi
