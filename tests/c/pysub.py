# CPython's ways to start a child, inside a process that holds gdrshim's fds (ours): run by
# tests/python.rs under gdrshim on the fake machine. Prints "pysub ok ..." or "pysub FAILED ...".
import ctypes, multiprocessing, os, subprocess, sys

# (the fake NIC keeps references of its own from 512 up, as the kernel keeps its own)
def fds():
    out = {}
    for n in os.listdir("/proc/self/fd"):
        try:
            if int(n) < 512:
                out[int(n)] = os.readlink(f"/proc/self/fd/{n}")
        except OSError:
            pass
    return out

def listed(text):
    """The targets of `ls -l /proc/PID/fd`'s lines, below 512."""
    out = []
    for line in text.splitlines():
        if " -> " in line:
            left, target = line.split(" -> ", 1)
            if int(left.split()[-1]) < 512:
                out.append(target)
    return out

def ours(targets, log):
    return sorted(t for t in targets if "nv_dmabuf" in t or "/nvidia0" in t or t == log)

def child_fds(q):
    q.put(list(fds().values()))

def main():
    log = os.path.realpath(os.environ["GDRSHIM_LOG_FILE"])
    rig = ctypes.CDLL(sys.argv[1])
    rig.pyrig_reg.restype = ctypes.c_void_p
    rig.pyrig_dereg.argtypes = [ctypes.c_void_p]
    rig.pyrig_setup()
    mr = rig.pyrig_reg()
    held = ours(fds().values(), log)
    bad = []
    seen = []
    # subprocess (vfork, close_range in the child), twice: the child lists its own fds
    for close_fds in (True, False):
        r = subprocess.run(["/bin/sh", "-c", "ls -l /proc/$$/fd"], capture_output=True, text=True, close_fds=close_fds)
        seen.append(("subprocess", ours(listed(r.stdout), log)))
    subprocess.run(["/bin/true"], check=True)
    # posix_spawn (glibc's clone(CLONE_VM)), its stdout a pipe
    rd, wr = os.pipe()
    pid = os.posix_spawn("/bin/sh", ["sh", "-c", "ls -l /proc/$$/fd"], os.environ, file_actions=[(os.POSIX_SPAWN_DUP2, wr, 1)])
    os.close(wr)
    text = os.read(rd, 1 << 16).decode()
    os.waitpid(pid, 0)
    os.close(rd)
    seen.append(("posix_spawn", ours(listed(text), log)))
    # multiprocessing with fork
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=child_fds, args=(q,))
    p.start()
    seen.append(("fork", ours(q.get(), log)))
    p.join()
    for how, got in seen:
        if got:
            bad.append(f"{how} child holds {got}")
    # our log keeps its file: a line after the children goes there
    before = os.path.getsize(log)
    rig.pyrig_miss()
    if os.path.getsize(log) <= before:
        bad.append("no line reached the log file after the children")
    still = ours(fds().values(), log)
    if still != held:
        bad.append(f"the parent's fds of gdrshim's changed: {held} -> {still}")
    rig.pyrig_dereg(mr)
    left = [t for t in fds().values() if "nv_dmabuf" in t]
    if left:
        bad.append(f"dma-bufs left after the dereg: {left}")
    print(f"pysub {'FAILED' if bad else 'ok'} held={len(held)} left={len(left)} {'; '.join(bad)}")
    return 1 if bad else 0

if __name__ == "__main__":
    sys.exit(main())
