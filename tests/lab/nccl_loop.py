# The consumer lab's NCCL program (ours): one rank through torch.distributed (PyTorch's NCCL),
# for what NCCL's init says of the fake HCA (net_ib on fwroce_0, GPU Direct RDMA for it, DMA-BUF)
# and a collective whose every value is checked. One rank moves no data over the network; its
# two-rank data path needs two GPUs. Then, where this torch has it, a buffer from ncclMemAlloc
# (torch's MemPool over NCCL's allocator, registered with ncclCommRegister), checked the same way.
#   python3 nccl_loop.py       prints "nccl_loop: all_reduce ok all_gather ok ..."; exit 0 iff all ok
import os, sys
import torch
import torch.distributed as dist

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
n = 1 << 20
pat = (torch.arange(n, device="cuda", dtype=torch.int32) * 131 + 7) % 100003
t = pat.clone()
dist.all_reduce(t)  # one rank: the sum is the input itself
ar_ok = torch.equal(t, pat)
g = [torch.empty_like(pat)]
dist.all_gather(g, pat)
ag_ok = torch.equal(g[0], pat)
torch.cuda.synchronize()
print(f"nccl_loop: all_reduce {'ok' if ar_ok else 'FAILED'} all_gather {'ok' if ag_ok else 'FAILED'} "
      f"bytes={n * 4} nccl={torch.cuda.nccl.version()}", flush=True)
pool_ok = True
try:  # torch >= 2.7 names these; an older one says so and the rest stands
    backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda"))
    pool, use_pool = torch.cuda.MemPool(backend.mem_allocator), torch.cuda.use_mem_pool
except (AttributeError, TypeError, RuntimeError) as e:  # RuntimeError: "NCCL mem allocator is not supported in this NCCL version" (torch 2.11 + NCCL 2.28.9)
    pool = None
    print(f"nccl_loop: ncclMemAlloc pool not tried here ({type(e).__name__}: {e})", flush=True)
if pool is not None:  # a failure from here on is NCCL's (or ours) and ends the run non-zero
    with use_pool(pool):
        u = pat.clone()
    backend.register_mem_pool(pool)
    dist.all_reduce(u)
    torch.cuda.synchronize()
    pool_ok = torch.equal(u, pat)
    print(f"nccl_loop: ncclMemAlloc buffer, ncclCommRegister'ed: all_reduce {'ok' if pool_ok else 'FAILED'} bytes={n * 4}", flush=True)
    backend.deregister_mem_pool(pool)
    del u
dist.destroy_process_group()
sys.exit(0 if ar_ok and ag_ok and pool_ok else 1)
