#!/usr/bin/env bash
# Per-job (per-container) environment for P2P and GDR runs, as the runbook sets it.
#
#   source scripts/gdr-env.sh [options]          set the variables in this shell
#   scripts/gdr-env.sh [options] -- COMMAND ...  run COMMAND with them (torchrun, mpirun, srun ...)
#   scripts/gdr-env.sh [options] --print         print what would be set, set nothing
#
#   --mode p2p|gdr     p2p: single-node PCIe P2P only (no shim); gdr (default): p2p plus the shim
#   --prefix DIR       an installed release (default /opt/rtx4090-gdr/current); its SHA256SUMS
#                      must match lib/libgdrshim.so before LD_PRELOAD is set
#   --nccl-lib DIR     the patched NCCL's lib folder (put first in LD_LIBRARY_PATH)
#   --hca LIST         NCCL_IB_HCA, e.g. mlx5_0,mlx5_1 or mlx5_0:1; each name must exist
#   --gid-index N      NCCL_IB_GID_INDEX (RoCE: the RoCE v2 IPv4 GID; doctor names it)
#   --gdr-level L      NCCL_NET_GDR_LEVEL: LOC PIX PXB PHB SYS (default SYS)
#   --p2p-level L      NCCL_P2P_LEVEL (default SYS)
#   --register-buffers keep NCCL_LOCAL_REGISTER/NCCL_GRAPH_REGISTER at NCCL's default (only with a
#                      large BAR1; with the 256 MiB default BAR1 they stay 0)
#   --shim-mode M      GDRSHIM_MODE (default register)
#   --route R          GDRSHIM_ROUTE: auto (default), dmabuf, nv503c (the doctor says which works)
#   --shim-log PATH    GDRSHIM_LOG_FILE (%h host, %p pid)
#   --advertise        GDRSHIM_ADVERTISE_GDR=1: stock NCCL without the patches (see README)
#   --debug            NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,P2P (what verify-run reads)
# GDR_ENV_SYSFS (test only) replaces /sys/class/infiniband when checking HCA names.

_gdr_env_usage() { sed -n '2,24s/^# \{0,1\}//p' "${BASH_SOURCE[0]}"; }

# Fills _GDR_ENV (NAME=VALUE lines) and _GDR_ENV_CMD; returns non-zero with a message on bad input.
_gdr_env_build() {
  local mode=gdr prefix=/opt/rtx4090-gdr/current nccl_lib="" hca="" gid="" gdr_level=SYS p2p_level=SYS
  local register=0 shim_mode=register shim_log="" advertise=0 debug=0 sysfs="${GDR_ENV_SYSFS:-/sys/class/infiniband}" route=auto
  _GDR_ENV="" _GDR_ENV_CMD=() _GDR_ENV_PRINT=0
  while [ $# -gt 0 ]; do
    case "$1" in
      --mode) mode="${2-}"; shift ;;
      --prefix) prefix="${2-}"; shift ;;
      --nccl-lib) nccl_lib="${2-}"; shift ;;
      --hca) hca="${2-}"; shift ;;
      --gid-index) gid="${2-}"; shift ;;
      --gdr-level) gdr_level="${2-}"; shift ;;
      --p2p-level) p2p_level="${2-}"; shift ;;
      --register-buffers) register=1 ;;
      --shim-mode) shim_mode="${2-}"; shift ;;
      --route) route="${2-}"; shift ;;
      --shim-log) shim_log="${2-}"; shift ;;
      --advertise) advertise=1 ;;
      --debug) debug=1 ;;
      --print) _GDR_ENV_PRINT=1 ;;
      -h|--help) _gdr_env_usage; return 3 ;;
      --) shift; _GDR_ENV_CMD=("$@"); break ;;
      *) echo "gdr-env: unknown option $1 (--help)" >&2; return 2 ;;
    esac
    shift
  done
  local levels="LOC PIX PXB PHB SYS"
  case "$mode" in p2p|gdr) ;; *) echo "gdr-env: --mode must be p2p or gdr, not '$mode'" >&2; return 2 ;; esac
  [[ " $levels " == *" $p2p_level "* ]] || { echo "gdr-env: --p2p-level must be one of $levels, not '$p2p_level'" >&2; return 2; }
  local vars=""
  add() { vars+="$1=$2"$'\n'; }
  add NCCL_P2P_LEVEL "$p2p_level"
  if [ "$register" = 0 ]; then
    # BAR1 is small (256 MiB) without Resizable BAR: user-buffer registration would exhaust it
    add NCCL_LOCAL_REGISTER 0
    add NCCL_GRAPH_REGISTER 0
  fi
  if [ "$mode" = gdr ]; then
    [[ " $levels " == *" $gdr_level "* ]] || { echo "gdr-env: --gdr-level must be one of $levels, not '$gdr_level'" >&2; return 2; }
    case "$shim_mode" in register|shadow|trace|off) ;; *) echo "gdr-env: --shim-mode must be register, shadow, trace or off" >&2; return 2 ;; esac
    case "$route" in auto|dmabuf|nv503c) ;; *) echo "gdr-env: --route must be auto, dmabuf or nv503c, not '$route'" >&2; return 2 ;; esac
    if [ "$route" != nv503c ] && [ "${NCCL_DMABUF_ENABLE:-1}" = 0 ]; then
      echo "gdr-env: NCCL_DMABUF_ENABLE=0 is set: NCCL would not use the DMA-BUF route's dma-bufs; unset it (or --route nv503c)" >&2
      return 2
    fi
    local shim="$prefix/lib/libgdrshim.so"
    [ -f "$shim" ] || { echo "gdr-env: no shim at $shim (install a release with scripts/deploy.sh, or pass --prefix)" >&2; return 1; }
    [ -f "$prefix/SHA256SUMS" ] || { echo "gdr-env: no SHA256SUMS in $prefix: refusing to preload an unverified shim" >&2; return 1; }
    if ! (cd "$prefix" && grep -E '^[0-9a-f]{64}  lib/libgdrshim\.so$' SHA256SUMS | sha256sum -c --strict --status 2>/dev/null) \
       || ! grep -qE '^[0-9a-f]{64}  lib/libgdrshim\.so$' "$prefix/SHA256SUMS"; then
      echo "gdr-env: $shim does not match $prefix/SHA256SUMS: refusing to preload it" >&2
      return 1
    fi
    # the verified file itself, not a path through "current" that a later deploy moves
    shim="$(cd "$(dirname "$shim")" && pwd -P)/libgdrshim.so"
    if [ -z "$hca" ]; then echo "gdr-env: --hca is required in gdr mode (e.g. --hca mlx5_0); doctor lists the HCAs" >&2; return 2; fi
    local h name port
    local -a hcas
    IFS=',' read -r -a hcas <<<"$hca"
    for h in "${hcas[@]}"; do
      name="${h%%:*}"; port=""; [ "$name" = "$h" ] || port="${h#*:}"
      [[ "$name" =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "gdr-env: bad HCA name '$h'" >&2; return 2; }
      [ -d "$sysfs/$name" ] || { echo "gdr-env: HCA '$name' does not exist (have: $(cd "$sysfs" 2>/dev/null && printf '%s ' *))" >&2; return 2; }
      if [ -n "$port" ]; then
        if ! [[ "$port" =~ ^[0-9]+$ ]] || [ ! -d "$sysfs/$name/ports/$port" ]; then
          echo "gdr-env: HCA '$name' has no port '$port'" >&2
          return 2
        fi
      fi
    done
    if [ -n "$gid" ]; then
      [[ "$gid" =~ ^[0-9]+$ ]] || { echo "gdr-env: --gid-index must be a number, not '$gid'" >&2; return 2; }
    fi
    [ -z "$nccl_lib" ] || [ -f "$nccl_lib/libnccl.so.2" ] || { echo "gdr-env: no libnccl.so.2 in $nccl_lib" >&2; return 2; }
    add LD_PRELOAD "$shim${LD_PRELOAD:+:$LD_PRELOAD}"
    [ -z "$nccl_lib" ] || add LD_LIBRARY_PATH "$(cd "$nccl_lib" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    add GDRSHIM_MODE "$shim_mode"
    add GDRSHIM_ROUTE "$route"
    [ -z "$shim_log" ] || add GDRSHIM_LOG_FILE "$shim_log"
    [ "$advertise" = 0 ] || add GDRSHIM_ADVERTISE_GDR 1
    add NCCL_IB_DISABLE 0
    add NCCL_IB_HCA "$hca"
    [ -z "$gid" ] || add NCCL_IB_GID_INDEX "$gid"
    add NCCL_NET_GDR_LEVEL "$gdr_level"
    # DMA-BUF route: NCCL's own DMA-BUF path takes gdrshim's dma-bufs (NCCL_DMABUF_ENABLE stays 1);
    # NV503C route: the internal IB transport is the one whose ibv_reg_mr the shim sees
    add NCCL_NET_PLUGIN none
  fi
  if [ "$debug" = 1 ]; then
    add NCCL_DEBUG INFO
    add NCCL_DEBUG_SUBSYS INIT,NET,P2P,ENV
  fi
  _GDR_ENV="$vars"
  unset -f add
  return 0
}

_gdr_env_print() {
  local kv
  while IFS= read -r kv; do
    [ -n "$kv" ] && printf 'export %s=%q\n' "${kv%%=*}" "${kv#*=}"
  done <<<"$_GDR_ENV"
}

if [[ "${BASH_SOURCE[0]}" != "$0" ]]; then
  # sourced: set the variables here, never exit the caller's shell
  _gdr_env_rc=0
  _gdr_env_build "$@" || _gdr_env_rc=$?
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
  unset -f _gdr_env_build _gdr_env_print _gdr_env_usage
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
  if [ "$_GDR_ENV_PRINT" = 1 ] || [ ${#_GDR_ENV_CMD[@]} -eq 0 ]; then
    _gdr_env_print
    exit 0
  fi
  args=()
  while IFS= read -r kv; do [ -n "$kv" ] && args+=("$kv"); done <<<"$_GDR_ENV"
  exec env "${args[@]}" "${_GDR_ENV_CMD[@]}"
fi
