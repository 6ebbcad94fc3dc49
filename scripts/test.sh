#!/usr/bin/env bash
# The whole test suite: unit, property, fixture-replay and integration tests (the integration
# tests build the real libgdrshim.so and load it into child processes with a fake driver).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked
if cargo clippy --version >/dev/null 2>&1; then
  # every unsafe block says why it is sound
  cargo clippy --release --locked --all-targets -- -D clippy::undocumented_unsafe_blocks
else
  echo "clippy is not installed here: lint step not run"
fi
cargo test --release --locked
