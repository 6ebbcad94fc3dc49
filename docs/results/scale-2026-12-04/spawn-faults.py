#!/usr/bin/env python3
"""Per-exec wall time and page faults of /bin/true under each preload library, interleaved in
rounds (ours; the start-up bench's libraries are left in /tmp/gdrshim-startup-bench-*/).
Usage: spawn-faults.py NAME=LIB... [ROUNDS]   (NAME= with nothing after it: no preload)"""
import os, resource, sys, time

args = [a for a in sys.argv[1:] if "=" in a]
rounds = int(next((a for a in sys.argv[1:] if "=" not in a), "30"))
libs = dict(a.split("=", 1) for a in args)
acc = {k: [0.0, 0] for k in libs}
per = 100
for _ in range(rounds):
    for name, so in libs.items():
        env = {"PATH": "/usr/bin:/bin"}
        if so:
            env["LD_PRELOAD"] = so
        before, t = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        for _ in range(per):
            os.waitpid(os.posix_spawn("/bin/true", ["/bin/true"], env), 0)
        wall, after = time.perf_counter() - t, resource.getrusage(resource.RUSAGE_CHILDREN)
        acc[name][0] += wall
        acc[name][1] += after.ru_minflt - before.ru_minflt
n = rounds * per
for name, (wall, faults) in acc.items():
    print(f"{name:10} wall {wall / n * 1e6:7.1f} us  minor faults {faults / n:5.1f}")
