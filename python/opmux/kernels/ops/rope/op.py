"""Rotary embedding: one declaration (``ops/_decl.py``); kernel arguments ``(pos [T], q [T, Hq, D],
k [T, Hk, D], cos_sin_cache [max_pos, rot], is_neox, vllm_rounding)``, unit last strides, dense
positions.

Out-of-range positions never read out of bounds. Where positions live on the CPU every
backend checks them on the host (and the C++ CPU kernel checks again, for direct callers of
the native ABI), raising ValueError naming the first bad one. On an accelerator a host check would cost a device sync
per call, so the kernels (CUDA, Triton, and the torch backend) clamp the index and poison that
token: its rotated q / k elements become NaN.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _checks
from .._decl import declare

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

_OP = "rope.rotary_embedding"
Views = tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]


def _num_heads(name: str, t: Tensor, lead: int, head_size: int) -> int:
    rest = tuple(t.shape[lead:])
    if len(rest) == 1 and rest[0] % head_size == 0:
        return rest[0] // head_size
    if len(rest) == 2 and rest[1] == head_size:
        return rest[0]
    raise ValueError(
        f"{_OP}: {name} has shape {tuple(t.shape)}; expected positions' shape followed by "
        f"[num_heads * head_size] or [num_heads, head_size] with head_size {head_size}"
    )


def _views(positions: Tensor, query: Tensor, key: Tensor, head_size: int, cos_sin_cache: Tensor) -> Views:
    """positions as [T], query / key as [T, H, head_size] views (no dtype checks: the float64
    oracle goes through here too)."""
    _checks.positive_int(_OP, "head_size", head_size)
    lead = positions.dim()
    for name, t in (("query", query), ("key", key)):
        if tuple(t.shape[:lead]) != tuple(positions.shape):
            raise ValueError(
                f"{_OP}: {name} has shape {tuple(t.shape)}; its leading dims must be positions' {tuple(positions.shape)}"
            )
    if cos_sin_cache.dim() != 2:
        raise ValueError(
            f"{_OP}: cos_sin_cache must be [max_position, rotary_dim], got shape {tuple(cos_sin_cache.shape)}"
        )
    rot = cos_sin_cache.shape[1]
    if rot <= 0 or rot % 2 or rot > head_size:
        raise ValueError(
            f"{_OP}: cos_sin_cache.shape[1] (rotary_dim) is {rot}; it must be even, positive and <= head_size {head_size}"
        )
    tokens = positions.numel()
    if cos_sin_cache.stride(1) != 1:
        raise ValueError(
            f"{_OP}: cos_sin_cache has strides {cos_sin_cache.stride()}; its last dim must be contiguous: "
            "pass cos_sin_cache.contiguous()"
        )
    pos = positions.reshape(tokens)
    if tokens > 1 and pos.stride(0) != 1:
        raise ValueError(
            f"{_OP}: positions has strides {positions.stride()}; kernels need dense positions: "
            "pass positions.contiguous()"
        )
    q = _checks.heads(_OP, "query", query, tokens, _num_heads("query", query, lead, head_size), head_size)
    k = _checks.heads(_OP, "key", key, tokens, _num_heads("key", key, lead, head_size), head_size)
    return pos, q, k


def check(
    op: str,
    positions: Tensor,
    query: Tensor,
    key: Tensor | None,
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool = True,
    vllm_rounding: bool = False,
) -> tuple[tuple[Any, ...], None]:
    try:  # the usual call ([T] positions, a key), each attribute read once; else the full checks
        ps, cs, dt, dev = positions.shape, cos_sin_cache.shape, query.dtype, query.device
        if (
            key is not None
            and type(head_size) is int
            and head_size > 0
            and type(is_neox) is bool
            and type(vllm_rounding) is bool
            and len(ps) == 1
            and len(cs) == 2
            and 0 < cs[1] <= head_size
            and cs[1] % 2 == 0
            and positions.dtype == torch.int64
            and dt in _checks.FLOAT_DTYPES
            and key.dtype == dt
            and (cos_sin_cache.dtype == torch.float32 or cos_sin_cache.dtype == dt)
            and cos_sin_cache.stride()[1] == 1
            and (ps[0] <= 1 or positions.stride()[0] == 1)
            and positions.device == dev
            and key.device == dev
            and cos_sin_cache.device == dev
            and isinstance(positions, torch.Tensor)
            and isinstance(query, torch.Tensor)
            and isinstance(key, torch.Tensor)
            and isinstance(cos_sin_cache, torch.Tensor)
        ):
            q = _heads_view(query, ps[0], head_size)
            k = _heads_view(key, ps[0], head_size)
            if q is not None and k is not None:
                return (positions, q, k, cos_sin_cache, is_neox, vllm_rounding), None
    except Exception:  # not tensors, ...: the full checks say what is wrong
        pass
    key = _no_key(positions, query, head_size) if key is None else key
    for name, t in (
        ("positions", positions),
        ("query", query),
        ("key", key),
        ("cos_sin_cache", cos_sin_cache),
    ):
        _checks.tensor(_OP, name, t)
    _checks.exact_dtype(_OP, "positions", positions, torch.int64)
    _checks.float_dtype(_OP, "query", query)
    _checks.same_dtype(_OP, "query", query, key=key)
    if cos_sin_cache.dtype not in (torch.float32, query.dtype):
        raise TypeError(
            f"{_OP}: cos_sin_cache has dtype {cos_sin_cache.dtype}; expected torch.float32 or {query.dtype} (query's)"
        )
    _checks.same_device(_OP, "query", query, positions=positions, key=key, cos_sin_cache=cos_sin_cache)
    if not isinstance(is_neox, bool):
        raise TypeError(f"{_OP}: is_neox must be a bool, got {is_neox!r}")
    if not isinstance(vllm_rounding, bool):
        raise TypeError(f"{_OP}: vllm_rounding must be a bool, got {vllm_rounding!r}")
    pos, q, k = _views(positions, query, key, head_size, cos_sin_cache)
    return (pos, q, k, cos_sin_cache, is_neox, vllm_rounding), None


def _heads_view(t: Tensor, tokens: int, head_size: int) -> Tensor | None:
    """``t`` ([T, H, head_size], or [T, H * head_size]) as the [T, H, head_size] view the full
    checks make (a 3-D one as it is: the view would be itself), or None: the full checks decide."""
    shape = t.shape
    if shape[0] != tokens or (head_size > 1 and t.stride()[-1] != 1):
        return None
    if len(shape) == 3 and shape[2] == head_size:
        return t
    if len(shape) == 2 and shape[1] % head_size == 0:
        return t.view(tokens, shape[1] // head_size, head_size)
    return None


def _no_key(positions: Tensor, query: Tensor, head_size: int) -> Tensor:
    """``key=None`` (vLLM's query-only rotation): a key with no heads, ``[*positions, 0, head_size]``;
    every backend then rotates nothing of it. Bad arguments fall through to the usual checks."""
    if isinstance(positions, torch.Tensor) and isinstance(query, torch.Tensor):
        hs = _checks.positive_int(_OP, "head_size", head_size)
        return torch.empty((*positions.shape, 0, hs), dtype=query.dtype, device=query.device)
    return query  # not reached by a valid call: the tensor checks report what is wrong


def values(
    positions: Tensor,
    query: Tensor,
    key: Tensor | None,
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool = True,
    vllm_rounding: bool = False,
) -> None:
    """Positions on the CPU are checked on the host (an accelerator's would cost a sync)."""
    if positions.is_cpu and not _checks.in_range(positions, 0, cos_sin_cache.shape[0]):
        _check_positions(positions.reshape(-1), cos_sin_cache.shape[0])


def _check_positions(positions: Tensor, max_pos: int) -> None:
    """Host check (positions on the CPU): ValueError naming the first out-of-range position."""
    if positions.numel() == 0:
        return
    lo, hi = torch.aminmax(positions)
    if int(lo) < 0 or int(hi) >= max_pos:
        bad = ((positions < 0) | (positions >= max_pos)).nonzero()
        i = int(bad[0, 0])
        raise ValueError(
            f"{_OP}: positions[{i}] = {int(positions[i])} is out of range for cos_sin_cache with "
            f"{max_pos} positions (valid: 0..{max_pos - 1})"
        )


def _rotate(
    pos: Tensor, q: Tensor, k: Tensor, cache: Tensor, is_neox: bool, vllm_rounding: bool = False
) -> None:
    """The math, in fp32, for [T] positions and [T, H, D] views. Positions on an accelerator
    are clamped and their tokens poisoned with NaN; on the CPU they are checked first.
    vllm_rounding: in x's dtype (vLLM's kernel: cos / sin, each product and each sum rounded)."""
    max_pos = cache.shape[0]
    if pos.device.type == "cpu":
        _check_positions(pos, max_pos)
        cs = cache.float()[pos]
    else:
        ok = (pos >= 0) & (pos < max_pos)
        cs = torch.where(ok[:, None], cache.float()[pos.clamp(0, max_pos - 1)], float("nan"))
    cs = cs.to(torch.float64) if q.dtype == torch.float64 else cs  # the float64 oracle
    cos, sin = cs.unsqueeze(1).chunk(2, dim=-1)  # [T, 1, rot / 2]
    rot = cache.shape[1]
    for x in (q, k):
        r = x[..., :rot].to(cs.dtype)
        if vllm_rounding and x.dtype != torch.float64:  # torch's ops round each result to x.dtype
            r = x[..., :rot]
            cos, sin = cos.to(x.dtype), sin.to(x.dtype)
        if is_neox:
            x1, x2 = r.chunk(2, dim=-1)
            y = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
        else:
            x1, x2 = r[..., 0::2], r[..., 1::2]
            y = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
        x[..., :rot] = y.to(x.dtype)


def reference(
    positions: Tensor,
    query: Tensor,
    key: Tensor | None,
    head_size: int,
    cos_sin_cache: Tensor,
    is_neox: bool = True,
    vllm_rounding: bool = False,
) -> None:
    key = _no_key(positions, query, head_size) if key is None else key
    pos, q, k = _views(positions, query, key, head_size, cos_sin_cache)
    _check_positions(pos.cpu(), cos_sin_cache.shape[0])  # the oracle may sync
    _rotate(pos, q, k, cos_sin_cache, is_neox, vllm_rounding)


def torch_rope(pos: Tensor, q: Tensor, k: Tensor, cache: Tensor, is_neox: bool, vllm_rounding: bool) -> None:
    _rotate(pos, q, k, cache, is_neox, vllm_rounding)


def npu_rope(pos: Tensor, q: Tensor, k: Tensor, cache: Tensor, is_neox: bool, vllm_rounding: bool) -> None:
    head_size = q.shape[-1]
    if cache.shape[1] != head_size or vllm_rounding:  # partial rotary / vLLM's rounding: not the vendor op
        _rotate(pos, q, k, cache, is_neox, vllm_rounding)
        return
    import torch_npu  # vendor library, present only on Ascend hosts

    # vllm-ascend's in-place kernel wants dense [T, H * head_size] and a cache in q's dtype
    tokens = pos.shape[0]
    qf, kf = q.reshape(tokens, -1).contiguous(), k.reshape(tokens, -1).contiguous()
    torch_npu._npu_rotary_embedding(pos, qf, kf, head_size, cache.to(q.dtype), is_neox)
    q.copy_(qf.view_as(q))
    k.copy_(kf.view_as(k))


rotary_embedding = declare(
    _OP,
    "(Tensor positions, Tensor(a!) query, Tensor(a!)? key, int head_size, Tensor cos_sin_cache, "
    "bool is_neox=True, bool vllm_rounding=False) -> ()",
    doc="in place: rotate query/key heads by cos_sin_cache[positions] (neox or gptj, partial rotary; key may be None); "
    "vllm_rounding: cos / sin, each product and sum rounded to query's dtype (vLLM's kernel), else fp32, one rounding",
    check=check,
    values=values,
    reference=reference,
    torch=torch_rope,
    torch_npu=npu_rope,
    key_arg=1,  # query picks the backend (positions are int64)
)
