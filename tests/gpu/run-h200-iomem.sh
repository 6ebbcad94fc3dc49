#!/usr/bin/env bash
# docs/gpu-initiated-networking.md's run, on the GPU machine: libcuda's answer to
# cuMemHostRegister(IOMEMORY) of one page of a PCI BAR that is not the GPU's (no NIC there: any other
# device with a memory BAR stands in for the NIC's doorbell page), as root, with gdrshim in debug so
# the log shows whether libcuda called RM (an OS-descriptor RM_ALLOC) before answering.
# Usage: tests/gpu/run-h200-iomem.sh OUTDIR   (needs target/release/libgdrshim.so)
set -u
OUT=${1:?outdir}; mkdir -p "$OUT"
SHIM=$(readlink -f "${GDRSHIM_H200_SHIM:-target/release/libgdrshim.so}")
res=$OUT/iomem.txt; : >"$res"
cc -O1 -o /tmp/iomem_register tests/gpu/iomem_register.c -ldl
for d in /sys/bus/pci/devices/*; do
  bdf=${d##*/}; vendor=$(cat "$d/vendor" 2>/dev/null); class=$(cat "$d/class" 2>/dev/null)
  echo "pci $bdf vendor=$vendor class=$class" >>"$res"
done
found=0
for d in /sys/bus/pci/devices/*; do
  bdf=${d##*/}; [ "$(cat "$d/vendor" 2>/dev/null)" = 0x10de ] && continue
  for bar in 0 1 2 3 4 5; do
    # a memory BAR (flags bit 0 clear) of at least a page
    line=$(sed -n "$((bar + 1))p" "$d/resource" 2>/dev/null)
    read -r start end flags <<<"$line"
    if [ -z "${start:-}" ] || [ $((start)) -eq 0 ] || [ $((flags & 1)) -ne 0 ] || [ $((end - start + 1)) -lt 4096 ] || [ ! -e "$d/resource$bar" ]; then
      continue
    fi
    found=1
    echo "### $bdf BAR $bar ($start-$end flags $flags)" | tee -a "$res"
    timeout 60 /tmp/iomem_register "$bdf" "$bar" 2>&1 | tee -a "$res"
    GDRSHIM_LOG_LEVEL=debug GDRSHIM_LOG_FILE=/tmp/iomem-shim.log LD_PRELOAD="$SHIM" timeout 60 /tmp/iomem_register "$bdf" "$bar" 2>&1 | tee -a "$res"
    # NV01_MEMORY_SYSTEM_OS_DESCRIPTOR is class 0x71 (cl0071.h): an RM_ALLOC of it is libcuda asking RM
    grep -iE '0x71\b|0x00000071|os.?desc' /tmp/iomem-shim.log | head -5 | tee -a "$res"
    wc -l </tmp/iomem-shim.log | sed 's/^/shim log lines: /' | tee -a "$res"
    cp /tmp/iomem-shim.log "$OUT/iomem-shim.log"
    break 2
  done
done
[ "$found" = 1 ] || echo "no PCI device but the GPU has a memory BAR here: nothing to register" | tee -a "$res"
