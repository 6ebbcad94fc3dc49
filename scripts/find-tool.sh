# Sourced by scripts/doctor, scripts/verify-run, scripts/dmabuf-probe and scripts/selftest: sets `tool` to the
# gdrshim-tool of this release (../bin) or of this source tree (../target/release), or exits 2.
# shellcheck shell=bash
tool=""
_scripts="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
for t in "$_scripts/../bin/gdrshim-tool" "$_scripts/../target/release/gdrshim-tool"; do
  if [ -x "$t" ]; then tool="$t"; break; fi
done
if [ -z "$tool" ]; then
  echo "gdrshim-tool not found next to this script (../bin) or in ../target/release: build it with cargo build --release --workspace" >&2
  exit 2
fi
