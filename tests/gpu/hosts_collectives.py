# Many hosts on one GPU (issue 37 B; ours): every collective torch.distributed has, between
# ranks that are lab hosts of their own (tests/gpu/hosts-lab.sh), each result checked against a
# CPU reference: exact for every dtype, since the inputs are small integers whose sums every
# dtype here holds exactly. Started by torchrun, one process per lab host.
#   HOSTS_MAX_BYTES   the largest message (default 256 MiB; 64 MiB and up only in float32)
#   HOSTS_POOL=1      also an ncclMemAlloc buffer registered with ncclCommRegister (torch MemPool)
#   HOSTS_DIE=R:S     rank R kills itself S seconds into a loop of all_reduce; the others report
#                     NCCL's error and how long it took them to see it
# Prints one line per case, "hosts_coll rank R: OP DTYPE bytes=N ok ms=T" (FAILED where not),
# then "hosts_coll rank R: K/M ok"; exit 0 iff all are ok.
import datetime
import os
import signal
import sys
import time

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
max_bytes = int(os.environ.get("HOSTS_MAX_BYTES", 256 << 20))
dist.init_process_group("nccl", device_id=torch.device("cuda:0"), timeout=datetime.timedelta(seconds=120))
SIZES = [1, 3, 1000, 4093, 65543, 1 << 20, (4 << 20) + 13, 64 << 20, 256 << 20]
DTYPES = [torch.float32, torch.bfloat16, torch.int8]
results = []


def pattern(n, r, dtype, salt):
    i = torch.arange(n, dtype=torch.int64)
    return ((i * 7 + r * 3 + salt) % 5 - 2).to(dtype)  # in [-2, 2]: world sums are exact


def report(op, dtype, nbytes, ok, t0):
    ms = (time.perf_counter() - t0) * 1e3
    results.append(ok)
    name = str(dtype).replace("torch.", "")
    print(f"hosts_coll rank {rank}: {op} {name} bytes={nbytes} {'ok' if ok else 'FAILED'} ms={ms:.1f}", flush=True)


def case(op, dtype, nbytes, salt):
    n = max(1, nbytes // torch.tensor([], dtype=dtype).element_size())
    dev = torch.device("cuda:0")
    t0 = time.perf_counter()
    if op == "all_reduce":
        t = pattern(n, rank, dtype, salt).to(dev)
        dist.all_reduce(t)
        ref = sum(pattern(n, r, torch.int64, salt) for r in range(world)).to(dtype)
        ok = torch.equal(t.cpu(), ref)
    elif op == "all_gather":
        out = [torch.empty(n, dtype=dtype, device=dev) for _ in range(world)]
        dist.all_gather(out, pattern(n, rank, dtype, salt).to(dev))
        ok = all(torch.equal(out[r].cpu(), pattern(n, r, dtype, salt)) for r in range(world))
    elif op == "reduce_scatter":
        out = torch.empty(n, dtype=dtype, device=dev)
        dist.reduce_scatter_tensor(out, pattern(n * world, rank, dtype, salt).to(dev))
        ref = sum(pattern(n * world, r, torch.int64, salt)[rank * n:(rank + 1) * n] for r in range(world)).to(dtype)
        ok = torch.equal(out.cpu(), ref)
    elif op == "all_to_all":
        out = torch.empty(n * world, dtype=dtype, device=dev)
        dist.all_to_all_single(out, pattern(n * world, rank, dtype, salt).to(dev))
        ref = torch.cat([pattern(n * world, r, dtype, salt)[rank * n:(rank + 1) * n] for r in range(world)])
        ok = torch.equal(out.cpu(), ref)
    elif op == "broadcast":
        root = salt % world
        t = pattern(n, rank, dtype, salt).to(dev)
        dist.broadcast(t, src=root)
        ok = torch.equal(t.cpu(), pattern(n, root, dtype, salt))
    else:  # send/recv around the ring
        src, dst = (rank - 1) % world, (rank + 1) % world
        got = torch.empty(n, dtype=dtype, device=dev)
        ops = [dist.P2POp(dist.isend, pattern(n, rank, dtype, salt).to(dev), dst), dist.P2POp(dist.irecv, got, src)]
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        ok = torch.equal(got.cpu(), pattern(n, src, dtype, salt))
    torch.cuda.synchronize()
    report(op, dtype, nbytes, ok, t0)


def die_loop(spec):
    victim, after = (int(x) for x in spec.split(":"))
    t = torch.ones(1 << 20, device="cuda:0")
    t0 = time.perf_counter()
    try:
        while True:
            if rank == victim and time.perf_counter() - t0 > after:
                print(f"hosts_coll rank {rank}: killing myself mid-collective", flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
            dist.all_reduce(t)
            torch.cuda.synchronize()
    except Exception as e:  # what NCCL (through torch) says to a survivor
        print(f"hosts_coll rank {rank}: error after {time.perf_counter() - t0 - after:.1f} s past the kill: "
              f"{type(e).__name__}: {str(e)[:300]}", flush=True)
        os._exit(3)


if os.environ.get("HOSTS_DIE"):
    die_loop(os.environ["HOSTS_DIE"])
salt = 0
for op in ["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv"]:
    for dtype in DTYPES:
        for nbytes in SIZES:
            big = nbytes >= 64 << 20
            if nbytes > max_bytes or (big and (dtype != torch.float32 or op in ("reduce_scatter", "all_to_all"))):
                continue
            salt += 1
            case(op, dtype, nbytes, salt)
if os.environ.get("HOSTS_POOL") == "1":  # user-buffer registration: ncclMemAlloc + ncclCommRegister
    t0 = time.perf_counter()
    try:
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cuda"))
        pool = torch.cuda.MemPool(backend.mem_allocator)
        with torch.cuda.use_mem_pool(pool):
            u = pattern(1 << 22, rank, torch.float32, 99).cuda()
        backend.register_mem_pool(pool)
        dist.all_reduce(u)
        torch.cuda.synchronize()
        ref = sum(pattern(1 << 22, r, torch.int64, 99) for r in range(world)).to(torch.float32)
        report("all_reduce(ncclMemAlloc,registered)", torch.float32, 4 << 22, torch.equal(u.cpu(), ref), t0)
        backend.deregister_mem_pool(pool)
    except (AttributeError, TypeError, RuntimeError) as e:  # an older torch or NCCL says so; not counted
        print(f"hosts_coll rank {rank}: ncclMemAlloc pool not tried ({type(e).__name__}: {str(e)[:200]})", flush=True)
print(f"hosts_coll rank {rank}: {sum(results)}/{len(results)} ok nccl={torch.cuda.nccl.version()}", flush=True)
dist.destroy_process_group()
sys.exit(0 if all(results) else 1)
