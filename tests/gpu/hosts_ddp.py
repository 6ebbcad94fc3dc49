# Many hosts on one GPU (issue 37 B; ours): a short DDP training between ranks that are lab
# hosts of their own (tests/gpu/hosts-lab.sh). Everything that could make two runs differ is
# pinned (seeds, deterministic kernels; the run script pins NCCL's algorithm, protocol and
# channels), so the run with gdrshim and the run without must print the same losses, bit for bit.
# Prints "hosts_ddp rank R: step S loss HEX ms=T" per step; the run script compares rank 0's.
import datetime
import os
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.use_deterministic_algorithms(True)
dist.init_process_group("nccl", device_id=torch.device("cuda:0"), timeout=datetime.timedelta(seconds=120))
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
ddp = DistributedDataParallel(model, device_ids=[0], bucket_cap_mb=4)
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
for step in range(int(os.environ.get("HOSTS_STEPS", 20))):
    t0 = time.perf_counter()
    g = torch.Generator().manual_seed(1000 * step + rank)
    x, y = torch.randn(64, 1024, generator=g).cuda(), torch.randn(64, 1024, generator=g).cuda()
    loss = nn.functional.mse_loss(ddp(x), y)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    opt.step()
    total = loss.detach().clone()
    dist.all_reduce(total)
    torch.cuda.synchronize()
    print(f"hosts_ddp rank {rank}: step {step} loss {float(total.item()).hex()} ms={(time.perf_counter() - t0) * 1e3:.1f}", flush=True)
dist.destroy_process_group()
