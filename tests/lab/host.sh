#!/bin/sh
# DIR/host N CMD [ARGS...]: runs CMD as lab host N of the lab built in DIR by tests/lab/build.sh
# (tests/lab/README.md). CMD sees one HCA, fwroce_N, through rdma-core's own libibverbs: the lab's
# provider first in RDMAV_DRIVERS (others named there stay), the host's sysfs tree as SYSFS_PATH,
# the stand-in libmlx5.so.1 and libefa.so.1 of DIR/lib first on LD_LIBRARY_PATH, and the host's
# sysfs, /dev/infiniband and host name labhostN from DIR/fakesys.so, put in front of LD_PRELOAD
# (whose other entries stay: gdrshim stays preloaded). Its children are host N too. The lab's
# state (each host's QP numbers and sysfs tree) and its fault file are in $FAKEWIRE_LAB, default
# DIR: one build can serve several labs.
set -eu
case "${1:-}" in
  '' | *[!0-9]*) echo "usage: $0 N CMD [ARGS...]   (N: the lab host, 0, 1, 2, ...)" >&2; exit 2 ;;
esac
[ $# -ge 2 ] || { echo "usage: $0 N CMD [ARGS...]" >&2; exit 2; }
here=$(cd "$(dirname "$0")" && pwd)
n=$1
shift
lab=${FAKEWIRE_LAB:-$here}
mkdir -p "$lab/run/host$n"
FAKEWIRE_LAB=$lab FAKEWIRE_HOST=$n FAKEWIRE_SYSFS=$lab/run/host$n/sys
SYSFS_PATH=$FAKEWIRE_SYSFS/sys
RDMAV_DRIVERS=$here/provider/libfwroce${RDMAV_DRIVERS:+:$RDMAV_DRIVERS}
LD_LIBRARY_PATH=$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
LD_PRELOAD=$here/fakesys.so${LD_PRELOAD:+:$LD_PRELOAD}
export FAKEWIRE_LAB FAKEWIRE_HOST FAKEWIRE_SYSFS SYSFS_PATH RDMAV_DRIVERS LD_LIBRARY_PATH LD_PRELOAD
exec "$@"
