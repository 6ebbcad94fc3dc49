#!/usr/bin/env bash
# The whole test suite, in phases, each timed: the toolchain, formatting and layering, the build,
# clippy, the unit/property/model tests of the release build and of the knobs build, the
# integration tests (the real libgdrshim.so in child processes with a fake driver and NIC), the
# tools' tests, shellcheck, and the reproducible release against SHA256SUMS.
#
#   scripts/dev/test.sh [--help | --version]
#
# GDRSHIM_REQUIRE_ALL=1 (CI) makes a missing linter an error instead of a "NOT RUN" line.
# Exit status: 0 every phase passed; 1 a phase failed; 2 usage.
set -euo pipefail
case "${1:-}" in
  -h|--help) sed -n '2,10s/^# \{0,1\}//p' "$0"; exit 0 ;;
  --version)
    # shellcheck source=scripts/gdrshim-version.sh
    source "$(dirname "$0")/../gdrshim-version.sh"
    gdrshim_version test.sh
    exit 0
    ;;
  "") ;;
  *) echo "test.sh: unknown argument $1" >&2; sed -n '2,10s/^# \{0,1\}//p' "$0" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/../.."
require_all="${GDRSHIM_REQUIRE_ALL:-0}"
missing() {
  if [ "$require_all" = 1 ]; then echo "test.sh: $1 is not installed (GDRSHIM_REQUIRE_ALL=1)" >&2; exit 1; fi
  echo "test.sh: $1 is not installed here: that step NOT RUN"
}
t_all=$SECONDS
phase_start=$SECONDS
phase() {
  [ -z "${phase_name:-}" ] || echo "test.sh: phase ${phase_name} passed in $((SECONDS - phase_start)) s"
  phase_name=$1
  phase_start=$SECONDS
  echo "test.sh: phase $1"
}
on_exit() {
  local rc=$?
  [ "$rc" = 0 ] || echo "test.sh: phase ${phase_name:-?} FAILED (exit $rc)" >&2
}
trap on_exit EXIT

phase toolchain
want="$(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml | head -n1)"
have="$(rustc -V | awk '{print $2}')"
if [ "$(printf '%s\n%s\n' "$want" "$have" | sort -V | head -n1)" != "$want" ]; then
  echo "test.sh: rustc $have is older than the rust-version $want in Cargo.toml" >&2
  exit 1
fi
echo "test.sh: $(rustc -V); rust-version $want"
# shellcheck disable=SC2016 # the backquotes are the README's Markdown, not a command
recorded="$(sed -n 's/.*`rustc -V` of the builds recorded here: `\(rustc [^`]*\)`.*/\1/p' README.md | head -n1)"
if [ -n "$recorded" ] && [ "$(rustc -V)" != "$recorded" ]; then
  # said first, so that a release check against SHA256SUMS is not read as a change to the code
  echo "test.sh: NOTE: this is not the toolchain SHA256SUMS was built with ($recorded): the release phase compares two builds of this toolchain with each other instead"
fi

phase format
cargo fmt --all -- --check
# the front library is a cargo workspace of its own (src/front/Cargo.toml says why)
cargo fmt --manifest-path src/front/Cargo.toml -- --check

phase build
cargo build --release --locked --workspace
cargo build --release --locked --manifest-path src/front/Cargo.toml --target-dir target/front

phase lint
if cargo clippy --version >/dev/null 2>&1; then
  # every unsafe block says why it is sound
  cargo clippy --release --locked --workspace --all-targets -- -D clippy::undocumented_unsafe_blocks
  cargo clippy --release --locked -p gdrshim --all-targets --features knobs -- -D clippy::undocumented_unsafe_blocks
  for f in "" knobs; do
    cargo clippy --release --locked --manifest-path src/front/Cargo.toml --target-dir target/front --features "$f" \
      -- -D warnings -D clippy::undocumented_unsafe_blocks
  done
else
  missing clippy
fi

phase unit
# the library's own tests, as it ships and with the test knobs; the layering rules
cargo test --release --locked -p gdrshim --lib --bins
cargo test --release --locked -p gdrshim --lib --features knobs
cargo test --release --locked --test layers

phase integration
# twice: the core preloaded itself, then through the front as a release ships the two
# (tests/common: GDRSHIM_TEST_VIA_FRONT)
for via_front in 0 1; do
  echo "test.sh: integration tests, GDRSHIM_TEST_VIA_FRONT=$via_front"
  if [ "$(id -u)" = 0 ]; then
    # the root-only tests (secure execution, files planted by another user) too
    GDRSHIM_TEST_VIA_FRONT=$via_front cargo test --release --locked -p gdrshim --tests -- --include-ignored
  else
    GDRSHIM_TEST_VIA_FRONT=$via_front cargo test --release --locked -p gdrshim --tests
    echo "test.sh: not root: the root-only tests NOT RUN"
  fi
done

phase tools
cargo test --release --locked -p gdrshim-tools

phase scripts
if command -v shellcheck >/dev/null 2>&1; then
  # every file in scripts/ (what ships) and scripts/dev/ (developer tools) is a shell script
  sh_files=()
  for f in scripts/* scripts/dev/* tests/gpu/*.sh .ci/run; do
    [ ! -f "$f" ] || sh_files+=("$f")
  done
  shellcheck -x "${sh_files[@]}"
  echo "shellcheck: all scripts clean"
else
  missing shellcheck
fi

phase release
bash scripts/dev/check-release.sh
phase "all"
echo "test.sh: all phases passed in $((SECONDS - t_all)) s"
