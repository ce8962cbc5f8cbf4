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

import math
from typing import TYPE_CHECKING, Any

from .. import _checks
from .._common import FP8_E4M3_TOLERANCE
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

_EMPTY: dict[torch.device, Tensor] = {}


def _empty(device: torch.device) -> Tensor:
    """A cached 0-element float32 tensor: "no scale_ub" / "dynamic" for the kernels. Only a plain
    tensor is cached: under torch.compile the checks run in the fake op on fake tensors, and a
    cached FakeTensor would reach the kernels of every later real call."""
    e = _EMPTY.get(device)
    if e is None:
        e = torch.empty(0, dtype=torch.float32, device=device)
        if type(e) is torch.Tensor:
            e = _EMPTY.setdefault(device, e)
    return e


def _to_fp8(y: Tensor) -> Tensor:
    """fp32 -> e4m3fn, round to nearest even, saturating (torch's cast maps >= 480 to NaN)."""
    return y.clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)


def _to_int8(y: Tensor) -> Tensor:
    """fp32 -> int8, clamped to [-128, 127] and truncated toward zero; NaN -> 0."""
    y = torch.where(torch.isnan(y), torch.zeros_like(y), y.clamp(-128.0, 127.0))
    return torch.trunc(y).to(torch.int8)


def _hidden(op: str, x: Tensor) -> int:
    _checks.tensor(op, "x", x)
    _checks.float_dtype(op, "x", x)
    if x.dim() < 1 or x.shape[-1] == 0:
        raise ValueError(f"{op}: x has shape {tuple(x.shape)}, expected [..., H] with H >= 1")
    return int(x.shape[-1])


def _flag(op: str, name: str, v: object) -> bool:
    if not isinstance(v, bool):
        raise TypeError(f"{op}: {name} must be a bool, got {v!r}")
    return v


def _out_q(op: str, x: Tensor, out_q: Tensor, h: int, dtype: torch.dtype, name: str = "out_q") -> Tensor:
    """The caller's q buffer as the [T, H] rows view the kernels write."""
    _checks.tensor(op, name, out_q)
    _checks.exact_dtype(op, name, out_q, dtype)
    if out_q.shape != x.shape:
        raise ValueError(f"{op}: {name} has shape {tuple(out_q.shape)}, expected {tuple(x.shape)} like x")
    _checks.same_device(op, "x", x, **{name: out_q})
    return _checks.rows(op, name, out_q, h)


def _out_vector(op: str, x: Tensor, s: Tensor, n: int, what: str) -> Tensor:
    """The caller's float32 scale buffer of ``n`` elements as a dense [n] view."""
    _checks.tensor(op, "out_scale", s)
    _checks.exact_dtype(op, "out_scale", s, torch.float32)
    _checks.same_device(op, "x", x, out_scale=s)
    if s.numel() != n:
        raise ValueError(f"{op}: out_scale has shape {tuple(s.shape)}, expected {n} element(s) ({what})")
    try:
        v = s.view(n)
        if n > 1 and v.stride(0) != 1:
            raise RuntimeError
        return v
    except RuntimeError:
        raise ValueError(
            f"{op}: out_scale with shape {tuple(s.shape)} and strides {s.stride()} cannot be viewed as "
            f"a dense [{n}] vector"
        ) from None


def _no_self_overlap(op: str, name: str, t: Tensor) -> None:
    """Every element of ``t`` at its own address (any order of the strides)."""
    dims = sorted((st, sz) for st, sz in zip(t.stride(), t.shape, strict=True) if sz > 1)
    span = 1
    for st, sz in dims:
        if st < span:
            raise ValueError(
                f"{op}: {name} has overlapping or negative strides {t.stride()} for shape {tuple(t.shape)}"
            )
        span = st * sz


def check_per_token(
    op: str,
    x: Tensor,
    scale_ub: Tensor | None = None,
    divide_by_scale: bool = False,
    out_q: Tensor | None = None,
    out_scale: Tensor | None = None,
) -> tuple[tuple[Any, ...], Any]:
    """-> ((q2 as uint8 [T, H], scales [T], x2 [T, H], scale_ub or an empty tensor, divide), (q, scales))."""
    try:  # the serving call ([T, H] rows, no buffers), each attribute read once; else the full checks
        if (
            scale_ub is None
            and out_q is None
            and out_scale is None
            and type(x) is torch.Tensor  # plain tensors (fake ones, subclasses: the full checks)
            and type(divide_by_scale) is bool
        ):
            t, h = x.shape  # not 2-D raises: the full checks name it
            if h >= 1 and x.dtype in _checks.FLOAT_DTYPES and (h == 1 or x.stride()[1] == 1):
                dev = x.device
                p = _checks.PROTOS.get(dev) or _checks.protos(dev)
                q2 = p[torch.uint8].new_empty(t, h)  # fp8 crosses as its bytes
                s = p[torch.float32].new_empty(t, 1)
                ub = _EMPTY.get(dev)
                if ub is None:
                    ub = _empty(dev)
                # ravel: the dense [T] view of s (s.view(t), ~0.15 us less)
                return (q2, s.ravel(), x, ub, divide_by_scale), (q2.view(torch.float8_e4m3fn), s)
    except Exception:  # not a tensor, ...: the full checks say what is wrong
        pass
    h = _hidden(_PT, x)
    if scale_ub is not None:
        _checks.tensor(_PT, "scale_ub", scale_ub)
        _checks.exact_dtype(_PT, "scale_ub", scale_ub, torch.float32)
        if scale_ub.numel() != 1:
            raise ValueError(f"{_PT}: scale_ub has shape {tuple(scale_ub.shape)}, expected one element")
        _checks.same_device(_PT, "x", x, scale_ub=scale_ub)
    _flag(_PT, "divide_by_scale", divide_by_scale)
    x2 = _checks.rows(_PT, "x", x, h)
    if out_q is None and out_scale is None:  # the serving case
        q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        s = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
        q2, s1 = q.view(-1, h), s.view(-1)
    else:
        _checks.no_caller_outputs_when_compiling(_PT, "out_q / out_scale", out_q, out_scale)
        if out_q is None:
            q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
            q2 = q.view(-1, h)
        else:
            q, q2 = out_q, _out_q(_PT, x, out_q, h, torch.float8_e4m3fn)
        if out_scale is None:
            s = torch.empty((*x.shape[:-1], 1), dtype=torch.float32, device=x.device)
            s1 = s.view(-1)
        else:
            s, s1 = out_scale, _out_vector(_PT, x, out_scale, x2.shape[0], "one per row of x")
    ub = _empty(x.device) if scale_ub is None else scale_ub.reshape(1)
    return (q2.view(torch.uint8), s1, x2, ub, divide_by_scale), (q, s)


def check_per_tensor(
    op: str,
    x: Tensor,
    scale: Tensor | None = None,
    out_q: Tensor | None = None,
    out_scale: Tensor | None = None,
) -> tuple[tuple[Any, ...], Any]:
    """-> ((q2 as uint8 [T, H], out scale [1], x2 [T, H], static scale [1] or an empty tensor), (q, scale))."""
    try:  # the dynamic serving call ([T, H] rows, no buffers), each attribute read once
        if scale is None and out_q is None and out_scale is None and type(x) is torch.Tensor:
            t, h = x.shape  # not 2-D raises: the full checks name it
            if h >= 1 and x.dtype in _checks.FLOAT_DTYPES and (h == 1 or x.stride()[1] == 1):
                dev = x.device
                p = _checks.PROTOS.get(dev) or _checks.protos(dev)
                q2 = p[torch.uint8].new_empty(t, h)  # fp8 crosses as its bytes
                s = p[torch.float32].new_empty(1)
                static = _EMPTY.get(dev)
                if static is None:
                    static = _empty(dev)
                return (q2, s, x, static), (q2.view(torch.float8_e4m3fn), s)
    except Exception:  # not a tensor, ...: the full checks say what is wrong
        pass
    h = _hidden(_PTT, x)
    if scale is not None:
        _checks.tensor(_PTT, "scale", scale)
        _checks.exact_dtype(_PTT, "scale", scale, torch.float32)
        if scale.numel() != 1:
            raise ValueError(f"{_PTT}: scale has shape {tuple(scale.shape)}, expected one element")
        _checks.same_device(_PTT, "x", x, scale=scale)
    x2 = _checks.rows(_PTT, "x", x, h)
    _checks.no_caller_outputs_when_compiling(_PTT, "out_q / out_scale", out_q, out_scale)
    if out_q is None:
        q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        q2 = q.view(-1, h)
    else:
        q, q2 = out_q, _out_q(_PTT, x, out_q, h, torch.float8_e4m3fn)
    if out_scale is None:
        s = s1 = torch.empty(1, dtype=torch.float32, device=x.device)
    else:
        s, s1 = out_scale, _out_vector(_PTT, x, out_scale, 1, "one per tensor")
    static = _empty(x.device) if scale is None else scale.reshape(1)
    return (q2.view(torch.uint8), s1, x2, static), (q, s)


def check_static(op: str, x: Tensor, scale: Tensor, out: Tensor | None = None) -> tuple[tuple[Any, ...], Any]:
    """-> ((q2 as uint8 [T, H], x2 [T, H], scale2 [Gm, Gn] (any strides), group_m, group_n), q)."""
    try:  # the serving call ([T, H] rows, one scale or [Gm, Gn] scales, no out), each attribute read once
        xs, ss = x.shape, scale.shape
        if (
            out is None
            and type(x) is torch.Tensor  # plain tensors (fake ones, subclasses: the full checks)
            and type(scale) is torch.Tensor
            and len(xs) == 2
            and xs[1] >= 1
            and x.dtype in _checks.FLOAT_DTYPES
            and scale.dtype == torch.float32
            and (xs[1] == 1 or x.stride()[1] == 1)
        ):
            dev, n = x.device, len(ss)
            if n == 2:
                gm, gn = ss
                ok = gm > 0 and gn > 0 and xs[0] % gm == 0 and xs[1] % gn == 0 and min(scale.stride()) >= 0
                s2 = scale
            else:  # one scale ([1] or 0-d): the [1, 1] view the full checks make (reshape of one element)
                ok = n == 0 or (n == 1 and ss[0] == 1)
                gm = gn = 1
                s2 = scale.view(1, 1) if ok else scale
            if ok and scale.device == dev:
                p = _checks.PROTOS.get(dev) or _checks.protos(dev)
                q2 = p[torch.uint8].new_empty(xs[0], xs[1])  # fp8 crosses as its bytes
                return (q2, x, s2, max(xs[0] // gm, 1), xs[1] // gn), q2.view(torch.float8_e4m3fn)
    except Exception:  # not tensors, ...: the full checks say what is wrong
        pass
    h = _hidden(_PS, x)
    _checks.tensor(_PS, "scale", scale)
    _checks.exact_dtype(_PS, "scale", scale, torch.float32)
    _checks.same_device(_PS, "x", x, scale=scale)
    x2 = _checks.rows(_PS, "x", x, h)
    t = x2.shape[0]
    if scale.dim() <= 1 and scale.numel() == 1:
        s2 = scale.reshape(1, 1)
    elif scale.dim() == 2:
        s2 = scale
    else:
        raise ValueError(
            f"{_PS}: scale has shape {tuple(scale.shape)}, expected one element or [Gm, Gn] (2-D group scales)"
        )
    gm_n, gn_n = s2.shape
    if gm_n == 0 or gn_n == 0 or t % gm_n or h % gn_n:
        raise ValueError(
            f"{_PS}: scale has shape {tuple(scale.shape)}: its dims must divide x's rows and hidden size {(t, h)}"
        )
    if min(s2.stride()) < 0:
        raise ValueError(f"{_PS}: scale has negative strides {s2.stride()}")
    if out is None:
        q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        q2 = q.view(-1, h)
    else:
        q, q2 = out, _out_q(_PS, x, out, h, torch.float8_e4m3fn, "out")
    return (q2.view(torch.uint8), x2, s2, max(t // gm_n, 1), h // gn_n), q


def _group_common(
    op: str, x: Tensor, group_size: int, eps: float, column_major_scales: bool, scale_tma_aligned: bool
) -> tuple[int, int, float, Tensor]:
    h = _hidden(op, x)
    gs = _checks.positive_int(op, "group_size", group_size)
    if h % gs:
        raise ValueError(f"{op}: x's last dim {h} is not a multiple of group_size {gs}")
    eps = _checks.positive_float(op, "eps", eps)
    _flag(op, "column_major_scales", column_major_scales)
    if _flag(op, "scale_tma_aligned", scale_tma_aligned) and not column_major_scales:
        raise ValueError(
            f"{op}: scale_tma_aligned needs column_major_scales=True (TMA-aligned column-major scales)"
        )
    return h, gs, eps, _checks.rows(op, "x", x, h)


def _group_scales(x: Tensor, t: int, g: int, column_major: bool, tma: bool) -> tuple[Tensor, Tensor]:
    """The op's own float32 scales: (kernel view [T, G], result [..., G])."""
    if column_major:  # a [T, G] view of a contiguous [G, T] (TMA: [G, T rounded up to 4]) tensor
        m = (t + 3) // 4 * 4 if tma else t
        s2 = torch.empty((g, m), dtype=torch.float32, device=x.device).t()[:t]
    else:
        s2 = torch.empty((t, g), dtype=torch.float32, device=x.device)
    return s2, s2.view(*x.shape[:-1], g)


def _out_group_scales(op: str, x: Tensor, s: Tensor, t: int, g: int, packed_ok: bool) -> Tensor:
    """The caller's group scales as a [T, G] (float32) or [T, ceil(G / 4)] (packed int32) view."""
    _checks.tensor(op, "out_scale", s)
    packed = s.dtype == torch.int32
    if not packed or not packed_ok:
        if packed:
            raise TypeError(f"{op}: out_scale has dtype int32 (packed UE8M0), which needs scale_ue8m0=True")
        _checks.exact_dtype(op, "out_scale", s, torch.float32)
    _checks.same_device(op, "x", x, out_scale=s)
    cols = (g + 3) // 4 if packed else g
    what = f"[..., {cols}] (ceil(G / 4) packed UE8M0 int32)" if packed else f"[..., {g}] (one per group)"
    if s.dim() == 2 and s.shape == (t, cols):
        s2 = s
    elif s.dim() >= 1 and s.shape[-1] == cols and s.numel() == t * cols:
        try:
            s2 = s.view(t, cols)
        except RuntimeError:
            raise ValueError(
                f"{op}: out_scale with shape {tuple(s.shape)} and strides {s.stride()} cannot be viewed as [{t}, {cols}]"
            ) from None
    else:
        raise ValueError(f"{op}: out_scale has shape {tuple(s.shape)}, expected {what} for {t} rows")
    _no_self_overlap(op, "out_scale", s2)
    return s2


def check_group(
    op: str,
    x: Tensor,
    group_size: int = 128,
    eps: float = 1e-10,
    column_major_scales: bool = False,
    scale_tma_aligned: bool = False,
    scale_ue8m0: bool = False,
    divide_by_scale: bool = False,
    out_q: Tensor | None = None,
    out_scale: Tensor | None = None,
) -> tuple[tuple[Any, ...], Any]:
    """-> ((q2 as uint8 [T, H], scales [T, G] float32 or [T, ceil(G/4)] packed int32 (any
    strides), x2 [T, H], group_size, eps, ue8m0, divide), (q, scales))."""
    try:  # the serving call ([T, H] rows, row-major scales, no buffers); else the full checks
        if (
            out_q is None
            and out_scale is None
            and column_major_scales is False
            and scale_tma_aligned is False
            and type(x) is torch.Tensor  # plain tensors (fake ones, subclasses: the full checks)
            and type(scale_ue8m0) is bool
            and type(divide_by_scale) is bool
            and type(group_size) is int
            and group_size > 0
            and type(eps) is float
            and 0.0 < eps < math.inf
        ):
            t, h = x.shape  # not 2-D raises: the full checks name it
            if (
                h >= 1
                and h % group_size == 0
                and x.dtype in _checks.FLOAT_DTYPES
                and (h == 1 or x.stride()[1] == 1)
            ):
                dev = x.device
                p = _checks.PROTOS.get(dev) or _checks.protos(dev)
                q2 = p[torch.uint8].new_empty(t, h)  # fp8 crosses as its bytes
                s2 = p[torch.float32].new_empty(t, h // group_size)
                kargs = (q2, s2, x, group_size, eps, scale_ue8m0, divide_by_scale)
                return kargs, (q2.view(torch.float8_e4m3fn), s2)
    except Exception:  # not a tensor, ...: the full checks say what is wrong
        pass
    h, gs, eps, x2 = _group_common(_PG, x, group_size, eps, column_major_scales, scale_tma_aligned)
    ue8m0 = _flag(_PG, "scale_ue8m0", scale_ue8m0)
    divide = _flag(_PG, "divide_by_scale", divide_by_scale)
    t, g = x2.shape[0], h // gs
    if out_q is None and out_scale is None:
        q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
        q2 = q.view(-1, h)
        s2, s = _group_scales(x, t, g, column_major_scales, scale_tma_aligned)
    else:
        _checks.no_caller_outputs_when_compiling(_PG, "out_q / out_scale", out_q, out_scale)
        if out_q is None:
            q = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
            q2 = q.view(-1, h)
        else:
            q, q2 = out_q, _out_q(_PG, x, out_q, h, torch.float8_e4m3fn)
        if out_scale is None:
            s2, s = _group_scales(x, t, g, column_major_scales, scale_tma_aligned)
        else:
            s, s2 = out_scale, _out_group_scales(_PG, x, out_scale, t, g, ue8m0)
    return (q2.view(torch.uint8), s2, x2, gs, eps, ue8m0, divide), (q, s)


def check_group_int8(
    op: str,
    x: Tensor,
    group_size: int = 128,
    eps: float = 1e-10,
    column_major_scales: bool = False,
    scale_tma_aligned: bool = False,
    out_q: Tensor | None = None,
    out_scale: Tensor | None = None,
) -> tuple[tuple[Any, ...], Any]:
    """-> ((q2 int8 [T, H], scales [T, G] float32 (any strides), x2 [T, H], group_size, eps), (q, scales))."""
    try:  # the serving call ([T, H] rows, row-major scales, no buffers); else the full checks
        if (
            out_q is None
            and out_scale is None
            and column_major_scales is False
            and scale_tma_aligned is False
            and type(x) is torch.Tensor  # plain tensors (fake ones, subclasses: the full checks)
            and type(group_size) is int
            and group_size > 0
            and type(eps) is float
            and 0.0 < eps < math.inf
        ):
            t, h = x.shape  # not 2-D raises: the full checks name it
            if (
                h >= 1
                and h % group_size == 0
                and x.dtype in _checks.FLOAT_DTYPES
                and (h == 1 or x.stride()[1] == 1)
            ):
                dev = x.device
                p = _checks.PROTOS.get(dev) or _checks.protos(dev)
                q = p[torch.int8].new_empty(t, h)
                s2 = p[torch.float32].new_empty(t, h // group_size)
                return (q, s2, x, group_size, eps), (q, s2)
    except Exception:  # not a tensor, ...: the full checks say what is wrong
        pass
    h, gs, eps, x2 = _group_common(_PGI, x, group_size, eps, column_major_scales, scale_tma_aligned)
    t, g = x2.shape[0], h // gs
    if out_q is not None or out_scale is not None:
        _checks.no_caller_outputs_when_compiling(_PGI, "out_q / out_scale", out_q, out_scale)
    if out_q is None:
        q = torch.empty(x.shape, dtype=torch.int8, device=x.device)
        q2 = q.view(-1, h)
    else:
        q, q2 = out_q, _out_q(_PGI, x, out_q, h, torch.int8)
    if out_scale is None:
        s2, s = _group_scales(x, t, g, column_major_scales, scale_tma_aligned)
    else:
        s, s2 = out_scale, _out_group_scales(_PGI, x, out_scale, t, g, False)
    return (q2, s2, x2, gs, eps), (q, s)


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
    cur = into.contiguous().view(torch.uint8).view(t, -1).clone()
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


def torch_group_int8(q: Tensor, s: Tensor, x: Tensor, gs: int, eps: float) -> None:
    xg, scale = _torch_group_scale(x, gs, eps, INT8_MAX, False)
    q.copy_(_to_int8(xg * scale.reciprocal()).view(q.shape))
    s.copy_(scale.squeeze(-1))


# -- serving lanes' outputs (``Decl.outputs``): what the check's serving path allocates --------
def _fp8_rows(x: Tensor) -> tuple[Tensor, Any, int, int]:
    t, h = x.shape  # a serving lane takes [T, H] x only (anything else raises: no lane)
    p = _checks.PROTOS.get(x.device) or _checks.protos(x.device)
    return p[torch.float8_e4m3fn].new_empty(t, h), p, t, h


def outputs_per_token(
    x: Tensor, scale_ub: Any = None, divide_by_scale: Any = False, out_q: Any = None, out_scale: Any = None
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    q, p, t, _ = _fp8_rows(x)
    s = p[torch.float32].new_empty(t, 1)
    return (q, s), (q, s)


def outputs_per_tensor(
    x: Tensor, scale: Any = None, out_q: Any = None, out_scale: Any = None
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    q, p, _, _ = _fp8_rows(x)
    s = p[torch.float32].new_empty(1)
    return (q, s), (q, s)


def outputs_group(
    x: Tensor, group_size: Any = 128, *_: Any
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    q, p, t, h = _fp8_rows(x)
    s = p[torch.float32].new_empty(t, h // group_size)
    return (q, s), (q, s)


def outputs_group_int8(
    x: Tensor, group_size: Any = 128, *_: Any
) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
    t, h = x.shape
    p = _checks.PROTOS.get(x.device) or _checks.protos(x.device)
    q = p[torch.int8].new_empty(t, h)
    s = p[torch.float32].new_empty(t, h // group_size)
    return (q, s), (q, s)


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
    check=check_per_token,
    outputs=outputs_per_token,
    reference=ref_per_token,
    torch=torch_per_token,
    tolerances=_TOLERANCES,
)
per_tensor_quant_fp8 = declare(
    _PTT,
    "(Tensor x, Tensor? scale=None, Tensor(a!)? out_q=None, Tensor(a!)? out_scale=None) -> (Tensor, Tensor)",
    doc="x: [..., H] -> (q fp8 [..., H], scale fp32 [1]); scale = amax(x)/448 (dynamic) or the given one (static)",
    check=check_per_tensor,
    outputs=outputs_per_tensor,
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
    check=check_group,
    outputs=outputs_group,
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
    check=check_group_int8,
    outputs=outputs_group_int8,
    reference=ref_group_int8,
    torch=torch_group_int8,
    tolerances=_TOLERANCES,
)
static_quant_fp8 = declare(
    _PS,
    "(Tensor x, Tensor scale, Tensor(a!)? out=None) -> Tensor",
    doc="x: [..., H], scale [Gm, Gn] (or one element) -> q fp8 [..., H]; q = x * (1 / scale of its block)",
    check=check_static,
    reference=ref_static,
    torch=torch_static,
    tolerances=_TOLERANCES,
)
