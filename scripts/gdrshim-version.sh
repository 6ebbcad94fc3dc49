# Sourced by the scripts for --version: `gdrshim_version NAME` prints "NAME (gdrshim) VERSION",
# VERSION from the release's BUILD-INFO (an installed tree) or else the source tree's Cargo.toml,
# one folder above this file's.
# shellcheck shell=bash
gdrshim_version() {
  local top v=""
  top="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
  if [ -f "$top/BUILD-INFO" ]; then
    v="$(sed -n '1s/^gdrshim //p' "$top/BUILD-INFO")"
  elif [ -f "$top/Cargo.toml" ]; then
    v="$(sed -n 's/^version = "\(.*\)"$/\1/p' "$top/Cargo.toml" | head -n1)"
  fi
  echo "$1 (gdrshim) ${v:-unknown}"
}
