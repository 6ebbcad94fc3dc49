#!/usr/bin/env bash
# The whole test suite, in phases, each timed: the toolchain, formatting and layering, the build,
# clippy, the unit/property/model tests of the release build and of the knobs build, the
# integration tests (the real libgdrshim.so in child processes with a fake driver and NIC), the
# tools' tests, shellcheck, and the reproducible release against SHA256SUMS. The test programs
# are built through clippy-driver (one compile lints and builds them), and the release check
# starts after the build phase at the lowest priority, on the CPU the tests leave idle.
#
#   scripts/dev/test.sh [--help | --version | --missing-packages]
#
# Every prerequisite is checked before the first phase: what is missing is named in one line with
# the command that installs it (exit 2). --missing-packages prints only the Debian packages missing
# (what .ci/run installs), one line, empty when none.
# Exit status: 0 every phase passed; 1 a phase failed; 2 a prerequisite is missing, or usage.
set -euo pipefail
usage() { sed -n '2,14s/^# \{0,1\}//p' "$0"; }
missing_only=0
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  --version)
    # shellcheck source=scripts/gdrshim-version.sh
    source "$(dirname "$0")/../gdrshim-version.sh"
    gdrshim_version test.sh
    exit 0
    ;;
  --missing-packages) missing_only=1 ;;
  "") ;;
  *) echo "test.sh: unknown argument $1 (try --help)" >&2; exit 2 ;;
esac
[ $# -le 1 ] || { echo "test.sh: one argument at most (try --help)" >&2; exit 2; }
cd "$(dirname "$0")/../.."

# The prerequisites, all checked at once: Debian packages (with the command each is found by) and
# the Rust toolchain's parts (rustup's).
packages=() rust=()
have() { command -v "$1" >/dev/null 2>&1; }
have cc || packages+=(gcc)
have c++ || packages+=(g++)
have git || packages+=(git)
have objdump || packages+=(binutils)
have shellcheck || packages+=(shellcheck)
have dpkg-deb || packages+=(dpkg)
# rdma-core's verbs.h: the self-test's layout test and the lab's verbs programs compile against it
# (a here-string, not a pipe: a compiler that exits before reading is no SIGPIPE failure)
if ! have cc || ! cc -E -x c - <<<'#include <infiniband/verbs.h>' >/dev/null 2>&1; then
  packages+=(libibverbs-dev)
fi
# rdma-core's example programs: the lab runs them between its hosts (tests/lab_hosts.rs); the lab's
# provider runs under rdma-core's libibverbs1, which libibverbs-dev brings
have ibv_rc_pingpong || packages+=(ibverbs-utils)
# patchelf: a wheel's renamed copy of rdma-core's libibverbs beside the system's (tests/lab_copies.rs)
have patchelf || packages+=(patchelf)
# Open MPI's mpirun and a one-node Slurm (srun, slurmctld, slurmd): they start the fleet check's
# tasks as lab hosts (tools/tests/fleet_lab.rs)
have mpirun || packages+=(openmpi-bin)
have slurmctld || packages+=(slurmctld)
have slurmd && have srun || packages+=(slurmd)
if [ "$missing_only" = 1 ]; then
  echo "${packages[*]}"
  exit 0
fi
if ! have cargo || ! have rustc; then
  rust+=("Rust $(sed -n 's/^rust-version = "\(.*\)"/\1/p' Cargo.toml | head -n1) (https://rustup.rs)")
else
  cargo fmt --version >/dev/null 2>&1 || rust+=(rustfmt)
  cargo clippy --version >/dev/null 2>&1 || rust+=(clippy)
fi
if [ ${#packages[@]} -gt 0 ] || [ ${#rust[@]} -gt 0 ]; then
  line="test.sh: missing:"
  # root without sudo (a container): the command as that user types it
  as_root="sudo "
  [ "$(id -u)" != 0 ] || as_root=""
  [ ${#packages[@]} -eq 0 ] || line+=" ${packages[*]} (${as_root}apt-get install ${packages[*]})"
  [ ${#rust[@]} -eq 0 ] || line+="$([ ${#packages[@]} -eq 0 ] || echo ';') ${rust[*]} ($(if [[ "${rust[0]}" == Rust* ]]; then echo "install it"; else echo "rustup component add ${rust[*]}"; fi))"
  echo "$line; nothing run" >&2
  exit 2
fi

t_all=$SECONDS
phase_start=$SECONDS
phase() {
  [ -z "${phase_name:-}" ] || echo "test.sh: phase ${phase_name} passed in $((SECONDS - phase_start)) s"
  phase_name=$1
  phase_start=$SECONDS
  echo "test.sh: phase $1"
}
# A failing step exits with its own status (cargo test's 101): the suite says which phase, and
# exits 1 as its help says.
on_exit() {
  local rc=$?
  if [ "$rc" != 0 ] && [ -n "${release_pid:-}" ]; then
    stop_release
  fi
  if [ "$rc" != 0 ]; then
    echo "test.sh: phase ${phase_name:-?} FAILED after $((SECONDS - phase_start)) s (its command exited $rc)" >&2
    exit 1
  fi
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

# clippy-driver lints the test programs as it builds them (the lint phase says how)
clippy_driver="$(command -v clippy-driver || echo "$(rustc --print sysroot)/bin/clippy-driver")"
[ -x "$clippy_driver" ] || { echo "test.sh: no clippy-driver ($clippy_driver): rustup component add clippy" >&2; exit 1; }

# Every build of the suite with the release's flags (scripts/dev/release-env.sh): the build phase's
# target/release is the release's, which the release check then finds built.
# shellcheck source=scripts/dev/release-env.sh
source scripts/dev/release-env.sh
release_env "$PWD"

# Two jobs run from here on at the lowest priority, on the CPU the phases leave idle (a release's
# whole-program links use one core, the tests wait on their programs much of the time): the
# release check (scripts/dev/check-release.sh: the build phase's release is the release, built
# again cold in a copy elsewhere, and their .debs; its output is shown in the release phase) and
# the tools' test programs. A suite that stops early stops them.
# Each in a process group of its own (killed as one): where the kernel groups processes by session
# for the scheduler (autogroup), a new session is a group that would have an equal share of the
# CPU whatever its nice value, so its group's nice is set too.
background() { setsid bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null; exec nice -n 19 "$@"' background "$@"; }
release_log=$(mktemp)
background bash scripts/dev/check-release.sh >"$release_log" 2>&1 &
release_pid=$!
# The tools' test programs (with the ~150 crates of the CDI validator) in a profile of their own
# (Cargo.toml's ci-tools: no build lock shared with the other phases); the tools phase builds what
# is left and shows any error.
ci=(--profile ci --locked --config "build.rustc-workspace-wrapper=\"$clippy_driver\"")
tools_ci=(--profile ci-tools --locked --config "build.rustc-workspace-wrapper=\"$clippy_driver\"" -p gdrshim-tools)
background cargo test "${tools_ci[@]}" --no-run >/dev/null 2>&1 &
tools_pid=$!
tools_tests_pid=$tools_pid tools_tests_pid2=$tools_pid tools_log="" tools_log2=""
stop_release() {
  kill -- -"$release_pid" -"$tools_pid" -"$tools_tests_pid" -"$tools_tests_pid2" 2>/dev/null || true
  rm -f "$release_log" "$tools_log" "$tools_log2" "${scripts_log:-}"
}
trap 'exit 130' INT TERM
# collect PID LOG: waits for a job started beside the phases, shows what it said, and returns
# its exit status
collect() {
  local rc=0
  wait "$1" || rc=$?
  cat "$2"
  rm -f "$2"
  return "$rc"
}

phase build
cargo build --release --locked --workspace
cargo build --release --locked --manifest-path src/front/Cargo.toml --target-dir target/front

phase lint
# The workspace's crates are linted as they are built for their tests: every `cargo test` below
# compiles them through clippy-driver, with the workspace's lints (Cargo.toml: every unsafe block
# says why it is sound). Here: the benchmarks and the library's cdylib, which no test builds, and
# the front (a workspace of its own), with and without the knobs.
cargo build "${ci[@]}" -p gdrshim --benches
cargo build "${ci[@]}" -p gdrshim-preload
for f in "" knobs; do
  cargo clippy --release --locked --manifest-path src/front/Cargo.toml --target-dir target/front --features "$f" \
    -- -D warnings -D clippy::undocumented_unsafe_blocks
done

phase unit
# the library's own tests, without and with the test knobs; the layering rules
cargo test "${ci[@]}" -p gdrshim --lib --bins
cargo test "${ci[@]}" -p gdrshim --lib --features knobs
# what the front, the core and the tools share (the configuration with and without the knobs)
cargo test "${ci[@]}" -p gdrshim-common --features std
cargo test "${ci[@]}" -p gdrshim-common --features std,knobs
cargo test "${ci[@]}" --test layers --test layers_tools

phase integration
# Twice: the core preloaded itself here, then through the front as a release ships the two (the
# front phase; GDRSHIM_TEST_VIA_FRONT, read only by tests/common's build()). The second pass leaves out the
# files that never load gdrshim through build(): they would run the same way again
# (tests/front.rs checks this list). The library's unit tests and the layering tests ran in
# the unit phase.
front_independent=(citations deploy dev_scripts fuzz gdr_env gdr_level_auto lab layers layers_tools nccl_patches release
  release_deb replay_fixtures scripts_cli secure_exec)
all_tests=() through_front=()
for f in tests/*.rs; do
  t=$(basename "$f" .rs)
  [ "$t" = layers ] || [ "$t" = layers_tools ] || all_tests+=(--test "$t")
  [[ " ${front_independent[*]} " == *" $t "* ]] || through_front+=(--test "$t")
done
ignored=()
if [ "$(id -u)" = 0 ]; then
  ignored=(--include-ignored) # the root-only tests (secure execution, files planted by another user) too
fi
echo "test.sh: integration tests, GDRSHIM_TEST_VIA_FRONT=0: $((${#all_tests[@]} / 2)) files"
GDRSHIM_TEST_VIA_FRONT=0 cargo test "${ci[@]}" -p gdrshim "${all_tests[@]}" -- "${ignored[@]}"

phase tools
# The tools' test programs, built in the background since the build phase: what is left (and any
# error). Their tests wait on the programs they start most of the time: they run beside the
# integration tests' second pass, at the same priority, their output shown after it.
wait "$tools_pid" || true
cargo test "${tools_ci[@]}" --no-run
# In two streams: the fleet checks (the longest; across lab hosts under mpirun, then, as root, under
# Slurm in a one-node Slurm the test starts: one lab folder of theirs, one after the other) and
# the rest.
tools_other=(--bins)
for f in tools/tests/*.rs; do
  [ "$(basename "$f" .rs)" = fleet_lab ] || tools_other+=(--test "$(basename "$f" .rs)")
done
tools_log=$(mktemp) tools_log2=$(mktemp)
# shellcheck disable=SC2016 # expanded by the inner shell
setsid bash -c 'cargo test "$@" --test fleet_lab && if [ "$(id -u)" = 0 ]; then
    cargo test "$@" --test fleet_lab -- --ignored
  else
    echo "test.sh: not root: the fleet check under Slurm NOT RUN"
  fi' tools-tests "${tools_ci[@]}" >"$tools_log" 2>&1 &
tools_tests_pid=$!
setsid cargo test "${tools_ci[@]}" "${tools_other[@]}" >"$tools_log2" 2>&1 &
tools_tests_pid2=$!

phase front
# The scripts phase's shellcheck runs beside them too: it is done when that phase comes
scripts_log=$(mktemp)
sh_files=()
for f in scripts/* scripts/dev/* tests/gpu/*.sh tests/lab/*.sh .ci/run; do
  [ ! -f "$f" ] || sh_files+=("$f")
done
shellcheck -x "${sh_files[@]}" >"$scripts_log" 2>&1 &
scripts_pid=$!
echo "test.sh: integration tests, GDRSHIM_TEST_VIA_FRONT=1: $((${#through_front[@]} / 2)) files, the tools' tests beside them"
# the stress test 5 s a route here (10 s in the first pass): the same races through the front
GDRSHIM_TEST_VIA_FRONT=1 GDRSHIM_STRESS_SECONDS="${GDRSHIM_STRESS_SECONDS:-5}" \
  cargo test "${ci[@]}" -p gdrshim "${through_front[@]}" -- "${ignored[@]}"
[ "$(id -u)" = 0 ] || echo "test.sh: not root: the root-only tests NOT RUN"
tools_rc=0 tools_rc2=0
echo "test.sh: the tools' tests (run beside the second pass) said:"
collect "$tools_tests_pid2" "$tools_log2" || tools_rc2=$?
collect "$tools_tests_pid" "$tools_log" || tools_rc=$?
if [ "$tools_rc" != 0 ] || [ "$tools_rc2" != 0 ]; then
  echo "test.sh: the tools' tests failed (exits $tools_rc2 and $tools_rc)" >&2
  exit 1
fi

phase scripts
# every file in scripts/ (what ships) and scripts/dev/ (developer tools) is a shell script, and
# clean to shellcheck (run beside the front phase)
scripts_rc=0
collect "$scripts_pid" "$scripts_log" || scripts_rc=$?
[ "$scripts_rc" = 0 ] || { echo "test.sh: shellcheck found the above in ${#sh_files[@]} scripts" >&2; exit 1; }
echo "shellcheck: all ${#sh_files[@]} scripts clean"

phase release
echo "test.sh: the release check (the build phase's release, the same built again cold in a copy elsewhere, both packaged), run in the background since the format phase, said:"
release_rc=0
collect "$release_pid" "$release_log" || release_rc=$?
[ "$release_rc" = 0 ] || { echo "test.sh: check-release.sh exited $release_rc" >&2; exit 1; }
phase "all"
echo "test.sh: all phases passed in $((SECONDS - t_all)) s"
