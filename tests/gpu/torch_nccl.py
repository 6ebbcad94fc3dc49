# A one-rank NCCL communicator through torch.distributed (NCCL allocates cuMem buffers).
import os
import torch
import torch.distributed as dist
os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda:0"))
t = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
dist.all_reduce(t)
g = [torch.empty_like(t)]
dist.all_gather(g, t)
dist.barrier()
torch.cuda.synchronize()
print(f"torch_nccl ok sum={float(t.sum()):.1f} nccl={torch.cuda.nccl.version()}")
dist.destroy_process_group()
