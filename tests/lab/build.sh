#!/usr/bin/env bash
# Builds the consumer lab into DIR (tests/lab/README.md): the fake libibverbs.so.1 (and the
# libibverbs.so name NCCL dlopens first), libmlx5.so.1 and libefa.so.1 in DIR/lib, fakesys.so, the stand-in
# libcuda in DIR/labcuda (only programs that ask for it load it), the fake NVIDIA driver
# DIR/fakerm.so (preloaded after gdrshim where gdrshim is to meet a GeForce), the lab's own verbs
# programs in DIR/bin, and DIR/host, which runs any program as a lab host.
#   bash tests/lab/build.sh DIR        then   DIR/host N CMD ARGS...
# C compiler: $CC (default cc), with -Wall -Wextra -Werror.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: build.sh DIR" >&2; exit 2; }
src=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1/lib" "$1/labcuda" "$1/bin"
dir=$(cd "$1" && pwd)
cc=${CC:-cc}
flags=(-O1 -g -Wall -Wextra -Werror)
pids=()
build() { "$cc" "${flags[@]}" "$@" & pids+=($!); }
# -z nodelete: the wire's thread runs the library's code until the process ends, so a program
# that dlcloses libibverbs (the fleet check, through libloading) must not unmap it
build -shared -fPIC -Wl,-z,nodelete -Wl,--version-script="$src/fakewire.map" -Wl,-soname,libibverbs.so.1 -o "$dir/lib/libibverbs.so.1" \
  "$src/fakewire.c" "$src/fakewire_qp.c" "$src/fakewire_data.c" "$src/fakewire_resp.c" "$src/fakewire_net.c" "$src/fakelab.c" -ldl -lpthread
build -shared -fPIC -Wl,--version-script="$src/fakemlx5.map" -Wl,-soname,libmlx5.so.1 -o "$dir/lib/libmlx5.so.1" "$src/fakemlx5.c"
build -shared -fPIC -Wl,--version-script="$src/fakeefa.map" -Wl,-soname,libefa.so.1 -o "$dir/lib/libefa.so.1" "$src/fakeefa.c"
build -shared -fPIC -o "$dir/fakesys.so" "$src/fakesys.c" "$src/fakelab.c" -ldl -lpthread
build -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$dir/labcuda/libcuda.so.1" "$src/labcuda.c" -ldl -lpthread
# the fake NVIDIA driver gdrshim meets on a lab host (tests/c/fakerm.c; preloaded after gdrshim)
build -shared -fPIC -o "$dir/fakerm.so" "$src/../c/fakerm.c" -ldl -lpthread
for p in "${pids[@]}"; do wait "$p"; done
pids=()
# NCCL <= 2.29 dlopens "libibverbs.so" before "libibverbs.so.1" (and libmlx5 alike): both names lead to the fake
ln -sf libibverbs.so.1 "$dir/lib/libibverbs.so"
ln -sf libmlx5.so.1 "$dir/lib/libmlx5.so"
# the lab's programs: built against rdma-core's own headers and library, run on the fake by DIR/host
build -I"$src" -o "$dir/bin/wireclient" "$src/wireclient.c" -L"$dir/lib" -l:libibverbs.so.1 -Wl,-rpath,"$dir/lib"
build -I"$src" -o "$dir/bin/wireclient-gpu" "$src/wireclient.c" -Wl,--no-as-needed -L"$dir/lib" -l:libibverbs.so.1 \
  -L"$dir/labcuda" -l:libcuda.so.1 -Wl,-rpath,"$dir/lib:$dir/labcuda"
if printf '#include <infiniband/verbs.h>\n' | "$cc" -E -x c - >/dev/null 2>&1; then
  build -o "$dir/bin/labpair" "$src/labpair.c" "$src/labpair_cases.c" -libverbs
  # a stand-in NCCL (the fleet check's --nccl in CI): DIR/fakenccl/libnccl.so.2
  mkdir -p "$dir/fakenccl"
  build -shared -fPIC -Wl,-soname,libnccl.so.2 -o "$dir/fakenccl/libnccl.so.2" "$src/fakenccl.c" -libverbs -ldl -lpthread
  build -DLAB_GPU -o "$dir/bin/labpair-gpu" "$src/labpair.c" "$src/labpair_cases.c" -libverbs -L"$dir/labcuda" \
    -l:libcuda.so.1 -Wl,-rpath,"$dir/labcuda"
else
  echo "build.sh: no rdma-core verbs.h (libibverbs-dev): labpair not built" >&2
fi
for p in "${pids[@]}"; do wait "$p"; done
install -m 0755 "$src/host.sh" "$dir/host"
echo "lab built in $dir: $dir/host N CMD ARGS..."
