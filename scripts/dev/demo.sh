#!/usr/bin/env bash
# The main job on a machine without a GPU: build the shim, then replay traffic captured on an
# H200 (driver 580.159.04) through the same decoder, map and shadow oracle the live shim uses,
# and print what gdrshim would register for every user allocation.
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release --locked
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
for f in tests/fixtures/*.cap.gz; do gzip -dc "$f" >"$tmp/$(basename "${f%.gz}")"; done
./target/release/gdrshim-replay "$tmp"/*.cap "$@"
