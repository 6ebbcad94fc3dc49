# dma-bufs of PyTorch tensors (ours): with expandable segments a tensor's memory is a VMM segment
# mapped chunk by chunk, so an export spans several memory objects. Exports go through
# cuMemGetHandleForAddressRange reached with dlsym (ctypes), as a plugin would; each fd is checked
# (fdinfo exp_name nv_dmabuf, size) and closed.
import ctypes
import os

import torch

torch.cuda.init()
cuda = ctypes.CDLL("libcuda.so.1")
get = cuda.cuMemGetHandleForAddressRange
get.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_uint64, ctypes.c_size_t, ctypes.c_int, ctypes.c_ulonglong]
get.restype = ctypes.c_int


def fdinfo(fd):
    d = {}
    with open(f"/proc/self/fdinfo/{fd}") as f:
        for line in f:
            k, _, v = line.partition(":")
            d[k.strip()] = v.strip()
    return d


tensors = [torch.ones(n, dtype=torch.uint8, device="cuda") for n in [2 << 20, 6 << 20, 20 << 20, 64 << 20, 3 << 20, 1 << 30]]
torch.cuda.synchronize()
ok = n = 0
for t in tensors:
    for off, size in [(0, t.numel()), (4096, min(t.numel(), 1 << 21) - 8192)]:
        a = (t.data_ptr() + off) & ~4095
        end = (t.data_ptr() + off + size + 4095) & ~4095
        fd = ctypes.c_int(-1)
        r = get(ctypes.byref(fd), a, end - a, 1, 0)
        n += 1
        if r == 0:
            info = fdinfo(fd.value)
            ok += info.get("exp_name") == "nv_dmabuf" and int(info.get("size", -1)) == end - a
            os.close(fd.value)
        else:
            print(f"export [{a:#x}, +{end - a:#x}) r={r}")
print(f"torch_dmabuf exports={n} ok={ok} expandable={os.environ.get('PYTORCH_CUDA_ALLOC_CONF', '')}")
