# PyTorch caching allocator with many tensor sizes (run under gdrshim in shadow mode).
import os, random, sys
import torch
random.seed(7)
assert torch.cuda.is_available()
dev = torch.device("cuda:0")
keep = []
total = 0.0
for i in range(400):
    n = random.choice([1, 7, 512, 4096, 65536, 1 << 20, 3 << 20, 17 << 20, 64 << 20, 200 << 20]) // 4 or 1
    t = torch.full((n,), float(i % 13), device=dev)
    total += float(t[: min(n, 1000)].sum())
    if random.random() < 0.6:
        keep.append(t)
    if len(keep) > 60:
        keep.pop(random.randrange(len(keep)))
    if i % 97 == 0:
        torch.cuda.empty_cache()
x = torch.randn(2048, 2048, device=dev)
w = torch.randn(2048, 2048, device=dev, requires_grad=True)
for _ in range(3):
    loss = (x @ w).square().mean()
    loss.backward()
torch.cuda.synchronize()
print(f"torch_alloc ok checksum={total:.1f} reserved={torch.cuda.memory_reserved()} conf={os.environ.get('PYTORCH_CUDA_ALLOC_CONF','')}")
