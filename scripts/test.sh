#!/usr/bin/env bash
# The whole test suite: unit, property, fixture-replay and integration tests (the integration
# tests build the real libgdrshim.so and load it into child processes with a fake driver).
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --locked
cargo test --release --locked
