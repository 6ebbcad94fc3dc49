# Training steps timed inside the process (ours): a small MLP, AdamW, bf16 autocast; warm-up first
# (the caching allocator has its segments), then STEPS steps each synchronised and timed.
# Prints "train_step median_us=... p25_us=... p75_us=... loss=...".
import sys, time, statistics
import torch
steps = int(sys.argv[1]) if len(sys.argv) > 1 else 200
torch.manual_seed(0)
m = torch.nn.Sequential(torch.nn.Linear(4096, 4096), torch.nn.GELU(), torch.nn.Linear(4096, 4096)).cuda()
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
x = torch.randn(256, 4096, device="cuda"); y = torch.randn(256, 4096, device="cuda")
def step():
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = torch.nn.functional.mse_loss(m(x), y)
    opt.zero_grad(set_to_none=True); loss.backward(); opt.step()
    return loss
for _ in range(30):
    step()
torch.cuda.synchronize()
ts = []
for _ in range(steps):
    t0 = time.perf_counter(); loss = step(); torch.cuda.synchronize(); ts.append((time.perf_counter() - t0) * 1e6)
q = statistics.quantiles(ts, n=4)
print(f"train_step median_us={statistics.median(ts):.1f} p25_us={q[0]:.1f} p75_us={q[2]:.1f} loss={float(loss):.4f}")
