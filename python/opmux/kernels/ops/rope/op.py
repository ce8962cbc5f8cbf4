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
from .._contract import FLOATS, Arg, Contract, Rule, Scalar
from .._decl import declare
from . import _views

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

_OP = "rope.rotary_embedding"
#: query / key: [T, H, head_size] views made by the escape hatch (its C++ counterpart: the lane's)
_HEADS: dict[str, Any] = {
    "layout": "heads",
    "view": "heads",
    "view_args": ("positions", "head_size"),
    "view_cpp": "heads_view({t}, T, head_size, &{v})",
}


#: positions [*T] (dense as [T]), query / key [*T, H * D] or [*T, H, D] as [T, H, D] views (the
#: head count inferred: the escape hatch, _views.py), key None as no heads; cos_sin_cache [P, R]
#: float32 or query's dtype; kernel arguments (positions, query, key, cos_sin_cache, is_neox,
#: vllm_rounding). The CUDA kernel's limits are its device-tagged rules.
ROPE = Contract(
    "rope",
    (
        Scalar("head_size", "positive_int"),
        Arg(
            "positions",
            "*T",
            dtypes=("int64",),
            layout="flat",
            layout_hint="has strides {{t}.stride()}; kernels need dense positions: pass {t}.contiguous()",
        ),
        Arg("query", "*T, Hq, head_size", dtypes=FLOATS, device_of="positions", **_HEADS),
        Arg("key", "*T, Hk, head_size", like="query", none_as="query_v[:, :0]", **_HEADS),
        Arg(
            "cos_sin_cache",
            "P, R",
            like="query",
            or_dtypes=("float32",),
            layout="dense_last",
            expect="[max_position, rotary_dim]",
            layout_hint="has strides {{t}.stride()}; its last dim must be contiguous: pass {t}.contiguous()",
        ),
        Scalar("is_neox", "bool"),
        Scalar("vllm_rounding", "bool"),
        Rule(
            "R > 0 and R % 2 == 0 and R <= head_size",
            "cos_sin_cache.shape[1] (rotary_dim) is {R}; it must be even, positive and <= head_size {head_size}",
        ),
        Rule(
            "prod(T) <= 2**31 - 1 and Hq + Hk <= 2**20",
            "too many tokens ({prod(T)}) or heads ({Hq + Hk})",
            device="cuda",
            name="rope_sizes",
        ),
        Rule(
            "R * 4 <= 48 * 1024",
            "rotary_dim {R} exceeds the 12288 this kernel stages in shared memory",
            device="cuda",
            name="rope_smem",
        ),
    ),
    kernel=("positions", "query", "key", "cos_sin_cache", "is_neox", "vllm_rounding"),
    values_cpp="all_in_on_cpu<int64_t>(device_type, positions, 0, P)",
)


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
    """The oracle (also in float64, which the contract's dtypes refuse): the contract's views."""
    q = _views.heads(_OP, "query", query, positions, head_size)
    k = q[:, :0] if key is None else _views.heads(_OP, "key", key, positions, head_size)
    pos = positions.reshape(-1)
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
    contract=ROPE,
    values=values,
    reference=reference,
    torch=torch_rope,
    torch_npu=npu_rope,
    key_arg=1,  # query picks the backend (positions are int64)
)
