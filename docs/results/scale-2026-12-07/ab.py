# A/B of two knobs builds of libgdrshim.so on the scale rig (tests/c/scalebench.c), without the
# shim, old, new, new, old, without: the lower of each build's two runs per figure.
#   python3 ab.py RIG OLD.so NEW.so SAMPLES N...
# RIG: the folder `cargo bench --bench scale` left (scalebench, libscalefake.so, dev/).
import subprocess, sys, os, re
d, old, new, samples = sys.argv[1:5]
libs = {'old': old, 'new': new}
ns = sys.argv[5:] or ['1000', '10000', '100000', '1000000']
def run(cfg, args):
    pre = os.path.join(d, 'libscalefake.so')
    if cfg != 'none': pre = libs[cfg] + ':' + pre
    env = dict(os.environ, LD_LIBRARY_PATH=d, LD_PRELOAD=pre, GDRSHIM_TEST_DEV_DIR=os.path.join(d, 'dev'),
               GDRSHIM_MODE='register', GDRSHIM_ROUTE='nv503c', GDRSHIM_LOG_LEVEL='warn')
    out = subprocess.run([os.path.join(d, 'scalebench')] + args, env=env, capture_output=True, text=True, cwd=d)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()
res = {}
order = ['none', 'old', 'new', 'new', 'old', 'none']
for cfg in order:
    for l in run(cfg, ['ops', samples] + ns):
        m = re.match(r'scale N=(\d+) op=(\S+) p50=(\d+)ns p99=(\d+)ns', l)
        n, op, a, b = int(m[1]), re.sub(r'_with_\d+_regs', '_with_regs', m[2]), int(m[3]), int(m[4])
        k = (cfg, n, op)
        res[k] = (min(res.get(k, (a, b))[0], a), min(res.get(k, (a, b))[1], b))
heap = {}
for cfg in ['none', 'old', 'new']:
    for l in run(cfg, ['heap'] + ns):
        m = re.match(r'scale N=(\d+) heap=(\d+)B', l); heap[(cfg, int(m[1]))] = int(m[2])
ops = ['alloc', 'free', 'alloc_with_regs', 'free_with_regs', 'reg_gpu', 'reg_gpu_again', 'dereg_gpu', 'reg_gpu_with_regs', 'dereg_gpu_with_regs', 'reg_host', 'dereg_host', 'gdrshim_lookup']
print('| live allocations | operation | without p50 / p99 | 9772aec added p50 / p99 | now added p50 / p99 |')
print('|---:|---|---:|---:|---:|')
for op in ops:
    for n in map(int, ns):
        if ('none', n, op) not in res: continue
        b = res[('none', n, op)]
        cell = lambda c: '%d / %d' % (max(res[(c, n, op)][0] - b[0], 0), max(res[(c, n, op)][1] - b[1], 0)) if (c, n, op) in res else 'n/a'
        print('| %d | %s | %d / %d | %s | %s |' % (n, op, b[0], b[1], cell('old'), cell('new')))
print()
print('| live allocations | heap per live allocation, 9772aec (B) | now (B) |')
print('|---:|---:|---:|')
for n in map(int, ns):
    print('| %d | %.1f | %.1f |' % (n, (heap[('old', n)] - heap[('none', n)]) / n, (heap[('new', n)] - heap[('none', n)]) / n))
