# The consumer lab's NIXL program (ours): two agents in one process, UCX backend, a WRITE then a
# READ between tensors of the kinds asked (cuda | cpu), every byte checked.
#   python3 nixl_loop.py SRC DST [BYTES]     prints "nixl_loop SRC->DST: write ok read ok bytes=N"
import sys, time
import torch
try:
    from nixl._api import nixl_agent, nixl_agent_config
except ImportError:
    from nixl_cu13._api import nixl_agent, nixl_agent_config

src_kind, dst_kind = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 1 << 20
dev = lambda k: "cuda" if k == "gpu" else "cpu"
pat = (torch.arange(n, dtype=torch.int64) * 131 + 7).remainder(256).to(torch.uint8)
src = pat.to(dev(src_kind)); dst = torch.zeros(n, dtype=torch.uint8, device=dev(dst_kind)); back = torch.zeros_like(src)
cfg = nixl_agent_config(backends=["UCX"])
a, b = nixl_agent("A", cfg), nixl_agent("B", cfg)
a.register_memory(src); a.register_memory(back); b.register_memory(dst)
peer = a.add_remote_agent(b.get_agent_metadata())

def run(op, local, remote):
    h = a.initialize_xfer(op, a.get_xfer_descs(local), b.get_xfer_descs(remote), peer, b"lab")
    st = a.transfer(h)
    t0 = time.time()
    while st not in ("DONE", "ERR") and time.time() - t0 < 60:
        st = a.check_xfer_state(h)
    a.release_xfer_handle(h)
    return st

w = run("WRITE", src, dst)
w_ok = w == "DONE" and torch.equal(dst.cpu(), pat)
r = run("READ", back, dst)
r_ok = r == "DONE" and torch.equal(back.cpu(), pat)
print(f"nixl_loop {src_kind}->{dst_kind}: write {'ok' if w_ok else 'FAILED'} ({w}) read {'ok' if r_ok else 'FAILED'} ({r}) bytes={n}", flush=True)
sys.exit(0 if w_ok and r_ok else 1)
