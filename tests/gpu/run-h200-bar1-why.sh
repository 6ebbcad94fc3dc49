#!/usr/bin/env bash
# Where a first registration's time goes on the H200 (issue 30). Separate processes gave bimodal
# medians (about 16 or 24 µs per process, libcuda's and gdrshim's alike: h200-run27-settle), so
# here both ways run in one process, in turn per pair of fresh buffers (bar1_figures mixed):
# libcuda's cuMemGetHandleForAddressRange + ibv_reg_dmabuf_mr + close, and gdrshim's first
# ibv_reg_mr (its export + ibv_reg_dmabuf_mr), with the export ioctl's own time of each
# (tests/gpu/syscount.c). MIXED_RUNS processes (default 4) of 200 pairs, 2 and 64 MiB; then the
# same with every MR kept until the end ("live": 200 live buffers each way), with the export
# ioctl's mean and max besides its median.
# Usage: tests/gpu/run-h200-bar1-why.sh OUTDIR   (needs target/knobs/release/libgdrshim.so)
set -u -o pipefail
OUT=${1:?outdir}
mkdir -p "$OUT"
SHIM=$(readlink -f "${GDRSHIM_H200_KNOBS:-target/knobs/release/libgdrshim.so}")
# shellcheck source=tests/gpu/lib-stubnic.sh
source tests/gpu/lib-stubnic.sh
B=/tmp/gdrshim-bar1why; mkdir -p "$B"
res="$OUT/bar1-mixed.txt"; : >"$res"
stubnic "$B"
gcc -shared -fPIC -O2 -o "$B/syscount.so" tests/gpu/syscount.c -ldl
nvcc -O2 -arch=sm_90 -o "$B/bar1_figures" tests/gpu/bar1_figures.cu -lcuda -ldl 2>&1 | grep -i " error"
echo "run MiB: libcuda first (ns, medians) first/libcuda | export ioctl: libcuda's gdrshim's (ns) ratio | the rest: libcuda's gdrshim's" | tee -a "$res"
for run in $(seq 1 "${MIXED_RUNS:-4}"); do
  for mib in 2 64; do
    o="$B/mixed-$mib-$run.out"
    GDRSHIM_MODE=register SUPPRESS_LOG=/dev/null GDRSHIM_LOG_FILE="$B/mixed-$mib-$run.log" \
      LD_PRELOAD="$B/suppress503c.so:$SHIM:$B/syscount.so" timeout 120 "$B/bar1_figures" mixed 200 "$mib" >"$o" 2>>"$B/err" ||
      echo "mixed $mib MiB run $run: exit $?" | tee -a "$res"
    awk -v run="$run" -v mib="$mib" '$1 == "bar1" { split($6, m, "="); v[$4] = m[2] }
      END { if (v["libcuda"] > 0 && v["libcuda_ioctl"] > 0)
        printf "%s %2d: %6d %6d %.2f | %6d %6d %.2f | %6d %6d\n", run, mib, v["libcuda"], v["first"], v["first"] / v["libcuda"],
          v["libcuda_ioctl"], v["first_ioctl"], v["first_ioctl"] / v["libcuda_ioctl"], v["libcuda"] - v["libcuda_ioctl"], v["first"] - v["first_ioctl"] }' "$o" | tee -a "$res"
  done
done
echo "live, run MiB: export ioctl libcuda's median/mean/max, gdrshim's median/mean/max (ns); whole first/libcuda (medians)" | tee -a "$res"
for run in $(seq 1 "${MIXED_RUNS:-4}"); do
  for mib in 2 64; do
    o="$B/live-$mib-$run.out"
    GDRSHIM_MODE=register SUPPRESS_LOG=/dev/null GDRSHIM_LOG_FILE="$B/live-$mib-$run.log" \
      LD_PRELOAD="$B/suppress503c.so:$SHIM:$B/syscount.so" timeout 120 "$B/bar1_figures" mixed 200 "$mib" live >"$o" 2>>"$B/err" ||
      echo "live $mib MiB run $run: exit $?" | tee -a "$res"
    awk -v run="$run" -v mib="$mib" '$1 == "bar1" { split($6, m, "="); split($8, a, "="); split($9, x, "="); v[$4] = m[2]; mean[$4] = a[2]; mx[$4] = x[2] }
      END { if (v["libcuda"] > 0 && v["libcuda_ioctl"] > 0)
        printf "%s %2d: %6d/%6d/%8d  %6d/%6d/%8d  %.2f\n", run, mib, v["libcuda_ioctl"], mean["libcuda_ioctl"], mx["libcuda_ioctl"],
          v["first_ioctl"], mean["first_ioctl"], mx["first_ioctl"], v["first"] / v["libcuda"] }' "$o" | tee -a "$res"
  done
done
grep -h FAIL "$B/err" | head -5 | tee -a "$res"
grep -h 'gdrshim: summary' "$B"/mixed-*.log "$B"/live-*.log | tr ' ' '\n' | grep -E '^(route|dmabuf_exports|rm_errors|dmabuf_buffers)=' | sort | uniq -c | tee -a "$res"
cat "$B"/mixed-*.out "$B"/live-*.out >"$OUT/bar1-mixed-raw.txt"
exit 0
