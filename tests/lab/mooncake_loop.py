# The consumer lab's Mooncake program (ours): one transfer engine (RDMA protocol on the fake HCA,
# P2P handshake, no metadata server) writing to and reading from itself (loopback), between
# buffers of the kinds asked (gpu | cpu), every byte checked.
#   python3 mooncake_loop.py SRC DST [BYTES]  prints "mooncake_loop SRC->DST: write ok read ok bytes=N"
import sys
import torch
from mooncake.engine import TransferEngine

src_kind, dst_kind = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 1 << 20
dev = lambda k: "cuda" if k == "gpu" else "cpu"
pat = (torch.arange(n, dtype=torch.int64) * 131 + 7).remainder(256).to(torch.uint8)
src = pat.to(dev(src_kind)); dst = torch.zeros(n, dtype=torch.uint8, device=dev(dst_kind)); back = torch.zeros_like(src)
te = TransferEngine()
rc = te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "fwroce_0")
if rc:
    print(f"mooncake_loop {src_kind}->{dst_kind}: FAILED initialize rc={rc}", flush=True); sys.exit(1)
me = f"127.0.0.1:{te.get_rpc_port()}"
for t in (src, dst, back):
    rc = te.register_memory(t.data_ptr(), n)
    print(f"register_memory({t.device}) rc={rc}", flush=True)
w = te.transfer_sync_write(me, src.data_ptr(), dst.data_ptr(), n)
w_ok = w == 0 and torch.equal(dst.cpu(), pat)
r = te.transfer_sync_read(me, back.data_ptr(), dst.data_ptr(), n)
r_ok = r == 0 and torch.equal(back.cpu(), pat)
print(f"mooncake_loop {src_kind}->{dst_kind}: write {'ok' if w_ok else 'FAILED'} (rc={w}) read {'ok' if r_ok else 'FAILED'} (rc={r}) bytes={n}", flush=True)
sys.exit(0 if w_ok and r_ok else 1)
