#!/usr/bin/env bash
# The consumer lab's wheels (downloaded here, carried to the H200 as .whl; never committed), cut to
# what the lab loads so that they travel under the device's size limit: NIXL 1.5.1 (cu13; its UCX
# 1.23.0 is the UCX the lab runs: libucx-cu13's wheel has no IB transport), libucx-cu13 1.22.0 for
# ucp.h only, Mooncake transfer engine 0.3.14 (cuda13). Each is rewritten with its RECORD cut to match.
#   bash tests/lab/slim-wheels.sh [DIR]     (default .whl; downloads into DIR/full first)
set -euo pipefail
D=${1:-.whl}
mkdir -p "$D/full"
pip_dl() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$D/full" "$@"
}
[ -n "$(ls "$D"/full/*.whl 2>/dev/null)" ] || pip_dl nixl-cu13==1.5.1 libucx-cu13==1.22.0 mooncake-transfer-engine-cuda13==0.3.14
python3 - "$D" <<'PY'
import re, sys, zipfile, pathlib
d = pathlib.Path(sys.argv[1])
drop = {
  "nixl_cu13": r"^nixl_ep_cu13/|libaws|libazure|libgusli|libs2n|libxml2|perftest|/nixl/libplugin_(?!UCX)|plugins/libplugin_(?!UCX)|libtelemetry|libtrace_backend|libuct_ib_efa|libuct_ib_mlx5_g",
  "libucx_cu13": r"^libucx/(lib|bin)/|^libucx_cu13\.libs/",
  "mooncake_transfer_engine_cuda13": r"^mooncake/(_store|_ep|libmooncake_|mooncake_client|mooncake_master|transfer_engine_bench|nvlink_allocator|_pg_jit|mooncake_ep_jit|reshard|store/)|libcrypto|libsodium|libzmq|libpgm",
}
for w in sorted((d / "full").glob("*.whl")):
    key = next(k for k in drop if w.name.startswith(k))
    pat = re.compile(drop[key])
    out = d / w.name
    with zipfile.ZipFile(w) as zi, zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as zo:
        kept = {i.filename for i in zi.infolist() if not pat.search(i.filename)}
        for i in zi.infolist():
            if i.filename not in kept: continue
            data = zi.read(i)
            if i.filename.endswith(".dist-info/RECORD"):
                data = "".join(l + "\n" for l in data.decode().splitlines() if l.split(",")[0] in kept or l.split(",")[0].endswith("RECORD")).encode()
            zo.writestr(i, data)
    print(f"{out.name}: {w.stat().st_size >> 20} MiB -> {out.stat().st_size >> 20} MiB")
PY
rm -rf "$D/full"
du -ch "$D"/*.whl | tail -1
