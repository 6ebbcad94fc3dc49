# The consumer lab's NIXL program (ours): two agents in one process, UCX backend, a WRITE then a
# READ between tensors of the kinds asked (gpu | host), every byte checked. Calls as NIXL 1.5.1's
# own nixl_cu13/_api.py defines them (nixl_agent_config(backends=), register_memory(tensor),
# get_agent_metadata / add_remote_agent, initialize_xfer(op, local xfer descs, remote xfer descs,
# remote name, notif), transfer / check_xfer_state -> "DONE" | "PROC" | "ERR", release_xfer_handle).
#   python3 nixl_loop.py BYTES SRC-DST...   one line per pair:
#   "nixl_loop gpu->gpu: write ok read ok bytes=N" (or FAILED with the reason); exit 0 iff all ok.
import sys, time
import torch  # first: NIXL's _api takes a tensor for one only when torch is already imported

try:
    from nixl._api import nixl_agent, nixl_agent_config
except ImportError:
    from nixl_cu13._api import nixl_agent, nixl_agent_config

n = int(sys.argv[1])
pairs = [p.split("-") for p in sys.argv[2:]] or [["gpu", "gpu"]]
dev = lambda k: "cuda" if k == "gpu" else "cpu"
pat = (torch.arange(n, dtype=torch.int64) * 131 + 7).remainder(256).to(torch.uint8)
torch.zeros(1, device="cuda")  # a current context before the agents (NIXL's UCX backend reads it for VRAM)
cfg = nixl_agent_config(backends=["UCX"])


def xfer(a, b, op, local, remote, peer):
    h = a.initialize_xfer(op, a.get_xfer_descs(local), b.get_xfer_descs(remote), peer, b"lab")
    st = a.transfer(h)
    t0 = time.time()
    while st == "PROC" and time.time() - t0 < 10:
        st = a.check_xfer_state(h)
    if st == "PROC":
        return "TIMEOUT"  # the handle is left (releasing an active transfer raises)
    a.release_xfer_handle(h)
    return st


ok_all = True
for i, (s, d) in enumerate(pairs):
    try:  # a fresh pair of agents per direction: one refused registration spoils no other pair
        a, b = nixl_agent(f"A{i}", cfg), nixl_agent(f"B{i}", cfg)
        if i == 0:
            print(f"nixl_loop: plugins {a.get_plugin_list()}, backends {list(a.backends)}", flush=True)
        src = pat.to(dev(s))
        dst = torch.zeros(n, dtype=torch.uint8, device=dev(d))
        back = torch.zeros_like(src)
        torch.cuda.synchronize()
        a.register_memory(src)
        a.register_memory(back)
        b.register_memory(dst)
        peer = a.add_remote_agent(b.get_agent_metadata())  # B's metadata after its registration
        w = xfer(a, b, "WRITE", src, dst, peer)
        w_ok = w == "DONE" and torch.equal(dst.cpu(), pat)
        r = xfer(a, b, "READ", back, dst, peer)
        r_ok = r == "DONE" and torch.equal(back.cpu(), pat)
        line = f"write {'ok' if w_ok else 'FAILED'} ({w}) read {'ok' if r_ok else 'FAILED'} ({r})"
    except Exception as e:  # a refused registration raises nixlBackendError and the like
        w_ok = r_ok = False
        line = f"FAILED {type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"
    ok_all &= w_ok and r_ok
    print(f"nixl_loop {s}->{d}: {line} bytes={n}", flush=True)
sys.exit(0 if ok_all else 1)
