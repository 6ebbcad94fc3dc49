#!/usr/bin/env bash
# Builds the consumer lab into DIR (tests/lab/README.md): the fake HCA as a provider of rdma-core's
# own libibverbs (DIR/provider/libfwroce-rdmav34.so, which DIR/host names in RDMAV_DRIVERS),
# stand-in libmlx5.so.1 and libefa.so.1 in DIR/lib, fakesys.so, the stand-in libcuda in
# DIR/labcuda (only programs that ask for it load it), the fake NVIDIA driver DIR/fakerm.so
# (preloaded after gdrshim where gdrshim is to meet a GeForce), the lab's own verbs programs and
# the wire's copier (fwcopier) in DIR/bin, and DIR/host, which runs any program as a lab host.
# Needs rdma-core's libibverbs1 and libibverbs-dev (scripts/dev/test.sh --missing-packages names them).
#   bash tests/lab/build.sh DIR        then   DIR/host N CMD ARGS...
# C compiler: $CC (default cc), with -Wall -Wextra -Werror.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: build.sh DIR" >&2; exit 2; }
src=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$1/lib" "$1/labcuda" "$1/bin" "$1/provider"
dir=$(cd "$1" && pwd)
cc=${CC:-cc}
flags=(-O1 -g -Wall -Wextra -Werror)
if ! printf '#include <infiniband/verbs.h>\nint main(void) { return !ibv_get_device_list(0); }\n' |
  "$cc" -x c - -o /dev/null -libverbs >/dev/null 2>&1; then
  echo "build.sh: the lab runs on rdma-core's libibverbs: install libibverbs1 and libibverbs-dev" >&2
  exit 1
fi
pids=()
build() { "$cc" "${flags[@]}" "$@" & pids+=($!); }
wire=("$src/fakewire.c" "$src/fakewire_qp.c" "$src/fakewire_data.c" "$src/fakewire_resp.c" "$src/fakewire_net.c" "$src/fakewire_copier.c" "$src/fakewire_gate.c" "$src/fakelab.c")
# The provider: the fake wire's ibv_* definitions hidden inside it, rdma-core's in front. -z nodelete:
# the wire's thread runs its code until the process ends, so a program that dlcloses libibverbs
# (the fleet check, through libloading) must not unmap it.
build -shared -fPIC -fvisibility=hidden -DFW_PROVIDER -Wl,-z,nodelete -Wl,-soname,libfwroce-rdmav34.so \
  -o "$dir/provider/libfwroce-rdmav34.so" "$src/fwprovider.c" "${wire[@]}" -l:libibverbs.so.1 -ldl -lpthread
build -shared -fPIC -Wl,--version-script="$src/fakemlx5.map" -Wl,-soname,libmlx5.so.1 -o "$dir/lib/libmlx5.so.1" "$src/fakemlx5.c"
build -shared -fPIC -Wl,--version-script="$src/fakeefa.map" -Wl,-soname,libefa.so.1 -o "$dir/lib/libefa.so.1" "$src/fakeefa.c"
build -shared -fPIC -o "$dir/fakesys.so" "$src/fakesys.c" "$src/fakelab.c" -ldl -lpthread
build -shared -fPIC -Wl,-soname,libcuda.so.1 -o "$dir/labcuda/libcuda.so.1" "$src/labcuda.c" -ldl -lpthread
# the fake NVIDIA driver gdrshim meets on a lab host (tests/c/fakerm.c; preloaded after gdrshim)
build -shared -fPIC -o "$dir/fakerm.so" "$src/../c/fakerm.c" -ldl -lpthread
for p in "${pids[@]}"; do wait "$p"; done
pids=()
# NCCL <= 2.29 dlopens "libmlx5.so" before "libmlx5.so.1": both names lead to the stand-in
ln -sf libmlx5.so.1 "$dir/lib/libmlx5.so"
# the lab's programs: built against rdma-core's own library (labpair: and its headers), run on
# the lab's provider by DIR/host
build -I"$src" -o "$dir/bin/wireclient" "$src/wireclient.c" -l:libibverbs.so.1
build -I"$src" -o "$dir/bin/wireclient-gpu" "$src/wireclient.c" -Wl,--no-as-needed -l:libibverbs.so.1 \
  -L"$dir/labcuda" -l:libcuda.so.1 -Wl,-rpath,"$dir/labcuda"
# the wire's copier (fakewire_copier.c starts it; it loads the program's libcuda by path)
build -o "$dir/bin/fwcopier" "$src/fwcopier.c" -ldl
build -o "$dir/bin/labpair" "$src/labpair.c" "$src/labpair_cases.c" -libverbs
# a stand-in NCCL (the fleet check's --nccl in CI): DIR/fakenccl/libnccl.so.2
mkdir -p "$dir/fakenccl"
build -shared -fPIC -Wl,-soname,libnccl.so.2 -o "$dir/fakenccl/libnccl.so.2" "$src/fakenccl.c" -libverbs -ldl -lpthread
build -DLAB_GPU -o "$dir/bin/labpair-gpu" "$src/labpair.c" "$src/labpair_cases.c" -libverbs -L"$dir/labcuda" \
  -l:libcuda.so.1 -Wl,-rpath,"$dir/labcuda"
for p in "${pids[@]}"; do wait "$p"; done
install -m 0755 "$src/host.sh" "$dir/host"
echo "lab built in $dir: $dir/host N CMD ARGS..."
