#!/usr/bin/env bash
# Real programs (tests/gpu/real_programs.py) without the shim and in trace, shadow and register
# mode: outputs and exit codes must be identical. Usage: tests/gpu/run-h200-real.sh OUTDIR
set -u
OUT=${1:?outdir}
mkdir -p "$OUT"
SHIM=$(readlink -f "${GDRSHIM_H200_SHIM:-target/release/libgdrshim.so}")
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
res=$OUT/real.txt; : >"$res"
python3 tests/gpu/real_programs.py >"$OUT/none.out" 2>"$OUT/none.err"; echo "none exit=$?" | tee -a "$res"
for m in trace shadow register; do
  GDRSHIM_MODE=$m GDRSHIM_LOG_FILE="/tmp/real-$m.%p.log" LD_PRELOAD="$SHIM" python3 tests/gpu/real_programs.py >"$OUT/$m.out" 2>"$OUT/$m.err"
  echo "$m exit=$?" | tee -a "$res"
  if cmp -s "$OUT/none.out" "$OUT/$m.out"; then echo "$m: output identical to none ($(wc -l <"$OUT/$m.out") lines)" | tee -a "$res"; else echo "$m: OUTPUT DIFFERS" | tee -a "$res"; diff "$OUT/none.out" "$OUT/$m.out" | tee -a "$res"; fi
  n=$(find /tmp -maxdepth 1 -name "real-$m.*.log" | wc -l)
  echo "$m: $n processes logged; summaries: $(cat /tmp/real-"$m".*.log 2>/dev/null | grep -c '^gdrshim: summary')" | tee -a "$res"
  grep -h '^gdrshim: summary' /tmp/real-"$m".*.log 2>/dev/null | grep -o 'mode=[a-z]* .*' | awk '{for(i=1;i<=NF;i++) if ($i ~ /^(mode|native|matched|mismatched|uncovered|pass0_misses|rm_errors|malformed)=/) printf "%s ", $i; print ""}' | sort | uniq -c | tee -a "$res"
  grep -hE 'ERROR|panic' /tmp/real-"$m".*.log 2>/dev/null | head -5 | tee -a "$res"
done
tee -a "$res" <"$OUT/none.out"
