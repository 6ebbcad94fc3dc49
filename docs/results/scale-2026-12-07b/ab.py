# A/B/... of knobs builds of libgdrshim.so on the scale rig (tests/c/scalebench.c): without the
# shim, then each build, then each again in reverse order, then without: per figure the lower of
# each build's two runs, printed as the time added over the run without the shim (the export on
# the DMA-BUF route; a build whose rig makes no dma-buf fails there: use a rig of this branch).
#   python3 ab.py RIG SAMPLES LABEL=LIB.so [LABEL=LIB.so ...] -- N...
# RIG: the folder `cargo bench --bench scale` left (scalebench, libscalefake.so, dev/).
import subprocess, sys, os, re
d, samples = sys.argv[1:3]
cut = sys.argv.index('--')
libs = dict(a.split('=', 1) for a in sys.argv[3:cut])
ns = sys.argv[cut + 1:]
def run(cfg, args, route='nv503c'):
    pre = os.path.join(d, 'libscalefake.so')
    if cfg != 'none': pre = libs[cfg] + ':' + pre
    env = dict(os.environ, LD_LIBRARY_PATH=d, LD_PRELOAD=pre, GDRSHIM_TEST_DEV_DIR=os.path.join(d, 'dev'),
               GDRSHIM_MODE='register', GDRSHIM_ROUTE=route, GDRSHIM_LOG_LEVEL='warn')
    out = subprocess.run([os.path.join(d, 'scalebench')] + args, env=env, capture_output=True, text=True, cwd=d)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()
res = {}
order = ['none'] + list(libs) + list(libs)[::-1] + ['none']
for cfg in order:
    # gdrshim_export_dmabuf on the DMA-BUF route, then the rest on the NV503C route
    for l in run(cfg, ['export', samples] + ns, 'dmabuf') + run(cfg, ['ops', samples] + ns):
        m = re.match(r'scale N=(\d+) op=(\S+) p50=(\d+)ns p99=(\d+)ns', l)
        n, op, a, b = int(m[1]), re.sub(r'_with_\d+_regs', '_with_regs', m[2]), int(m[3]), int(m[4])
        k = (cfg, n, op)
        res[k] = (min(res.get(k, (a, b))[0], a), min(res.get(k, (a, b))[1], b))
heap = {}
for cfg in ['none'] + list(libs):
    for l in run(cfg, ['heap'] + ns):
        m = re.match(r'scale N=(\d+) heap=(\d+)B', l); heap[(cfg, int(m[1]))] = int(m[2])
ops = sorted({k[2] for k in res}, key=lambda o: (o.startswith('export'), o))
print('| live allocations | operation | without p50 / p99 | ' + ' | '.join('%s added p50 / p99' % c for c in libs) + ' |')
print('|---:|---|---:|' + '---:|' * len(libs))
for op in ops:
    for n in map(int, ns):
        if ('none', n, op) not in res: continue
        b = res[('none', n, op)]
        cell = lambda c: '%d / %d' % (max(res[(c, n, op)][0] - b[0], 0), max(res[(c, n, op)][1] - b[1], 0)) if (c, n, op) in res else 'n/a'
        print('| %d | %s | %d / %d | %s |' % (n, op, b[0], b[1], ' | '.join(cell(c) for c in libs)))
print()
print('| live allocations | ' + ' | '.join('%s heap per live allocation (B)' % c for c in libs) + ' |')
print('|---:|' + '---:|' * len(libs))
for n in map(int, ns):
    print('| %d | %s |' % (n, ' | '.join('%.1f' % ((heap[(c, n)] - heap[('none', n)]) / n) for c in libs)))
