#!/usr/bin/env bash
# perftest between two lab hosts (ours): builds perftest from a copy of linux-rdma/perftest
# fetched elsewhere (never committed) into LAB/perftest, then runs ib_write_bw, ib_read_bw and
# ib_send_bw, server on host 0 and client on host 1, 200 iterations of 64 KiB, and checks that
# both ends exit 0 and that the fake wire moved every byte (200 x 65536 into the receiving
# host's memory). Extra perftest arguments go to both ends (on the H200: --use_cuda=0
# --use_cuda_dmabuf, after a build with CUDA_H_PATH set: tests/gpu/run-h200-hosts-perftest.sh).
#   bash tests/lab/perftest.sh LAB PERFTEST_SRC [PERFTEST ARGS...]   (LAB: built by build.sh)
# Needs autoconf, automake, libtool, librdmacm-dev, libibumad-dev and libpci-dev to build.
set -uo pipefail
[ $# -ge 2 ] || { echo "usage: perftest.sh LAB PERFTEST_SRC [ARGS...]" >&2; exit 2; }
lab=$(readlink -f "$1")
src=$(readlink -f "$2")
shift 2
pt=$lab/perftest
if [ ! -x "$pt/ib_write_bw" ] || [ "$src" -nt "$pt/ib_write_bw" ]; then
  rm -rf "$pt"
  cp -r "$src" "$pt"
  (cd "$pt" && ./autogen.sh && ./configure && make -j"$(nproc)") >"$lab/perftest-build.log" 2>&1 ||
    { echo "perftest.sh: perftest did not build (tail of $lab/perftest-build.log):"; tail -5 "$lab/perftest-build.log"; exit 1; }
fi
state=$lab/perftest-state
port=$((18000 + RANDOM % 2000))
fails=0
for t in ib_write_bw ib_read_bw ib_send_bw; do
  rm -rf "$state"
  mkdir -p "$state"
  port=$((port + 1))
  FAKEWIRE_LAB=$state FAKEWIRE_REPORT=$state/fw.0 timeout 60 "$lab/host" 0 "$pt/$t" -d fwroce_0 -x 3 -p "$port" -n 200 "$@" \
    >"$state/0.out" 2>&1 &
  server=$!
  # the client connects once the server listens (perftest does not retry)
  for _ in $(seq 500); do
    grep -q "$(printf ':%04X .* 0A ' "$port")" /proc/net/tcp /proc/net/tcp6 2>/dev/null && break
    sleep 0.01
  done
  FAKEWIRE_LAB=$state FAKEWIRE_REPORT=$state/fw.1 timeout 60 "$lab/host" 1 "$pt/$t" -d fwroce_1 -x 3 -p "$port" -n 200 "$@" 127.0.0.1 \
    >"$state/1.out" 2>&1
  crc=$?
  wait "$server"
  src_rc=$?
  # WRITE and SEND land in the server's memory, READ in the client's
  where=0
  [ "$t" = ib_read_bw ] && where=1
  moved=$(tr ' ' '\n' <"$state/fw.$where" | awk -F= '/^bytes_(g2g|h2g|g2h|h2h)=/ {s += $2} END {print s + 0}')
  line=$(grep -A1 '#bytes' "$state/1.out" | tail -1 | awk '{print $1, $2, $4 " MiB/s"}')
  verdict=ok
  if [ "$crc" != 0 ] || [ "$src_rc" != 0 ] || [ "${moved:-0}" != $((200 * 65536)) ]; then verdict=FAILED; fails=$((fails + 1)); fi
  echo "perftest.sh: $t $* exits $src_rc/$crc, moved=${moved:-0} (bytes iters BW: $line) $verdict"
  [ "$verdict" = ok ] || tail -3 "$state/0.out" "$state/1.out"
done
exit $((fails > 0))
