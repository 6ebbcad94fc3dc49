# Real programs under the shim (issue 6): each part prints deterministic results, so runs
# without the shim and in each mode can be compared line by line.
import os, sys
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
import torch, torch.nn as nn
import torch.multiprocessing as mp
import torch.distributed as dist

def r(x):
    return f"{float(x):.6e}"

def train():
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).cuda()
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    x = torch.randn(64, 256, device="cuda"); y = torch.randint(0, 10, (64,), device="cuda")
    losses = []
    for _ in range(20):
        opt.zero_grad(); loss = nn.functional.cross_entropy(m(x), y); loss.backward(); opt.step(); losses.append(loss.item())
    return " ".join(r(l) for l in losses[::5]) + " final=" + r(losses[-1])

def compiled():
    torch.manual_seed(1)
    m = nn.Sequential(nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 4)).cuda()
    f = torch.compile(m)
    x = torch.randn(32, 128, device="cuda")
    return r(f(x).double().sum()) + " eager=" + r(m(x).double().sum())

def graphs():
    torch.manual_seed(2)
    a = torch.randn(512, 512, device="cuda"); out = torch.empty_like(a)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for _ in range(2): out.copy_(a @ a)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out.copy_((a @ a).relu())
    vals = []
    for k in range(3):
        a.mul_(0.5); g.replay(); torch.cuda.synchronize(); vals.append(r(out.double().sum()))
    return " ".join(vals)

def spawn_child(q, i):
    torch.manual_seed(10 + i)
    q.put((i, r(torch.randn(1000, device="cuda").double().sum())))

def fork_child(q, i):
    # after fork a child must not touch CUDA; it runs, exits, and the parent's state stays intact
    q.put((i, r(torch.arange(1000 + i, dtype=torch.float64).sum())))

def processes(method, target):
    ctx = mp.get_context(method); q = ctx.Queue()
    ps = [ctx.Process(target=target, args=(q, i)) for i in range(2)]
    for p in ps: p.start()
    res = sorted(q.get(timeout=120) for _ in ps)
    for p in ps: p.join(60)
    return " ".join(f"{i}:{v}" for i, v in res) + " exit=" + ",".join(str(p.exitcode) for p in ps)

def loader():
    torch.manual_seed(3)
    ds = torch.utils.data.TensorDataset(torch.randn(256, 8), torch.arange(256))
    dl = torch.utils.data.DataLoader(ds, batch_size=32, num_workers=2, shuffle=False)
    tot = torch.zeros(8, device="cuda", dtype=torch.float64)
    for x, _ in dl: tot += x.cuda().double().sum(0)
    return r(tot.sum())

def nccl():
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=0, world_size=1)
    t = torch.arange(1 << 20, device="cuda", dtype=torch.float32)
    dist.all_reduce(t); torch.cuda.synchronize()
    v = r(t.double().sum()); dist.destroy_process_group()
    return v

if __name__ == "__main__":
    torch.cuda.init()
    for name, f in [("train", train), ("compile", compiled), ("graphs", graphs), ("fork", lambda: processes("fork", fork_child)),
                    ("spawn", lambda: processes("spawn", spawn_child)), ("dataloader", loader), ("nccl", nccl), ("train_again", train)]:
        print(f"{name}: {f()}", flush=True)
    print("done", flush=True)
