# TEMPORARY helper-only smoke test (deleted after the run).
import os, sys, subprocess, torch, tvm_ffi, tvm_ffi.libinfo as info
from pathlib import Path
root = Path(__file__).resolve().parents[2]; jit = root / "python/opmux/kernels/jit"
lib = Path(info.find_libtvm_ffi()); so = sys.argv[1]; extra = sys.argv[2:]
cmd = ["nvcc", "-std=c++17", "-O3", "-Xcompiler", "-fPIC", "-shared", "-gencode", "arch=compute_90a,code=sm_90a", *extra,
       f"-I{jit/'include'}", f"-I{jit/'csrc'}", *[f"-I{p}" for p in info.include_paths()], str(root/"csrc/aot_cuda.cu"), "-o", so, f"-L{lib.parent}", "-ltvm_ffi"]
subprocess.run(cmd, check=True)
print("variant", extra)
if os.environ.get("BUILD_ONLY"): sys.exit(0)
m = tvm_ffi.load_module(so)
def rms(x, w, eps): xf = x.float(); return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(x.dtype)
tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
bad = 0
for dt in ([torch.float32, torch.float16, torch.bfloat16] if not os.environ.get("PERF_ONLY") else []):
    for rows, h in [(1,1),(3,7),(1,129),(5,4099),(0,64),(17,4096),(9,8192),(4,16384),(3,40000),(33,128),(2,64)]:
        for strided in (False, True):
            base = torch.randn(rows, h + (16 if strided else 0), device="cuda").to(dt); x = base[:, 8:8+h] if strided else base
            w = torch.randn(h, device="cuda").to(dt); out = torch.empty_like(x)
            m["rmsnorm_cuda"](out, x, w, 1e-6)
            e1 = (out.float()-rms(x,w,1e-6).float()).abs().max().item() if rows else 0
            xr = x.clone(); r = torch.randn_like(xr); rref = (xr.float()+r.float()).to(dt); xref = rms(rref, w, 1e-6)
            m["fused_add_rmsnorm_cuda"](xr, r, w, 1e-6)
            e2 = (xr.float()-xref.float()).abs().max().item() if rows else 0; eq = torch.equal(r, rref)
            xs = torch.randn(rows, 2*h + (8 if strided else 0), device="cuda").to(dt)[:, (8 if strided else 0):]
            o = torch.empty(rows, h, device="cuda", dtype=dt); m["silu_and_mul_cuda"](o, xs)
            sref = (torch.nn.functional.silu(xs[:, :h].float())*xs[:, h:].float()).to(dt)
            e3 = (o.float()-sref.float()).abs().max().item() if rows else 0
            ok = e1 <= 4*tol[dt]*8 and e2 <= 4*tol[dt]*8 and eq and e3 <= 4*tol[dt]*8
            if not ok: bad += 1; print("FAIL", dt, rows, h, strided, e1, e2, eq, e3)
print("failures:", bad)
# quick timing (events, eager launches)
for T, H in [(4096, 4096), (32768, 4096), (1, 4096)]:
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16); w = torch.randn(H, device="cuda", dtype=torch.bfloat16); out = torch.empty_like(x); r = torch.randn_like(x)
    for name, f, nb in [("rmsnorm", lambda: m["rmsnorm_cuda"](out, x, w, 1e-6), 2), ("fused", lambda: m["fused_add_rmsnorm_cuda"](x, r, w, 1e-6), 4)]:
        for _ in range(5): f()
        s, e = torch.cuda.Event(True), torch.cuda.Event(True); torch.cuda.synchronize(); s.record()
        for _ in range(50): f()
        e.record(); torch.cuda.synchronize(); us = s.elapsed_time(e)/50*1000
        print(f"{name} T={T} H={H}: {us:.2f} us, {nb*T*H*2/us/1e3:.0f} GB/s")
for T in [1, 128, 4096, 16384]:
    x = torch.randn(T, 2*14336, device="cuda", dtype=torch.bfloat16); o = torch.empty(T, 14336, device="cuda", dtype=torch.bfloat16)
    for _ in range(5): m["silu_and_mul_cuda"](o, x)
    s, e = torch.cuda.Event(True), torch.cuda.Event(True); torch.cuda.synchronize(); s.record()
    for _ in range(50): m["silu_and_mul_cuda"](o, x)
    e.record(); torch.cuda.synchronize(); us = s.elapsed_time(e)/50*1000
    print(f"silu T={T}: {us:.2f} us, {3*T*14336*2/us/1e3:.0f} GB/s")
