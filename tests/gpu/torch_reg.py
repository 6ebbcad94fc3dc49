# PyTorch tensors registered with a (stub) NIC under gdrshim's register mode, via ctypes (dlsym).
import ctypes, torch
ib = ctypes.CDLL("libibverbs.so.1")
ib.ibv_reg_mr.restype = ctypes.c_void_p
ib.ibv_reg_mr.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
ib.ibv_dereg_mr.argtypes = [ctypes.c_void_p]
ts = [torch.empty(n, dtype=torch.uint8, device="cuda") for n in (1 << 10, 1 << 20, 5 << 20, 33 << 20, 256 << 20)]
ok = 0
for t in ts:
    p = t.data_ptr(); a = p & ~4095; l = ((p + t.numel() + 4095) & ~4095) - a
    mr = ib.ibv_reg_mr(None, a, l, 0xF)
    ok += bool(mr)
    ib.ibv_dereg_mr(mr)
x = torch.randn(1024, 1024, device="cuda"); y = (x @ x).sum().item()
print(f"torch_reg registered={ok}/{len(ts)} matmul={y:.3f}")
