# shellcheck shell=bash
# The environment a release is compiled in, sourced by build-release.sh and by test.sh: the suite
# builds with exactly these flags, so that its build phase's target/release is the release's own
# and the release check finds it built. No build id, and the source tree and the cargo home
# remapped: nothing of this machine or directory ends up in the binaries. rustc itself compiles:
# a wrapper such as clippy-driver compiles other code (it turns MIR optimisations off), so the
# bytes would not be SHA256SUMS's.
#   release_env SRC      exports RUSTFLAGS for the tree at SRC (an absolute path)
release_env() {
  local src=$1 cargo_home="${CARGO_HOME:-$HOME/.cargo}"
  export RUSTFLAGS="--remap-path-prefix=$src=/gdrshim --remap-path-prefix=$cargo_home=/cargo -C link-arg=-Wl,--build-id=none"
  unset RUSTC_WRAPPER RUSTC_WORKSPACE_WRAPPER
}
