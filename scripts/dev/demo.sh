#!/usr/bin/env bash
# The main job on a machine without a GPU: build gdrshim, then replay traffic captured on an H200
# (driver 580.159.04) through the same decoder, map and shadow oracle the live shim uses, one
# section per workload, and close with a verdict table: for every allocation, is the registration
# gdrshim predicts from its map the one libcuda made itself (the NV503C route), and would the
# DMA-BUF route (the inbox RDMA stack's) export it exactly?
#
#   bash scripts/dev/demo.sh [--verbose]
#     -v, --verbose  also every allocation's lines ("pass0 hit: would REGISTER_VIDMEM {...} = native",
#                    "dma-buf: would export N piece(s)"), under the step of the program that made it
#     --version      gdrshim's version;  -h, --help  this text
#
# Exit status: 0 every workload matched and exported; 1 a workload did not (or the build failed);
# 2 bad arguments.
# GDRSHIM_DEMO_REPLAY (tests only): a replay program to use instead of building gdrshim-replay.
set -euo pipefail
usage() { sed -n '2,15s/^# \{0,1\}//p' "$0"; }
verbose=0
while [ $# -gt 0 ]; do
  case "$1" in
    -v|--verbose) verbose=1 ;;
    -h|--help) usage; exit 0 ;;
    --version)
      # shellcheck source=scripts/gdrshim-version.sh
      source "$(dirname "$0")/../gdrshim-version.sh"
      gdrshim_version demo.sh
      exit 0 ;;
    *) echo "demo: unknown argument $1 (try --help)" >&2; exit 2 ;;
  esac
  shift
done
cd "$(dirname "$0")/../.."
replay="${GDRSHIM_DEMO_REPLAY:-}"
if [ -z "$replay" ]; then
  cargo build --release --locked || { echo "demo: the build failed" >&2; exit 1; }
  replay=./target/release/gdrshim-replay
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

describe() {
  case "$1" in
    alloc-probe) echo "one allocation of each kind: cudaMalloc, cuMemAlloc, VMM map and remap, cudaMallocAsync, cudaMallocPitch (tests/gpu/alloc_probe.cu)" ;;
    bar1-readback) echo "120 allocations of mixed kinds whose map entries were read back through BAR1 and compared byte for byte (tests/gpu/bar1_readback.cu)" ;;
    torch-alloc) echo "PyTorch's caching allocator: 400 tensors of many sizes, empty_cache, a matmul with backward (tests/gpu/torch_alloc.py)" ;;
    torch-exp) echo "the same with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: VMM segments that grow, one allocation over many physical pieces, each registered (tests/gpu/torch_alloc.py)" ;;
    torch-nccl) echo "a one-rank NCCL communicator through torch.distributed: all_reduce, all_gather on NCCL's cuMem buffers (tests/gpu/torch_nccl.py)" ;;
    *) echo "a capture in tests/fixtures" ;;
  esac
}

# The value of KEY in a summary line ("" when it is not there).
field() { sed -n "s/.* $1=\([0-9][0-9]*\).*/\1/p" <<<"$2"; }

# The replay's lines for one capture under the marks of the program that label them ("# cudaMalloc
# 64M"; the replay puts each mark before the lines of its step); no header or summary line.
labelled() { # capture replay-output
  awk -v indent="    " '
    FNR == NR { if (sub(/^M /, "")) mark["# " $0] = 1; next }
    /^== / || /^gdrshim: summary / { next }
    ($0 in mark) || $0 == "# (after the last mark)" {
      if (open && n == 0) print indent "  (nothing to register)"
      print indent "[" substr($0, 3) "]"
      open = 1; n = 0; next
    }
    { print indent (open ? "  " : "") $0; n++ }
    END { if (open && n == 0) print indent "  (nothing to register)" }' "$1" "$2"
}

rows=() failed=() notes=()
t_allocs=0 t_native=0 t_pred=0 t_mis=0 t_dmabuf=0
for f in tests/fixtures/*.cap.gz; do
  name="$(basename "$f" .cap.gz)"
  cap="$tmp/$name.cap"
  gzip -dc "$f" >"$cap"
  rc=0
  "$replay" "$cap" >"$tmp/$name.out" 2>"$tmp/$name.err" || rc=$?
  summary="$(grep -m1 '^gdrshim: summary ' "$tmp/$name.out" || true)"
  driver="$(sed -n '1s/^V //p' "$cap")"
  echo "== $name: $(describe "$name")"
  if [ -z "$summary" ]; then
    echo "   the replay gave no summary (exit $rc):"
    sed 's/^/     /' "$tmp/$name.err"
    failed+=("$name")
    rows+=("$name|?|?|?|?|?")
    echo
    continue
  fi
  allocs="$(field user_allocs "$summary")" native="$(field native "$summary")"
  matched="$(field matched "$summary")" mis="$(field mismatched "$summary")"
  allocs="${allocs:-0}" native="${native:-0}" matched="${matched:-0}" mis="${mis:-0}"
  unpred="$(field unpredicted "$summary")" only="$(field predicted_only "$summary")"
  uncovered="$(field uncovered "$summary")"
  pred=$((matched + mis))
  dmabuf="$(field dmabuf_planned "$summary")" dmabuf="${dmabuf:-0}" refused="$(field dmabuf_unplanned "$summary")"
  echo "   captured on an H200, driver ${driver:-unknown}: $(field ioctls "$summary") NVIDIA ioctls, $(field decoded "$summary") decoded into the map"
  verdict=PASS
  if [ "$rc" != 0 ] || [ "$mis" != 0 ] || [ "${uncovered:-0}" != 0 ] || [ "${refused:-0}" != 0 ]; then
    verdict=FAIL
    failed+=("$name")
  fi
  echo "   $allocs allocations; libcuda registered $native itself; gdrshim predicted $pred of them, $mis different: $verdict"
  echo "   DMA-BUF route: $dmabuf of $allocs allocations would be exported exactly (${refused:-0} refused)"
  [ "${unpred:-0}" = 0 ] || echo "   $unpred registration(s) of libcuda's own memory, which no allocation of the program covers"
  if [ "${only:-0}" != 0 ]; then
    echo "   $only allocation(s) libcuda did not register itself (cudaMallocAsync pool memory): gdrshim would register them"
    notes+=("$name: $only of its allocations (cudaMallocAsync pool memory) libcuda did not register itself; gdrshim would (\"no native registration\" in --verbose)")
  fi
  [ "${uncovered:-0}" = 0 ] || echo "   $uncovered allocation(s) the map did not cover exactly"
  [ ! -s "$tmp/$name.err" ] || sed 's/^/   replay: /' "$tmp/$name.err"
  if [ "$verbose" = 1 ]; then
    labelled "$cap" "$tmp/$name.out"
  fi
  echo
  rows+=("$name|$allocs|$native|$pred|$mis|$dmabuf")
  t_allocs=$((t_allocs + allocs)) t_native=$((t_native + native)) t_pred=$((t_pred + pred)) t_mis=$((t_mis + mis))
  t_dmabuf=$((t_dmabuf + dmabuf))
done

line() { printf '%-14s | %11s | %21s | %9s | %10s | %14s\n' "$@"; }
line workload allocations "libcuda registrations" predicted mismatched "dma-buf exports"
line -------------- ----------- --------------------- --------- ---------- --------------
for r in "${rows[@]}"; do
  IFS='|' read -r a b c d e g <<<"$r"
  line "$a" "$b" "$c" "$d" "$e" "$g"
done
line total "$t_allocs" "$t_native" "$t_pred" "$t_mis" "$t_dmabuf"
for n in "${notes[@]}"; do echo "note: $n"; done
echo
if [ ${#failed[@]} -gt 0 ]; then
  echo "FAIL: ${failed[*]}: gdrshim's predictions differ from what libcuda registered there, or an allocation would not be exported (--verbose shows every line)"
  exit 1
fi
echo "What this shows: on captures of real H200 traffic, the registration gdrshim predicts from its exact map"
echo "equals what libcuda registered itself, allocation by allocation: $t_pred of $t_native predicted, $t_mis different."
echo "\"= native\" (the --verbose lines) means: the REGISTER_VIDMEM gdrshim would make for that allocation (client,"
echo "memory object, address, size, offset) is exactly the one libcuda made on the H200, which registers natively;"
echo "on a GeForce, where libcuda makes none, gdrshim makes that call itself."
echo "\"dma-buf exports\": allocations the DMA-BUF route (no peermem needed) would export exactly, every byte in"
echo "the program's own allocations; these captures hold no dma-buf libcuda made, so that column is gdrshim's alone."
