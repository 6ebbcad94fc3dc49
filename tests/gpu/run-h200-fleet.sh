#!/usr/bin/env bash
# The fleet check (issue 39) on the H200: 4 ranks as 4 lab hosts (issue 37's wire across
# processes: tests/lab/build.sh, DIR/host N), all on the one GPU, started by torchrun
# (--no-python) where torch is installed, else with the environment torchrun's agent gives each
# worker (written out below, the agent's store port held as torchrun holds it). A GeForce is
# emulated as tests/gpu/run-h200-lab.sh does (the knobs build, GDRSHIM_TEST_HIDE_DMABUF=1 and
# GDRSHIM_TEST_HIDE_GDR=1). Two runs:
#   clean:  every host with gdrshim preloaded, no fault: expect RESULT: PASS, exit 0 on every rank;
#   faulty: host 2 without dma-buf MRs (the lab's fault "no-dmabuf 2"): expect exactly one culprit,
#           labhost2 (dma-buf), and no link named.
# Then the NCCL leg (--nccl, real NCCL: torch's libnccl.so.2, each host its own NCCL_HOSTID and
# HCA, as tests/gpu/hosts-lab.sh runs NCCL across lab hosts):
#   nccl:       every pair's send/recv via NET/IB/…/GDRDMA: expect PASS nccl 6 of 6 pairs;
#   nccl-loc:   host 2 with NCCL_NET_GDR_LEVEL=LOC (its NCCL turns GDR off): expect exactly one
#               culprit, labhost2 (nccl), and every RDMA link passing.
# OUT/fleet-clean.txt, OUT/fleet-faulty.txt, OUT/fleet-nccl*.txt: rank 0's report; OUT/*.json,
# OUT/*.svg; OUT/logs/. Results go to docs/results/<run>/.
#   tests/gpu/run-h200-fleet.sh OUT   (carry target/knobs/release/libgdrshim.so and target/release/gdrshim-tool)
set -u
OUT=${1:?outdir}
mkdir -p "$OUT/logs"
KNOBS=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}")
TOOL=$(readlink -f "${GDRSHIM_H200_TOOL:-target/release/gdrshim-tool}")
B=/tmp/gdrshim-fleet
rm -rf "$B"
mkdir -p "$B"
[ -f tests/lab/build.sh ] || { echo "tests/lab/build.sh is missing: this script needs issue 37's lab" >&2; exit 2; }
bash tests/lab/build.sh "$B/lab" >"$OUT/logs/lab-build.txt" 2>&1 || { echo "the lab did not build" >&2; exit 2; }
N=4
SIZE=${FLEET_SIZE:-268435456} # 256 MiB per transfer: 4 processes share the one GPU's memory
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(os.path.dirname(nvidia.nccl.__file__), "lib", "libnccl.so.2"))' 2>/dev/null)
# one worker: lab host LOCAL_RANK, the shim preloaded unless NO_SHIM names this host; NCCL's
# environment as tests/gpu/hosts-lab.sh sets it (its IB transport on this host's HCA, its own
# host id), GDR off where LOC_HOST names this host
cat >"$B/worker.sh" <<EOF
#!/usr/bin/env bash
h=\${LOCAL_RANK:?}
pre="$KNOBS"
[ "\${NO_SHIM:-x}" = "\$h" ] && pre=""
level=SYS
[ "\${LOC_HOST:-x}" = "\$h" ] && level=LOC
export NCCL_NET=IB NCCL_NET_PLUGIN=none NCCL_SOCKET_IFNAME=lo NCCL_NET_GDR_LEVEL=\$level NCCL_IB_GID_INDEX=3 \\
  NCCL_NVLS_ENABLE=0 NCCL_MNNVL_ENABLE=0 NCCL_GIN_TYPE=2 NCCL_DEBUG_SUBSYS=INIT,ENV,NET,GRAPH NCCL_MAX_NCHANNELS=4 \\
  NCCL_HOSTID=labhost\$h NCCL_IB_HCA==fwroce_\$h GDRSHIM_FLEET_NCCL="$NCCL_LIB"
export GDRSHIM_TEST_HIDE_DMABUF=1 GDRSHIM_TEST_HIDE_GDR=1 LD_PRELOAD="\$pre"
exec "$B/lab/host" "\$h" "$TOOL" fleet --gpu 0 --gid-index 3 --size $SIZE --min-bw 0 "\$@" \\
  2>"$OUT/logs/\$RUN-rank\$h.txt"
EOF
chmod +x "$B/worker.sh"

# torchrun's worker environment for rank r (its local elastic agent's), MASTER_PORT held as its store holds it
mimic() {
  local port=$1
  shift
  python3 - "$port" <<'PY' &
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); time.sleep(600)
PY
  local store=$!
  local pids=()
  for r in $(seq 0 $((N - 1))); do
    env LOCAL_RANK="$r" RANK="$r" GROUP_RANK="$r" ROLE_RANK="$r" ROLE_NAME=default LOCAL_WORLD_SIZE=1 \
      WORLD_SIZE=$N GROUP_WORLD_SIZE=$N ROLE_WORLD_SIZE=$N MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" \
      TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_MAX_RESTARTS=0 TORCHELASTIC_RUN_ID="fleet-$RUN" \
      TORCHELASTIC_USE_AGENT_STORE=True TORCH_NCCL_ASYNC_ERROR_HANDLING=1 \
      timeout -s INT -k 5 300 "$B/worker.sh" "$@" >"$B/$RUN-out$r" &
    pids+=($!)
  done
  local rc=0 r=0
  for p in "${pids[@]}"; do
    wait "$p"
    echo "rank $r exit $?" >>"$OUT/fleet-$RUN.txt"
    r=$((r + 1))
  done
  kill "$store" 2>/dev/null
  return $rc
}

one() { # RUN ARGS...: the fleet once, through torchrun where it is installed
  RUN=$1
  shift
  export RUN
  : >"$OUT/fleet-$RUN.txt"
  local t0
  t0=$(date +%s.%N)
  if python3 -c 'import torch.distributed.run' 2>/dev/null; then
    echo "launcher: torchrun (torch $(python3 -c 'import torch; print(torch.__version__)'))" >>"$OUT/fleet-$RUN.txt"
    timeout -s INT -k 5 300 python3 -m torch.distributed.run --nnodes 1 --nproc-per-node $N \
      --master-addr 127.0.0.1 --master-port 29571 --no-python "$B/worker.sh" "$@" \
      >"$B/$RUN-out0" 2>"$OUT/logs/$RUN-torchrun.txt"
    echo "torchrun exit $?" >>"$OUT/fleet-$RUN.txt"
  else
    echo "launcher: torchrun's worker environment, written out (no torch here)" >>"$OUT/fleet-$RUN.txt"
    mimic 29571 "$@"
  fi
  echo "wall $(echo "$(date +%s.%N) - $t0" | bc) s" >>"$OUT/fleet-$RUN.txt"
  cat "$B/$RUN-out0" >>"$OUT/fleet-$RUN.txt"
}

: >"$B/lab/faults"
one clean --svg "$OUT/fleet-clean.svg"
one clean-json --json
cp "$B/clean-json-out0" "$OUT/fleet-clean.json"
echo "no-dmabuf 2" >"$B/lab/faults"
one faulty --svg "$OUT/fleet-faulty.svg"
one faulty-json --json
cp "$B/faulty-json-out0" "$OUT/fleet-faulty.json"
: >"$B/lab/faults"
if [ -n "$NCCL_LIB" ]; then
  one nccl --nccl --svg "$OUT/fleet-nccl.svg"
  LOC_HOST=2 one nccl-loc --nccl
else
  echo "no libnccl.so.2 from torch's nvidia-nccl wheel here: the NCCL leg NOT RUN" | tee "$OUT/fleet-nccl.txt"
fi
grep -h "^RESULT\|exit\|nccl" "$OUT"/fleet-clean.txt "$OUT"/fleet-faulty.txt "$OUT"/fleet-nccl*.txt
