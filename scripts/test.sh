#!/usr/bin/env bash
# The whole test suite: unit, property, fixture-replay and integration tests (the integration
# tests build the real libgdrshim.so and load it into child processes with a fake driver), the
# tools' tests (doctor, verify-run, dmabuf-probe), the NCCL patch series and apply script, the
# deploy and env scripts, shellcheck, and the reproducible release against SHA256SUMS.
# GDRSHIM_REQUIRE_ALL=1 (CI) makes a missing linter an error instead of a "not run" line.
set -euo pipefail
cd "$(dirname "$0")/.."
require_all="${GDRSHIM_REQUIRE_ALL:-0}"
missing() {
  if [ "$require_all" = 1 ]; then echo "test.sh: $1 is not installed (GDRSHIM_REQUIRE_ALL=1)" >&2; exit 1; fi
  echo "test.sh: $1 is not installed here: that step NOT RUN"
}
cargo build --release --locked --workspace
if cargo clippy --version >/dev/null 2>&1; then
  # every unsafe block says why it is sound
  cargo clippy --release --locked --workspace --all-targets -- -D clippy::undocumented_unsafe_blocks
else
  missing clippy
fi
if [ "$(id -u)" = 0 ]; then
  # the root-only tests (secure execution) too
  cargo test --release --locked --workspace -- --include-ignored
else
  cargo test --release --locked --workspace
  echo "test.sh: not root: the secure-execution test (needs root) NOT RUN"
fi
if command -v shellcheck >/dev/null 2>&1; then
  shellcheck -x scripts/*.sh scripts/doctor scripts/verify-run scripts/dmabuf-probe scripts/gdr-state-record tests/gpu/*.sh .ci/run
  echo "shellcheck: all scripts clean"
else
  missing shellcheck
fi
bash scripts/check-release.sh
