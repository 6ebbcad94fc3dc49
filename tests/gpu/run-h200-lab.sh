#!/usr/bin/env bash
# shellcheck disable=SC2012 # the wheel and library names are ours or pip's: plain
# The consumer lab on the H200 (issue 28 item 6): released consumers move GPU memory over the fake
# wire (tests/lab: a libibverbs.so.1 stand-in, libmlx5 stub, sysfs overlay), GeForce emulated
# (libcuda's dma-buf / 116 answers hidden by the knobs build, its 503C traffic suppressed), each
# consumer with gdrshim (GDRSHIM_MODE default: register) and without (GDRSHIM_MODE=off, the same
# emulation). One table, OUT/lab.txt: consumer x direction x with/without: bytes checked, the
# fake's registrations by kind (gpu_dmabuf = GDR used; gpu_plain_refused = a plain MR on GPU
# memory that reached the NIC: an inbox kernel refuses it), gdrshim's summary counters.
# 20 runs of at most 20 s each: under 8 minutes even when every one hangs.
#   tests/gpu/run-h200-lab.sh OUT      (carry .whl from tests/lab/slim-wheels.sh and target/knobs/release/libgdrshim.so)
set -u
OUT=${1:?outdir}; mkdir -p "$OUT"
KNOBS=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}")
B=/tmp/gdrshim-lab; S=/tmp/site; L=$S/nixl_cu13.libs
rm -rf "$B" /tmp/fakewire-sys; mkdir -p "$B/fw" "$B/logs"
res=$OUT/lab.txt; : >"$res"
log() { echo "$@" | tee -a "$res"; }
t0=$(date +%s)
log "### install wheels, build the fake wire ($(ls .whl | tr '\n' ' '))"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$S" .whl/*.whl || exit 1
export PYTHONPATH=$S${PYTHONPATH:+:$PYTHONPATH}
W=tests/lab
gcc -O1 -shared -fPIC -Wl,--version-script=$W/fakewire.map -Wl,-soname,libibverbs.so.1 -o "$B/fw/libibverbs.so.1" $W/fakewire.c $W/fakewire_qp.c $W/fakewire_data.c -ldl -lpthread || exit 1
gcc -O1 -shared -fPIC -Wl,--version-script=$W/fakemlx5.map -Wl,-soname,libmlx5.so.1 -o "$B/fw/libmlx5.so.1" $W/fakemlx5.c || exit 1
gcc -O1 -shared -fPIC -o "$B/fakesys.so" $W/fakesys.c -ldl || exit 1
gcc -O1 -shared -fPIC -o "$B/suppress503c.so" tests/gpu/suppress503c.c -ldl || exit 1
# NIXL's wheel carries its own rdma-core (auditwheel names): the fake takes their place
cp "$B/fw/libibverbs.so.1" "$L"/libibverbs-*.so.*; cp "$B/fw/libmlx5.so.1" "$L"/libmlx5-*.so.*
for f in "$L"/ucx/*.so.0.0.0; do ln -sf "$(basename "$f")" "${f%.0.0}"; done
gcc -O1 -I"$S/libucx/include" -o "$B/ucp_loop" $W/ucp_loop.c "$L"/libucp-*.so.0.0.0 "$L"/libucs-*.so.0.0.0 -Wl,-rpath,"$L" -ldl || exit 1
# Mooncake links libibverbs.so.1 / libmlx5.so.1 / libnuma.so.1 / libcurl.so.4 / libcudart.so.13 from the system
for n in libnuma.so.1 libcurl.so.4; do ldconfig -p | grep -q "$n " || ln -sf "$(ls "$L"/"${n%%.so*}"-*.so* 2>/dev/null | head -1)" "$B/fw/$n"; done
CUDART=$(dirname "$(python3 -c 'import nvidia, glob, os; print(next(iter(glob.glob(os.path.join(list(nvidia.__path__)[0], "**/libcudart.so.13*"), recursive=True)), ""))' 2>/dev/null)" 2>/dev/null)
log "libcudart: ${CUDART:-system}; knobs lib: $KNOBS; built in $(( $(date +%s) - t0 )) s"
export UCX_TLS=rc_verbs,ud_verbs,cuda_copy UCX_NET_DEVICES=fwroce_0:1 UCX_IB_ROCE_REACHABILITY_MODE=all UCX_MODULE_DIR=$L/ucx
export NIXL_PLUGIN_DIR=$S/.nixl_cu13.mesonpy.libs/plugins NCCL_NVLS_ENABLE=0
printf '%-10s %-9s %-8s %-22s %-60s %s\n' consumer dir gdrshim bytes fakewire gdrshim-summary | tee -a "$res"
run() { # consumer, direction label, with|without, command...
  local c=$1 d=$2 w=$3; shift 3
  local name=$c-$d-$w rep=$B/logs/$c-$d-$w.fw pre="$B/fakesys.so:$B/suppress503c.so:$KNOBS" mode=register
  [ "$w" = without ] && mode=off
  env GDRSHIM_MODE=$mode GDRSHIM_TEST_HIDE_DMABUF=1 GDRSHIM_TEST_HIDE_GDR=1 GDRSHIM_LOG_LEVEL=info GDRSHIM_LOG_FILE="$B/logs/$name.gdrshim" \
    SUPPRESS_LOG="$B/logs/$name.native" FAKEWIRE_REPORT="$rep" LD_LIBRARY_PATH="$B/fw${CUDART:+:$CUDART}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
    LD_PRELOAD="$pre" timeout 20 "$@" >"$B/logs/$name.out" 2>&1
  local rc=$? verdict fw gs
  verdict=$(grep -hoE '(put|write) (ok|FAILED)[^b]*(get|read) (ok|FAILED)|FAILED[^\n]*' "$B/logs/$name.out" | head -1 | cut -c1-40)
  fw=$(tr ' ' '\n' <"$rep" 2>/dev/null | grep -E '^(gpu_dmabuf_mr|gpu_plain_refused|dmabuf_refused|host_mr|bytes_g2g|bytes_g2h|bytes_h2g|wire_errors)=' | tr '\n' ' ')
  gs=$(grep -h '^gdrshim: summary' "$B/logs/$name.out" "$B/logs/$name.gdrshim" 2>/dev/null | tail -1 | tr ' ' '\n' | grep -E '^(route|registered|dmabuf_served|rm_errors|stood_aside|gdr_answers)=' | tr '\n' ' ')
  printf '%-10s %-9s %-8s %-22s %-60s %s\n' "$c" "$d" "$w" "rc=$rc ${verdict:-no verdict}" "${fw:-no report}" "$gs" | tee -a "$res"
}
for w in with without; do
  # shellcheck disable=SC2086 # two words: source and destination kinds
  for sd in "host host" "gpu gpu" "gpu host" "host gpu"; do set -- $sd
    run ucx "$1-$2" $w "$B/ucp_loop" "$1" "$2" 1048576
  done
  log "--- $(( $(date +%s) - t0 )) s"
  # shellcheck disable=SC2086 # two words: source and destination kinds
  for sd in "gpu gpu" "gpu host" "host gpu"; do set -- $sd
    run nixl "$1-$2" $w python3 $W/nixl_loop.py "$1" "$2" 1048576
  done
  log "--- $(( $(date +%s) - t0 )) s"
  # shellcheck disable=SC2086 # two words: source and destination kinds
  for sd in "gpu gpu" "gpu host" "host gpu"; do set -- $sd
    run mooncake "$1-$2" $w python3 $W/mooncake_loop.py "$1" "$2" 1048576
  done
  log "--- $(( $(date +%s) - t0 )) s"
done
log "### the ucp endpoint lanes (the transport that ran), per run"
grep -H 'lane\[' "$B"/logs/ucx-*.out | sed "s|$B/logs/||" | tee -a "$res"
log "### total $(( $(date +%s) - t0 )) s"
cd "$B/logs" && tar czf "$OUT/lab-logs.tgz" . 2>/dev/null
