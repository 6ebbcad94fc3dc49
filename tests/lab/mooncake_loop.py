# The consumer lab's Mooncake program (ours): one transfer engine (RDMA on the fake HCA, P2P
# handshake: no metadata server) writing to and reading from itself (loopback), between buffers of
# the kinds asked (gpu | host), every byte checked. Calls as mooncake 0.3.14's engine.pyi declares
# them: TransferEngine().initialize(local_hostname, metadata_server, protocol, device_name) -> int
# (device_name: a comma-separated device filter), get_rpc_port(), register_memory(addr, capacity,
# location="*") -> int (the engine reads the location: cuda:N or cpu:N), transfer_sync_write /
# transfer_sync_read(target "host:rpc_port", local addr, peer addr, length) -> int (0 = done),
# unregister_memory(addr). How GPU memory reaches the NIC is the engine's WITH_NVIDIA_PEERMEM
# (environment, default on): on, plain ibv_reg_mr of the GPU address (nvidia-peermem's way); 0,
# a dma-buf of the whole allocation (cuMemGetHandleForAddressRange + ibv_reg_dmabuf_mr), after a
# check at context open that CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED is 1.
#   python3 mooncake_loop.py BYTES SRC-DST...  one line per pair:
#   "mooncake_loop gpu->gpu: write ok read ok bytes=N" (or FAILED with the reason); exit 0 iff all ok.
import os, sys
import torch
from mooncake.engine import TransferEngine

n = int(sys.argv[1])
pairs = [p.split("-") for p in sys.argv[2:]] or [["gpu", "gpu"]]
dev = lambda k: "cuda" if k == "gpu" else "cpu"
pat = (torch.arange(n, dtype=torch.int64) * 131 + 7).remainder(256).to(torch.uint8)
torch.zeros(1, device="cuda")  # the primary context, as a serving process has one
print(f"mooncake_loop: WITH_NVIDIA_PEERMEM={os.environ.get('WITH_NVIDIA_PEERMEM', '(unset: on)')}", flush=True)
te = TransferEngine()
rc = te.initialize("127.0.0.1", "P2PHANDSHAKE", "rdma", "fwroce_0")
me = f"127.0.0.1:{te.get_rpc_port()}" if rc == 0 else None
print(f"mooncake_loop: initialize rc={rc} segment={me}", flush=True)
ok_all = True
for s, d in pairs:
    if me is None:
        ok_all = False
        print(f"mooncake_loop {s}->{d}: FAILED initialize rc={rc} bytes={n}", flush=True)
        continue
    src = pat.to(dev(s))
    if s == "host":
        src = src.clone()  # its own buffer, not the pattern's
    dst = torch.zeros(n, dtype=torch.uint8, device=dev(d))
    back = torch.zeros_like(src)
    torch.cuda.synchronize()
    regs = [te.register_memory(t.data_ptr(), n) for t in (src, dst, back)]
    if any(regs):
        w_ok = r_ok = False
        line = f"FAILED register_memory rc={regs} (src, dst, back)"
    else:
        w = te.transfer_sync_write(me, src.data_ptr(), dst.data_ptr(), n)
        torch.cuda.synchronize()
        w_ok = w == 0 and torch.equal(dst.cpu(), pat)
        r = te.transfer_sync_read(me, back.data_ptr(), dst.data_ptr(), n)
        torch.cuda.synchronize()
        r_ok = r == 0 and torch.equal(back.cpu(), pat)
        line = f"write {'ok' if w_ok else 'FAILED'} (rc={w}) read {'ok' if r_ok else 'FAILED'} (rc={r})"
    for t, g in zip((src, dst, back), regs):
        if g == 0:
            te.unregister_memory(t.data_ptr())
    ok_all &= w_ok and r_ok
    print(f"mooncake_loop {s}->{d}: {line} bytes={n}", flush=True)
sys.exit(0 if ok_all else 1)
