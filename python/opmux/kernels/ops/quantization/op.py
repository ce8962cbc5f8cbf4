"""fp8 / int8 quantization: one declaration per op (``ops/_decl.py``).

Semantics (all backends, computed in fp32):

* per token: ``amax = max |x[t, :]|`` (clamped to ``scale_ub`` when given),
  ``scale = max(amax / 448, 1 / (448 * 512))``;
* per tensor: dynamic ``scale = max |x| / 448`` over the whole tensor (an all-zero tensor gets
  scale 0, hence NaN outputs), or static: the caller's one-element ``scale``;
* static with group scales (``static_quant_fp8``): ``scale`` [Gm, Gn] (any strides; Gm divides
  the rows T, Gn the hidden size H): element [t, h] uses ``scale[t // (T / Gm), h // (H / Gn)]``,
  i.e. per tensor ([1, 1]), per token ([T, 1]), per channel ([1, H]) or 2-D blocks, as vLLM's
  ``static_scaled_fp8_quant`` with a ``group_shape``;
* per token group: ``scale = max(max |x[t, group]|, eps) / M`` (M = 448 for fp8, 127 for int8);
  with ``scale_ue8m0`` the scale is rounded UP to a power of two (exactly, on its bits: the
  UE8M0 format of DeepGEMM / sgl-kernel) and q is computed against the rounded scale;
* then ``q = e4m3(x * (1 / scale))``: the reciprocal and the divisions are IEEE fp32 (round to
  nearest even), the fp8 conversion rounds to nearest even and saturates to +-448. With
  ``divide_by_scale`` every element is divided instead, ``q = e4m3(x / scale)`` (vLLM's per-token
  and group kernels divide; bit-equality with them needs it), and a CUDA tensor's group scale is
  ``max(amax, eps) * fp32(1 / 448)``, vLLM's arithmetic on a GPU (``group_scale_of``). int8: ``q = trunc(clamp(x * (1 /
  scale), -128, 127))``, truncated toward zero as sgl-kernel's and vLLM's group int8 kernels
  convert (``int8_t(float)``); NaN -> 0.

Outputs go to the caller's ``out_q`` / ``out_scale`` when given (written in place by every
backend's kernel, nothing copied): ``out_q`` of x's shape (rows may be strided, last dim dense);
per-token ``out_scale`` with one element per row (``[..., 1]`` or ``[T]``), per-tensor one
element; group scales ``[..., G]`` (or ``[T, G]``) float32 with ANY non-negative strides
(row-major, column-major, DeepGEMM's TMA-aligned column-major), or, with ``scale_ue8m0``,
sgl-kernel's packed layout: int32 ``[T, ceil(G / 4)]`` (any strides; sgl allocates it
TMA-aligned column-major), four UE8M0 exponent bytes per int32, byte ``g % 4`` of element
``[t, g // 4]`` (little endian); padding bytes past G are left as they are. The op's own group
scales are row-major, column-major (``column_major_scales``: a ``[T, G]`` view of a ``[G, T]``
tensor) or TMA-aligned column-major (``scale_tma_aligned`` too: a ``[G, ceil(T / 4) * 4]``
tensor, viewed ``[T, G]``). Passing ``out_q`` / ``out_scale`` under ``torch.compile`` is not
supported yet (the library op would return aliases of its inputs): the contract says so.

fp8 tensors cross into the native kernels as ``uint8`` views (a DLPack-safe byte view).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._common import FP8_E4M3_TOLERANCE
from .._contract import FLOATS, FP8, Arg, Contract, Packed, Rule, Scalar
from .._decl import declare

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

_PT = "quantization.per_token_quant_fp8"
_PTT = "quantization.per_tensor_quant_fp8"
_PG = "quantization.per_token_group_quant_fp8"
_PGI = "quantization.per_token_group_quant_int8"
_PS = "quantization.static_quant_fp8"

FP8_MAX = 448.0
INT8_MAX = 127.0
#: smallest per-token scale (vLLM's MIN_SCALING_FACTOR): keeps 1/scale finite for zero rows
MIN_SCALE = 1.0 / (FP8_MAX * 512.0)


def _to_fp8(y: Tensor) -> Tensor:
    """fp32 -> e4m3fn, round to nearest even, saturating (torch's cast maps >= 480 to NaN)."""
    return y.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def _to_int8(y: Tensor) -> Tensor:
    """fp32 -> int8, clamped to [-128, 127] and truncated toward zero; NaN -> 0."""
    y = torch.where(torch.isnan(y), torch.zeros_like(y), y.clamp(-128.0, 127.0))
    return torch.trunc(y).to(torch.int8)


# -- the contracts (ops/_contract.py; their checks are generated into _contracts.py) -------------
_F32 = ("float32",)
#: x [*T, H] float rows, H >= 1
_X = Arg("x", "*T, H", dtypes=FLOATS, note=" with H >= 1")
_H = Rule("H >= 1", "x has shape {tuple(x.shape)}, expected [..., H] with H >= 1")
#: the CUDA kernels index rows and the hidden dim with 32-bit ints
_CUDA_ROWS = Rule(
    "prod(T) <= 2**31 - 1", "x has {prod(T)} rows; at most 2^31 - 1 on CUDA", device="cuda", name="cuda_rows"
)
_CUDA_H = Rule(
    "H <= 2**31 - 1",
    "x's last dim {H} is too large; at most 2^31 - 1 on CUDA",
    device="cuda",
    name="cuda_hidden",
)


def _q(dtypes: tuple[str, ...] = FP8, name: str = "out_q", width: str = "H") -> Arg:
    """The quantized output, x's shape (fp8 crosses into the kernels as its bytes)."""
    return Arg(
        name,
        f"*T, {width}",
        dtypes=dtypes,
        device_of="x",
        out=True,
        note=" like x" if width == "H" else " ([..., d]: x's half width)",
        kernel_dtype="uint8" if dtypes == FP8 else "",
    )


#: x [*T, H] -> (q, one scale per row): kernel arguments (q, scales [rows], x, scale_ub or empty, divide)
PER_TOKEN = Contract(
    "per_token",
    (
        _X,
        _H,
        _CUDA_ROWS,
        _CUDA_H,
        Arg("scale_ub", "", dtypes=_F32, device_of="x", layout="element"),
        Scalar("divide_by_scale", "bool"),
        _q(),
        Arg(
            "out_scale",
            "*T, 1",
            dtypes=_F32,
            device_of="x",
            out=True,
            layout="flat",
            note=" (one per row of x)",
        ),
    ),
    kernel=("out_q", "out_scale", "x", "scale_ub", "divide_by_scale"),
    result=("out_q", "out_scale"),
)
#: x [*T, H] -> (q, one scale): kernel arguments (q, scale [1], x, static scale or empty)
PER_TENSOR = Contract(
    "per_tensor",
    (
        _X,
        _H,
        _CUDA_ROWS,
        _CUDA_H,
        Arg("scale", "", dtypes=_F32, device_of="x", layout="element"),
        _q(),
        Arg("out_scale", "1", dtypes=_F32, device_of="x", out=True, layout="flat", note=" (one per tensor)"),
    ),
    kernel=("out_q", "out_scale", "x", "scale"),
    result=("out_q", "out_scale"),
)
#: x [*T, H], scale [Gm, Gn] (or one element) -> q: kernel arguments (q, x, scale, rows per block, columns per block)
STATIC = Contract(
    "static_blocks",
    (
        _X,
        _H,
        _CUDA_ROWS,
        _CUDA_H,
        Arg("scale", "Gm, Gn", dtypes=_F32, device_of="x", layout="blocks", note=" (2-D group scales)"),
        Rule(
            "Gm > 0 and Gn > 0 and prod(T) % Gm == 0 and H % Gn == 0",
            "scale has shape {tuple(scale.shape)}: its dims must divide x's rows and hidden size {(prod(T), H)}",
        ),
        _q(name="out"),
    ),
    kernel=("out", "x", "scale", "max(prod(T) // Gm, 1)", "H // Gn"),
    result="out",
)


#: x [*T, 2 * d] gate / up halves (the fused silu_and_mul forms): the width quantized is d
_X_PAIRS = Arg(
    "x", "*T, D2", dtypes=FLOATS, shape_hint="its last dim must be even ([..., 2*d]) and at least 2"
)
_PAIRS = Rule(
    "D2 >= 2 and D2 % 2 == 0",
    "x has shape {tuple(x.shape)}; its last dim must be even ([..., 2*d]) and at least 2",
)
_CUDA_D2 = Rule(
    "D2 <= 2**31 - 1",
    "x's last dim {D2} is too large; at most 2^31 - 1 on CUDA",
    device="cuda",
    name="cuda_pairs",
)


def _group_contract(name: str, q: tuple[str, ...], *flags: Scalar, fused: bool = False) -> Contract:
    """x [*T, H] -> (q, a scale per group of ``group_size``): kernel arguments (q, scales
    [rows, G] of any strides, x, group_size, eps, *flags). ``fused``: x [*T, 2 * d] and the
    groups over d (``silu(x[..., :d]) * x[..., d:]``, quantized)."""
    width = "D2 // 2" if fused else "H"
    scales = Arg(
        "out_scale",
        f"*T, {width} // group_size",
        dtypes=_F32,
        device_of="x",
        out=True,
        layout="scales",
        note=" (one per group)",
        alloc=(("scale_tma_aligned", "tma_columns"), ("column_major_scales", "columns")),
        packed=Packed(
            "int32",
            "scale_ue8m0",
            f"cdiv({width} // group_size, 4)",
            "packed UE8M0",
            "ceil(G / 4) packed UE8M0 int32",
        ),
    )
    multiple = (
        Rule(
            "(D2 // 2) % group_size == 0",
            "x's half width {D2 // 2} (its last dim / 2) is not a multiple of group_size {group_size}",
            name="half_group_multiple",
        )
        if fused
        else Rule(
            "H % group_size == 0",
            "x's last dim {H} is not a multiple of group_size {group_size}",
            name="group_multiple",
        )
    )
    shape: tuple[Arg | Rule, ...] = (
        (_X_PAIRS, _PAIRS, _CUDA_ROWS, _CUDA_D2) if fused else (_X, _H, _CUDA_ROWS, _CUDA_H)
    )
    items: tuple[Arg | Scalar | Rule, ...] = (
        *shape,
        Scalar("group_size", "positive_int"),
        multiple,
        Scalar("eps", "positive"),
        Scalar("column_major_scales", "bool"),
        Scalar("scale_tma_aligned", "bool"),
        Rule(
            "column_major_scales or not scale_tma_aligned",
            "scale_tma_aligned needs column_major_scales=True (TMA-aligned column-major scales)",
        ),
        *flags,
        _q(q, width=width),
        scales,
    )
    kernel = ("out_q", "out_scale", "x", "group_size", "eps", *(f.name for f in flags))
    return Contract(name, items, kernel=kernel, result=("out_q", "out_scale"))


GROUP = _group_contract("group", FP8, Scalar("scale_ue8m0", "bool"), Scalar("divide_by_scale", "bool"))
GROUP_INT8 = _group_contract("group_int8", ("int8",))
SILU_GROUP = _group_contract("silu_group", FP8, Scalar("scale_ue8m0", "bool"), fused=True)


# -- references (the oracle calls them with float64 tensors, out buffers included) -------------
def _write(buf: Tensor | None, value: Tensor) -> Tensor:
    if buf is None:
        return value
    return buf.copy_(value.reshape(buf.shape) if value.numel() == buf.numel() else value)


def ue8m0(scale: Tensor) -> Tensor:
    """Positive fp32 scales rounded up to a power of two, exactly (on the bits); NaN / inf kept."""
    bits = scale.view(torch.int32)
    e = (bits >> 23) & 0xFF
    up = ((e + ((bits & 0x7FFFFF) != 0).to(torch.int32)) << 23).view(torch.float32)
    return torch.where(e == 0xFF, scale, up)


def pack_ue8m0(scale: Tensor, into: Tensor) -> Tensor:
    """``into`` (int32 [T, ceil(G/4)], any strides) gets the exponent bytes of ``scale`` [T, G]
    (byte g % 4 of element [t, g // 4]); its padding bytes are kept."""
    t, g = scale.shape
    exps = ((scale.contiguous().view(torch.int32) >> 23) & 0xFF).to(torch.uint8)
    # a dense copy first: a column-major [t, 1] ``into`` is already "contiguous" (its stride(-1)
    # is not 1), and its byte view would fail
    cur = (
        torch.empty(into.shape, dtype=torch.int32, device=into.device)
        .copy_(into)
        .view(torch.uint8)
        .view(t, -1)
    )
    cur[:, :g] = exps
    return into.copy_(cur.view(torch.int32).view(into.shape))


def ref_per_token(
    x: Tensor,
    scale_ub: Tensor | None = None,
    divide_by_scale: bool = False,
    out_q: Tensor | None = None,
    out_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    xf = x.float()
    amax = xf.abs().amax(-1, keepdim=True)
    if scale_ub is not None:
        amax = torch.minimum(amax, scale_ub.float().reshape(()))
    scale = (amax / FP8_MAX).clamp(min=MIN_SCALE)
    q = _to_fp8(xf / scale if divide_by_scale else xf * scale.reciprocal())
    return _write(out_q, q), _write(out_scale, scale)


def ref_per_tensor(
    x: Tensor, scale: Tensor | None = None, out_q: Tensor | None = None, out_scale: Tensor | None = None
) -> tuple[Tensor, Tensor]:
    xf = x.float()
    if scale is not None:
        s = scale.float().reshape(1)
    else:
        s = (xf.abs().amax() if x.numel() else xf.new_zeros(())).reshape(1) / FP8_MAX
    return _write(out_q, _to_fp8(xf * s.reciprocal())), _write(out_scale, s.clone())


def _expand_scale(scale: Tensor, t: int, h: int) -> Tensor:
    s2 = scale.float().reshape(1, 1) if scale.numel() == 1 and scale.dim() <= 1 else scale.float()
    return s2.repeat_interleave(t // s2.shape[0], 0).repeat_interleave(h // s2.shape[1], 1)


def ref_static(x: Tensor, scale: Tensor, out: Tensor | None = None) -> Tensor:
    h = x.shape[-1]
    xf = x.float().reshape(-1, h)
    q = _to_fp8(xf * _expand_scale(scale, xf.shape[0], h).reciprocal()).view(x.shape)
    return q if out is None else out.copy_(q)


def group_scale_of(m: Tensor, maxv: float, recip: bool) -> Tensor:
    """A group's scale from ``m = max(amax, eps)``: ``m / maxv`` (IEEE division), or with
    ``recip`` ``m * fp32(1 / maxv)`` (the product rounded once).

    ``recip`` is ``divide_by_scale and x.is_cuda`` (``uses_recip``): with ``divide_by_scale`` the
    op follows vLLM, whose arithmetic depends on the device. On CUDA its test's reference is
    torch's division by a Python scalar, which multiplies by the float32 reciprocal (vLLM's
    Triton kernel, ``_absmax / fp8_max``, computes an approximate division, ``div.full.f32``,
    observed bit-equal to that product on the H200 test cases); on the CPU torch divides. The
    two forms differ in the last bit for about 40 % of groups, which moves an fp8 subnormal q
    across a rounding midpoint (one subnormal step, 33 % relative). Every backend on one device
    computes the same form (the CUDA kernel and Triton take ``recip`` too; the CPU kernel
    divides)."""
    if recip:
        return m * torch.tensor(1.0 / maxv, dtype=torch.float32)  # a CPU scalar: a float32 multiply
    return m / m.new_full((), maxv)  # a 0-d tensor on m's device (no copy, graph-safe): IEEE


def uses_recip(x: Tensor, divide: bool) -> bool:
    """Whether the group scale of ``x`` takes the reciprocal form (see ``group_scale_of``)."""
    return divide and x.is_cuda


def _ref_group_scale(
    x: Tensor, group_size: int, eps: float, maxv: float, ue: bool, divide: bool = False
) -> tuple[Tensor, Tensor]:
    h = x.shape[-1]
    xg = x.float().reshape(*x.shape[:-1], h // group_size, group_size)
    scale = group_scale_of(xg.abs().amax(-1, keepdim=True).clamp(min=eps), maxv, uses_recip(x, divide))
    return xg, ue8m0(scale) if ue else scale


def _layout(scale: Tensor, column_major: bool, tma: bool) -> Tensor:
    if not column_major:
        return scale
    t, g = scale.reshape(-1, scale.shape[-1]).shape
    m = (t + 3) // 4 * 4 if tma else t
    s2 = torch.zeros((g, m), dtype=scale.dtype, device=scale.device).t()[:t]
    return s2.copy_(scale.reshape(t, g)).view(scale.shape)


def ref_group(
    x: Tensor,
    group_size: int = 128,
    eps: float = 1e-10,
    column_major_scales: bool = False,
    scale_tma_aligned: bool = False,
    scale_ue8m0: bool = False,
    divide_by_scale: bool = False,
    out_q: Tensor | None = None,
    out_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    xg, scale = _ref_group_scale(x, group_size, eps, FP8_MAX, scale_ue8m0, divide_by_scale)
    q = _to_fp8(xg / scale if divide_by_scale else xg * scale.reciprocal()).flatten(-2)
    scale = scale.squeeze(-1)
    if out_scale is not None and out_scale.dtype == torch.int32:
        pack_ue8m0(scale.reshape(-1, scale.shape[-1]), out_scale.view(-1, out_scale.shape[-1]))
        return _write(out_q, q), out_scale
    return _write(out_q, q), _write(out_scale, _layout(scale, column_major_scales, scale_tma_aligned))


def _silu_mul(x: Tensor) -> Tensor:
    """``silu(x[..., :d]) * x[..., d:]`` in float32 (float64 stays float64), not rounded to x's dtype."""
    d = x.shape[-1] // 2
    xf = x if x.dtype == torch.float64 else x.float()
    g = xf[..., :d]
    return g * torch.sigmoid(g) * xf[..., d:]


def ref_silu_group(
    x: Tensor,
    group_size: int = 128,
    eps: float = 1e-10,
    column_major_scales: bool = False,
    scale_tma_aligned: bool = False,
    scale_ue8m0: bool = False,
    out_q: Tensor | None = None,
    out_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    return ref_group(
        _silu_mul(x),
        group_size,
        eps,
        column_major_scales,
        scale_tma_aligned,
        scale_ue8m0,
        False,
        out_q,
        out_scale,
    )


def ref_group_int8(
    x: Tensor,
    group_size: int = 128,
    eps: float = 1e-10,
    column_major_scales: bool = False,
    scale_tma_aligned: bool = False,
    out_q: Tensor | None = None,
    out_scale: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    xg, scale = _ref_group_scale(x, group_size, eps, INT8_MAX, False)
    q = _to_int8(xg * scale.reciprocal()).flatten(-2)
    scale = scale.squeeze(-1)
    return _write(out_q, q), _write(out_scale, _layout(scale, column_major_scales, scale_tma_aligned))


# -- torch backends (the kernel arguments of check) ----------------------------------------------
def torch_per_token(q: Tensor, s: Tensor, x: Tensor, ub: Tensor, divide: bool) -> None:
    xf = x.float()
    amax = torch.linalg.vector_norm(xf, float("inf"), dim=-1, keepdim=True)  # exact max |x|
    if ub.numel():
        amax = amax.clamp(max=ub.reshape(()))
    scale = torch.clamp_min(amax / FP8_MAX, MIN_SCALE)
    y = xf / scale if divide else xf * scale.reciprocal()
    q.view(torch.float8_e4m3fn).copy_(torch.clamp(y, -FP8_MAX, FP8_MAX))
    s.copy_(scale.view(-1))


def torch_per_tensor(q: Tensor, s: Tensor, x: Tensor, static: Tensor) -> None:
    xf = x.float()
    if static.numel():
        scale = static.reshape(())
    elif x.numel():
        scale = torch.linalg.vector_norm(xf, float("inf")) / FP8_MAX
    else:
        scale = torch.zeros((), dtype=torch.float32, device=x.device)
    q.view(torch.float8_e4m3fn).copy_(torch.clamp(xf * scale.reciprocal(), -FP8_MAX, FP8_MAX))
    s.copy_(scale.reshape(1))


def torch_static(q: Tensor, x: Tensor, s: Tensor, gm: int, gn: int) -> None:
    xf = x.float()
    inv = s.repeat_interleave(gm, 0)[: x.shape[0]].repeat_interleave(gn, 1).reciprocal()
    q.view(torch.float8_e4m3fn).copy_(torch.clamp(xf * inv, -FP8_MAX, FP8_MAX))


def _torch_group_scale(
    x: Tensor, gs: int, eps: float, maxv: float, ue: bool, divide: bool = False
) -> tuple[Tensor, Tensor]:
    xg = x.float().reshape(x.shape[0], x.shape[1] // gs, gs)
    amax = torch.linalg.vector_norm(xg, float("inf"), dim=-1, keepdim=True)
    scale = group_scale_of(torch.clamp_min(amax, eps), maxv, uses_recip(x, divide))
    return xg, ue8m0(scale) if ue else scale


def torch_group(q: Tensor, s: Tensor, x: Tensor, gs: int, eps: float, ue: bool, divide: bool) -> None:
    xg, scale = _torch_group_scale(x, gs, eps, FP8_MAX, ue, divide)
    y = xg / scale if divide else xg * scale.reciprocal()
    q.view(torch.float8_e4m3fn).copy_(torch.clamp(y, -FP8_MAX, FP8_MAX).view(q.shape))
    if s.dtype == torch.int32:
        pack_ue8m0(scale.squeeze(-1), s)
    else:
        s.copy_(scale.squeeze(-1))


def torch_silu_group(q: Tensor, s: Tensor, x: Tensor, gs: int, eps: float, ue: bool) -> None:
    torch_group(q, s, _silu_mul(x), gs, eps, ue, False)


def torch_group_int8(q: Tensor, s: Tensor, x: Tensor, gs: int, eps: float) -> None:
    xg, scale = _torch_group_scale(x, gs, eps, INT8_MAX, False)
    q.copy_(_to_int8(xg * scale.reciprocal()).view(q.shape))
    s.copy_(scale.squeeze(-1))


#: Scales (float32) are computed from the exact row/group max with IEEE division in every
#: backend (group scales with ``divide_by_scale`` on CUDA: the reciprocal product, in every CUDA
#: backend; ``group_scale_of``), so they agree to fp32 rounding whatever the input dtype. The fp8 output is compared
#: as float with one e4m3 ulp of slack (see ``_common.FP8_E4M3_TOLERANCE``); int8 outputs with
#: one unit (truncation toward zero turns a last-bit difference of ``x * (1 / scale)`` between two
#: devices' arithmetic into one unit, as on the H200 against the CPU-checked values; vLLM's int8
#: tests allow the same); packed UE8M0 outputs must match exactly.
_TOLERANCES = (
    ("float32", (1e-6, 1e-6)),
    ("float16", (1e-6, 1e-6)),
    ("bfloat16", (1e-6, 1e-6)),
    FP8_E4M3_TOLERANCE,
    ("int8", (1.0, 0.0)),
)
per_token_quant_fp8 = declare(
    _PT,
    "(Tensor x, Tensor? scale_ub=None, bool divide_by_scale=False, Tensor(a!)? out_q=None, "
    "Tensor(a!)? out_scale=None) -> (Tensor, Tensor)",
    doc="x: [..., H] -> (q fp8 [..., H], scale fp32 [..., 1]); scale = max(min(amax, ub)/448, 1/(448*512))",
    contract=PER_TOKEN,
    reference=ref_per_token,
    torch=torch_per_token,
    tolerances=_TOLERANCES,
)
per_tensor_quant_fp8 = declare(
    _PTT,
    "(Tensor x, Tensor? scale=None, Tensor(a!)? out_q=None, Tensor(a!)? out_scale=None) -> (Tensor, Tensor)",
    doc="x: [..., H] -> (q fp8 [..., H], scale fp32 [1]); scale = amax(x)/448 (dynamic) or the given one (static)",
    contract=PER_TENSOR,
    reference=ref_per_tensor,
    torch=torch_per_tensor,
    tolerances=_TOLERANCES,
)
per_token_group_quant_fp8 = declare(
    _PG,
    "(Tensor x, int group_size=128, float eps=1e-10, bool column_major_scales=False, "
    "bool scale_tma_aligned=False, bool scale_ue8m0=False, bool divide_by_scale=False, "
    "Tensor(a!)? out_q=None, Tensor(a!)? out_scale=None) -> (Tensor, Tensor)",
    doc="x: [..., H] -> (q fp8 [..., H], scale fp32 [..., H/g]); scale = max(group amax, eps)/448",
    contract=GROUP,
    reference=ref_group,
    torch=torch_group,
    tolerances=_TOLERANCES,
    # no size class: the C++ row-per-block kernel at prefill (benchmarks/tune, H200) is faster
    # than the Triton kernel that used to take over from 2^26 elements
)
per_token_group_quant_int8 = declare(
    _PGI,
    "(Tensor x, int group_size=128, float eps=1e-10, bool column_major_scales=False, "
    "bool scale_tma_aligned=False, Tensor(a!)? out_q=None, Tensor(a!)? out_scale=None) -> (Tensor, Tensor)",
    doc="x: [..., H] -> (q int8 [..., H], scale fp32 [..., H/g]); scale = max(group amax, eps)/127, q truncated",
    contract=GROUP_INT8,
    reference=ref_group_int8,
    torch=torch_group_int8,
    tolerances=_TOLERANCES,
)
silu_and_mul_per_token_group_quant_fp8 = declare(
    "quantization.silu_and_mul_per_token_group_quant_fp8",
    "(Tensor x, int group_size=128, float eps=1e-10, bool column_major_scales=False, "
    "bool scale_tma_aligned=False, bool scale_ue8m0=False, "
    "Tensor(a!)? out_q=None, Tensor(a!)? out_scale=None) -> (Tensor, Tensor)",
    doc="x: [..., 2d] -> per_token_group_quant_fp8(silu(x[..., :d]) * x[..., d:]) in one pass: q fp8 "
    "[..., d], scale fp32 [..., d/g]; the product stays in fp32 (never rounded to x's dtype)",
    contract=SILU_GROUP,
    reference=ref_silu_group,
    torch=torch_silu_group,
    tolerances=_TOLERANCES,
)
static_quant_fp8 = declare(
    _PS,
    "(Tensor x, Tensor scale, Tensor(a!)? out=None) -> Tensor",
    doc="x: [..., H], scale [Gm, Gn] (or one element) -> q fp8 [..., H]; q = x * (1 / scale of its block)",
    contract=STATIC,
    reference=ref_static,
    torch=torch_static,
    tolerances=_TOLERANCES,
)
