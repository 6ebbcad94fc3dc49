# shellcheck shell=bash
# The GPU machine's stand-ins, one recipe each, sourced by its run scripts (run from the
# repository root): the stub NIC (stubverbs.c: the machine has no HCA) and suppress503c.so
# (hides libcuda's own NV503C traffic: the GeForce emulation).

# stubnic_build DIR: the stub NIC as DIR/stub/libibverbs.so.1; fails as the compiler does.
stubnic_build() {
  mkdir -p "$1/stub" &&
    gcc -shared -fPIC -O1 -Wall -Werror -Wl,--version-script=tests/gpu/stubverbs.map -Wl,-soname,libibverbs.so.1 \
      -o "$1/stub/libibverbs.so.1" tests/gpu/stubverbs.c -ldl -lpthread
}

# suppress503c_build DIR: DIR/suppress503c.so; fails as the compiler does.
suppress503c_build() {
  gcc -shared -fPIC -O1 -o "$1/suppress503c.so" tests/gpu/suppress503c.c -ldl
}

# stubnic DIR: both, and the stub NIC first on LD_LIBRARY_PATH, exported, for all that follows.
stubnic() {
  suppress503c_build "$1"
  stubnic_build "$1"
  export LD_LIBRARY_PATH="$1/stub${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
}
