"""Block-scaled fp8 GEMM (``w8a8_block_fp8_matmul``): one declaration (``ops/_decl.py``).

``out[m, n] = sum_kb a_scale[m, kb] * b_scale[n // 128, kb] * sum_{k in kb} a[m, k] * b[n, k]``:
a [*T, K] e4m3 activations with 1x128 scales, b [N, K] e4m3 weights with 128x128 scales (the
DeepSeek-V3 / Qwen3 / Llama fp8 checkpoints' recipe), each 128-wide K block summed in fp32.

Kernel arguments: ``(out, a, b, a_scale, b_scale)``: out [M, N] (bf16, fp16 or fp32) and a [M, K]
as rows views with unit last stride, b [N, K] with unit last stride, a_scale [M, ceil(K/128)]
float32 with unit stride on one of its dims (row-major as vLLM writes it, or the transposed view
of SGLang's / DeepGEMM's column-major scales), b_scale [ceil(N/128), ceil(K/128)] float32 with
unit last stride. Tails (N = 7748, K = 3884) are the kernels' business, not the caller's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...errors import CallRefused
from ...spec import Requirement
from .._contract import FP8, Arg, Contract, Rule, Scalar
from .._decl import declare
from . import skinny_cuda

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

BLOCK = 128  # the recipe's block: 1x128 activation and 128x128 weight scales
OUT_DTYPES = ("bfloat16", "float16", "float32")

CONTRACT = Contract(
    "w8a8_block",
    (
        Arg("a", "*T, K", dtypes=FP8),
        Rule("K > 0", "a has shape {tuple(a.shape)}; K (its last dim) must be at least 1"),
        Arg("b", "N, K", dtypes=FP8, device_of="a", layout="matrix"),
        Arg("a_scale", "*T, cdiv(K, 128)", dtypes=("float32",), device_of="a", layout="strided_unit"),
        Arg("b_scale", "cdiv(N, 128), cdiv(K, 128)", dtypes=("float32",), device_of="a", layout="matrix"),
        Scalar("out_dtype", "dtype", choices=OUT_DTYPES, default="bfloat16"),
        Arg("out", "*T, N", dtype_from="out_dtype", device_of="a", out=True),
    ),
    kernel=("out", "a", "b", "a_scale", "b_scale"),
    result="out",
)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def reference(
    a: Tensor,
    b: Tensor,
    a_scale: Tensor,
    b_scale: Tensor,
    out_dtype: torch.dtype | None = None,
    out: Tensor | None = None,
) -> Tensor:
    """The definition, one 128-wide K block at a time in float32 (the parity oracle)."""
    k, n = a.shape[-1], b.shape[0]
    a2, bf = a.reshape(-1, k).float(), b.float()
    sa = a_scale.reshape(-1, a_scale.shape[-1])
    sb = b_scale.repeat_interleave(BLOCK, dim=0)[:n]  # [N, Kt]: each row's weight block scales
    acc = torch.zeros(a2.shape[0], n, dtype=torch.float32, device=a.device)
    for kb in range(_cdiv(k, BLOCK)):
        ks = slice(kb * BLOCK, min(k, (kb + 1) * BLOCK))
        acc += (a2[:, ks] @ bf[:, ks].T) * sa[:, kb : kb + 1] * sb[:, kb]
    dtype = out.dtype if out is not None else (out_dtype or torch.bfloat16)
    y = acc.to(dtype).reshape(*a.shape[:-1], n)
    return y if out is None else out.copy_(y)


def torch_w8a8(out: Tensor, a: Tensor, b: Tensor, a_scale: Tensor, b_scale: Tensor) -> None:
    """Dequantize both operands to float32 and multiply: what a user without a kernel would do."""
    m, k = a.shape
    n = b.shape[0]
    if not m or not n:
        return
    ad = a.float() * a_scale.repeat_interleave(BLOCK, dim=1)[:, :k]
    bd = b.float() * b_scale.repeat_interleave(BLOCK, dim=0)[:n].repeat_interleave(BLOCK, dim=1)[:, :k]
    torch.mm(ad, bd.T, out=out) if out.dtype == torch.float32 else out.copy_(ad @ bd.T)


# -- the CUDA kernel's own limits (TMA) ------------------------------------------------------------
def native_supports(
    a: Any, b: Any, a_scale: Any, b_scale: Any, out_dtype: Any = None, out: Any = None
) -> str | None:
    """Where the CUTLASS kernel (TMA) takes this call: 16-byte aligned a, b and out, and row
    strides of 16 bytes' multiples (jit/csrc/gemm_cuda.cu states them). Anything else runs on the
    next backend (Triton), which takes every layout of the contract. CPU calls: no limit."""
    try:
        if a.device.type != "cuda":
            return None
        cap = torch.cuda.get_device_capability(a.device)
        if cap != (9, 0):
            return f"the CUDA kernel is built for sm_90a (Hopper) only; this GPU is sm_{cap[0]}{cap[1]}"
        m, n = a.numel() // max(a.shape[-1], 1), b.shape[0]
        item = (out.dtype if out is not None else (out_dtype or torch.bfloat16)).itemsize
        ldo = out.stride(-2) if out is not None and out.dim() >= 2 else n
        lda = a.stride(-2) if a.dim() >= 2 else a.shape[-1]
        bad = [
            name
            for name, ok in (
                ("a's data", a.data_ptr() % 16 == 0),
                ("b's data", b.data_ptr() % 16 == 0),
                ("out's data", out is None or out.data_ptr() % 16 == 0),
                (f"a's row stride {lda}", m <= 1 or lda % 16 == 0),
                (f"b's row stride {b.stride(0)}", n <= 1 or b.stride(0) % 16 == 0),
                (f"out's row stride {ldo} x {item} bytes", m <= 1 or ldo * item % 16 == 0),
            )
            if not ok
        ]
    except Exception:  # not tensors: the contract names the problem
        return None
    if bad:
        return "the CUDA (TMA) kernel needs 16-byte aligned data and row strides; here: " + ", ".join(bad)
    return None


# -- cuBLASLt through torch._scaled_mm (sm_90, CUDA 12.9+) ---------------------------------------
def scaled_mm_supports(
    a: Any, b: Any, a_scale: Any, b_scale: Any, out_dtype: Any = None, out: Any = None
) -> str | None:
    """Where cuBLASLt's blockwise fp8 GEMM computes this call right: K and N multiples of 16
    (its leading dimensions), a bf16 output, CUDA 12.9+. Everything else is refused with the
    reason (the call then runs on the next backend); M and the scales' layout are made right by
    ``scaled_mm`` itself."""
    try:
        k, n = a.shape[-1], b.shape[0]
        dtype = out.dtype if out is not None else (out_dtype or torch.bfloat16)
    except Exception:  # not tensors: the contract names the problem
        return None
    if a.device.type != "cuda":
        return None
    if k % 16 or n % 16:
        return f"cuBLASLt's blockwise fp8 GEMM needs K and N multiples of 16 (K={k}, N={n})"
    kt, nt = -(-k // 128), -(-n // 128)
    if k % 128 or (kt % 4 and nt > 1):
        # measured on the H200 (cuBLASLt of CUDA 13.0): with ceil(K/128) not a multiple of 4 and
        # more than one 128-row weight block its results are silently wrong (relative error
        # 0.2 to 1e17 at K = 256, 384, 640, 768, 1280), and a padded scale stride is refused
        return (
            f"cuBLASLt's blockwise fp8 GEMM computes wrong results unless K is a multiple of 512 "
            f"(or of 128 with N <= 128); K={k}, N={n}"
        )
    if dtype != torch.bfloat16:
        return f"cuBLASLt's blockwise fp8 GEMM writes bfloat16 only, not {dtype}"
    cuda = tuple(int(v) for v in (torch.version.cuda or "0.0").split(".")[:2])
    if cuda < (12, 9):
        return f"cuBLASLt's blockwise fp8 GEMM needs CUDA 12.9+; torch is built with {torch.version.cuda}"
    return None


def scaled_mm(out: Tensor, a: Tensor, b: Tensor, a_scale: Tensor, b_scale: Tensor) -> None:
    """cuBLASLt's 1x128 x 128x128 blockwise GEMM, with what it silently gets wrong made right:
    M padded to a multiple of 4, the activation scales laid out M-major with that padded stride,
    the weight scales dense. Each fix is one kernel at most, and none where the caller's layout
    is already cuBLASLt's (M a multiple of 4, column-major scales as SGLang and DeepGEMM keep them)."""
    m, k = a.shape
    n = b.shape[0]
    if not m or not n:
        return
    why = scaled_mm_supports(a, b, a_scale, b_scale, out_dtype=out.dtype)
    if why:  # forced onto a call it would compute wrong or refuse: say so, compute nothing
        raise CallRefused("scaled_mm", why)
    mp = -(-m // 4) * 4
    a_in = a
    if mp != m or a.stride(0) != k:  # one pad kernel (on the bytes: fp8 has no pad of its own)
        a_in = torch.nn.functional.pad(a.view(torch.uint8), (0, 0, 0, mp - m)).view(a.dtype)
    if mp == m and a_scale.stride(0) == 1 and a_scale.stride(1) == m:
        sa = a_scale  # M-major already: [M, Kt] with strides (1, M)
    else:  # [Kt, Mp] dense, its transpose M-major; padded rows' scales 1 (their products are dropped)
        sa = (
            torch.nn.functional.pad(a_scale.t(), (0, mp - m), value=1.0).T
            if mp != m
            else a_scale.t().contiguous().T
        )
    sb = b_scale.contiguous()
    if mp == m and out.is_contiguous():  # written in place: no copy of the result
        torch._scaled_mm(a_in, b.T, scale_a=sa, scale_b=sb.T, out_dtype=out.dtype, out=out)
        return
    y = torch._scaled_mm(a_in, b.T, scale_a=sa, scale_b=sb.T, out_dtype=out.dtype)
    out.copy_(y[:m])


w8a8_block_fp8_matmul = declare(
    "gemm.w8a8_block_fp8_matmul",
    "(Tensor a, Tensor b, Tensor a_scale, Tensor b_scale, ScalarType? out_dtype=None, "
    "Tensor(a!)? out=None) -> Tensor",
    doc="a [*T, K] e4m3 (1x128 scales a_scale [*T, ceil(K/128)]) x b [N, K] e4m3 (128x128 scales "
    "b_scale [ceil(N/128), ceil(K/128)]) -> [*T, N] in out_dtype (bfloat16, float16, float32; "
    "default bfloat16); each 128-wide K block summed in fp32",
    contract=CONTRACT,
    reference=reference,
    torch=torch_w8a8,
    vendor=(
        (
            "scaled_mm",
            scaled_mm,
            Requirement(
                devices=("cuda",),
                dtypes=FP8,
                sm_min=90,
                sm_max=90,
                predicate="opmux.kernels.ops.gemm.op:scaled_mm_supports",
            ),
        ),
        (
            # at most 16 rows: opmux's own unit (jit/csrc/gemm_skinny_cuda.cu); its predicate
            # refuses what the unit does not take
            skinny_cuda.BACKEND,
            skinny_cuda.matmul,
            Requirement(
                devices=("cuda",),
                dtypes=FP8,
                sm_min=89,
                predicate="opmux.kernels.ops.gemm.skinny_cuda:supports",
            ),
        ),
    ),
    dtypes=FP8,
    native_predicate="opmux.kernels.ops.gemm.op:native_supports",
    # H200 (docs/benchmarks/gemm_h200.md): cuBLASLt first where it computes the call right, then
    # the CUTLASS kernel (TMA-aligned layouts on sm_90a), then Triton (every layout, every GPU),
    # then the skinny-M kernel (a select table puts it first where it was measured faster)
    priority=(("cuda", ("scaled_mm", "aot", "jit", "triton", skinny_cuda.BACKEND, "torch")),),
    tolerances=(
        # float32 results: Hopper's fp8 tensor-core MMA (the CUTLASS kernel's WGMMA) sums each
        # 128-wide block at reduced precision before the fp32 promotion: up to 6e-4 relative
        # measured on the H200 (vLLM's criterion is a mean relative 1e-3)
        ("float32", (1e-3, 1e-3)),
        ("float16", (2e-3, 2e-3)),
        ("bfloat16", (1.6e-2, 1.6e-2)),
        ("float8_e4m3fn", (0.0, 0.0)),
    ),
)
