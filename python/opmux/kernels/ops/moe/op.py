"""MoE routing ops: one declaration each (``ops/_decl.py``).

``topk_softmax``: ``x = moe_softcapping * tanh(logit / moe_softcapping)`` (when > 0), softmax
over experts in fp32; the top-k experts are chosen by ``x`` (the same order as by probability,
but well defined where fp32 softmax underflows to equal zeros); equal keys are broken by the
LOWER expert index, in every backend. ``correction_bias`` [E] (float32): by default DeepSeek's
routing (vLLM's ``e_score_correction_bias``): experts chosen by ``softmax + bias``, weighted by
the softmax; with ``bias_on_logits`` sgl-kernel's: the bias is added to ``x`` before the softmax
(choice and weights). With ``renormalize`` the k weights are divided by their sum. Outputs go
to the caller's ``topk_weights`` (float32) / ``topk_ids`` (int32 or int64, written directly)
when given; ``token_expert_indices`` (int32), when given, gets ``[i, j] = j * T + i``.

``topk_sigmoid`` (vLLM's): the same routing with sigmoid scores, the kernels of ``topk_softmax``
in their sigmoid mode: each expert's weight is ``sigmoid(logit)`` (fp32), the top-k are chosen
by that score (by score + ``correction_bias`` [E] float32 when given: DeepSeek-V3's, the weights
staying the plain sigmoid), equal scores broken by the LOWER expert index (a saturated sigmoid,
1.0 for logits above ~17, ties like any other); ``renormalize``, the caller's buffers and
``token_expert_indices`` as in ``topk_softmax``.

``batched_moe_align_block_size`` (vLLM's batched layout: tokens already grouped per expert,
``[E, max_tokens_per_batch]``): ``expert_num_tokens`` (int32 [E], each in
``[0, max_tokens_per_batch]``) -> ``sorted_ids`` (expert e's rows ``e * M + j``, j <
``expert_num_tokens[e]``, in order, each expert padded to a multiple of ``block_size`` with the
sentinel ``E * M``; ``E * round_up(M, block_size)`` entries, a caller's buffer may be longer and
is written whole), ``expert_ids`` (one per block, -1 past the total, as vLLM's kernel) and
``num_tokens_post_padded`` ``[total]``. A count outside ``[0, M]`` raises ``ValueError`` for CPU
tensors; on CUDA it is clamped (a check would cost a synchronisation), so no write goes out of
bounds.

``moe_align_block_size`` (vLLM's layout): for each expert in order, the flat indices
``t * k + j`` of ``topk_ids`` (int32 or int64, read directly) routed to it, in increasing
(token) order, padded with ``T * k`` to a multiple of ``block_size``. With ``expert_map``
(expert parallelism, int32 [E]: global id -> local id, -1 when not on this rank) each id is
mapped first and entries mapped to -1 are left out. Outputs: ``sorted_token_ids`` (the op's
own: ``T*k + E*(block_size-1)`` entries; a caller's: at least ``T*k + min(E, T*k)*(block_size-1)``,
every unused slot set to ``T * k`` unless ``pad_sorted_token_ids=False``, which leaves them as
they are), ``expert_ids`` (one per block; blocks past the total hold ``unused_expert_id``, -1 by
default, 0 in both engines), ``num_tokens_post_padded`` ``[total]``, and, when given,
``cumsum_buffer[e]`` = expert e's first slot (``[E]`` the total). Expert ids (and mapped ids)
outside ``[0, E)`` raise ``ValueError`` for CPU tensors; on CUDA they are skipped (a device
check would cost a synchronisation), so a kernel never writes out of bounds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from .. import _checks
from .._common import INT32_EXACT, TOLERANCES
from .._decl import declare

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

_TK = "moe.topk_softmax"
_TS = "moe.topk_sigmoid"
_BA = "moe.batched_moe_align_block_size"
_AL = "moe.moe_align_block_size"


def _buffer(
    op: str, name: str, buf: Tensor, shape: tuple[int, ...], dtypes: tuple[Any, ...], ref: Tensor
) -> Tensor:
    """A caller's output buffer: ``shape``, one of ``dtypes``, on ``ref``'s device, rows with a
    unit last stride (the row stride is free)."""
    _checks.tensor(op, name, buf)
    if buf.dtype not in dtypes:
        raise TypeError(
            f"{op}: {name} has dtype {_checks._dt(buf.dtype)}; expected {' or '.join(_checks._dt(d) for d in dtypes)}"
        )
    if tuple(buf.shape) != shape:
        raise ValueError(f"{op}: {name} has shape {tuple(buf.shape)}, expected {list(shape)}")
    _checks.same_device(op, "topk_ids" if op == _AL else "gating_output", ref, **{name: buf})
    if len(shape) == 2 and shape[1] > 1 and buf.stride(1) != 1:
        raise ValueError(f"{op}: {name} has a non-contiguous last dimension (stride {buf.stride(1)})")
    if len(shape) == 2 and shape[0] > 1 and buf.stride(0) < shape[1]:
        raise ValueError(f"{op}: {name} rows overlap (strides {buf.stride()})")
    return buf


def check_topk(
    op: str,
    g: Tensor,
    topk: int,
    renormalize: bool = False,
    correction_bias: Tensor | None = None,
    moe_softcapping: float = 0.0,
    bias_on_logits: bool = False,
    topk_weights: Tensor | None = None,
    topk_ids: Tensor | None = None,
    token_expert_indices: Tensor | None = None,
) -> tuple[tuple[Any, ...], Any]:
    """-> ((w, ids, tei, has_tei, g, bias, has_bias, renormalize, softcap, bias_on_logits), (w, ids));
    absent optional tensors are passed as another (unread) tensor with its flag False."""
    try:  # the serving call (no bias, no buffers), each attribute read once; else the full checks
        if (
            correction_bias is None
            and topk_weights is None
            and topk_ids is None
            and token_expert_indices is None
            and type(g) is torch.Tensor  # plain tensors (fake ones, subclasses: the full checks)
            and type(topk) is int
            and (renormalize is False or renormalize is True)
            and (bias_on_logits is False or bias_on_logits is True)
            and type(moe_softcapping) is float
            and 0.0 <= moe_softcapping < math.inf
        ):
            t, e = g.shape  # not 2-D raises: the full checks name it
            if 0 < topk <= e and g.dtype in _checks.FLOAT_DTYPES and (e == 1 or g.stride()[1] == 1):
                dev = g.device
                p = _checks.PROTOS.get(dev) or _checks.protos(dev)
                w, ids_ = p[torch.float32].new_empty(t, topk), p[torch.int32].new_empty(t, topk)
                fast = (w, ids_, ids_, False, g, g, False, renormalize, moe_softcapping, bias_on_logits)
                return fast, (w, ids_)
    except Exception:  # not a tensor, ...: the full checks say what is wrong
        pass
    scoring = partial(_softmax_scoring, moe_softcapping, bias_on_logits)
    return _check_route(
        _TK, g, topk, renormalize, correction_bias, topk_weights, topk_ids, token_expert_indices, scoring
    )


def _softmax_scoring(moe_softcapping: float, bias_on_logits: bool) -> tuple[float, bool]:
    """topk_softmax's scoring arguments, checked -> (softcap, bias_on_logits)."""
    if not isinstance(bias_on_logits, bool):
        raise TypeError(f"{_TK}: bias_on_logits must be a bool, got {bias_on_logits!r}")
    if isinstance(moe_softcapping, bool) or not isinstance(moe_softcapping, (int, float)):
        raise TypeError(f"{_TK}: moe_softcapping must be a float, got {moe_softcapping!r}")
    cap = float(moe_softcapping)
    if not (0.0 <= cap < math.inf):
        raise ValueError(f"{_TK}: moe_softcapping must be finite and >= 0 (0: off), got {moe_softcapping!r}")
    return cap, bias_on_logits


def _check_route(
    op: str,
    g: Tensor,
    topk: int,
    renormalize: bool,
    correction_bias: Tensor | None,
    topk_weights: Tensor | None,
    topk_ids: Tensor | None,
    token_expert_indices: Tensor | None,
    scoring: Callable[[], tuple[Any, ...]] = tuple,
) -> tuple[tuple[Any, ...], Any]:
    """The contract of a routing op (topk_softmax, topk_sigmoid): the gating logits, topk and
    renormalize, then the op's own scoring arguments (``scoring()`` checks them and returns
    their kernel arguments), then the bias and output buffers -> ((w, ids, tei, has_tei, g,
    bias, has_bias, renormalize, *scoring), (w, ids))."""
    _checks.no_caller_outputs_when_compiling(
        op, "topk_weights / topk_ids / token_expert_indices", topk_weights, topk_ids, token_expert_indices
    )
    k = _check_gating(op, g, topk, renormalize)
    extra = scoring()
    kargs, result = _route_outputs(op, g, k, correction_bias, topk_weights, topk_ids, token_expert_indices)
    return (*kargs, renormalize, *extra), result


def _check_gating(op: str, g: Tensor, topk: int, renormalize: bool) -> int:
    """The checks of a routing op's gating logits, topk and renormalize; -> topk."""
    _checks.tensor(op, "gating_output", g)
    _checks.float_dtype(op, "gating_output", g)
    if g.dim() != 2 or g.shape[1] == 0:
        raise ValueError(f"{op}: gating_output has shape {tuple(g.shape)}, expected [T, E] with E >= 1")
    k = _checks.positive_int(op, "topk", topk)
    e = g.shape[1]
    if k > e:
        raise ValueError(f"{op}: topk {k} exceeds the number of experts {e}")
    _checks.rows(op, "gating_output", g, e)
    if not isinstance(renormalize, bool):
        raise TypeError(f"{op}: renormalize must be a bool, got {renormalize!r}")
    return k


def _route_outputs(
    op: str,
    g: Tensor,
    k: int,
    correction_bias: Tensor | None,
    topk_weights: Tensor | None,
    topk_ids: Tensor | None,
    token_expert_indices: Tensor | None,
) -> tuple[tuple[Any, ...], tuple[Tensor, Tensor]]:
    """A routing op's bias and output buffers (checked or allocated) -> ((w, ids, tei, has_tei,
    g, bias, has_bias), (w, ids)); absent optional tensors are passed as another (unread) tensor
    with its flag False."""
    t, e = g.shape
    if correction_bias is not None:
        _checks.tensor(op, "correction_bias", correction_bias)
        _checks.exact_dtype(op, "correction_bias", correction_bias, torch.float32)
        _checks.same_device(op, "gating_output", g, correction_bias=correction_bias)
        _checks.vector(op, "correction_bias", correction_bias, e, "one per expert")
    w = (
        torch.empty((t, k), dtype=torch.float32, device=g.device)
        if topk_weights is None
        else _buffer(op, "topk_weights", topk_weights, (t, k), (torch.float32,), g)
    )
    ids = (
        torch.empty((t, k), dtype=torch.int32, device=g.device)
        if topk_ids is None
        else _buffer(op, "topk_ids", topk_ids, (t, k), (torch.int32, torch.int64), g)
    )
    tei = token_expert_indices
    if tei is not None:
        _buffer(op, "token_expert_indices", tei, (t, k), (torch.int32,), g)
    bias = correction_bias
    kargs = (
        w,
        ids,
        ids if tei is None else tei,
        tei is not None,
        g,
        g if bias is None else bias,
        bias is not None,
    )
    return kargs, (w, ids)


def check_sigmoid(
    op: str,
    g: Tensor,
    topk: int,
    renormalize: bool = False,
    correction_bias: Tensor | None = None,
    topk_weights: Tensor | None = None,
    topk_ids: Tensor | None = None,
    token_expert_indices: Tensor | None = None,
) -> tuple[tuple[Any, ...], Any]:
    """-> ((w, ids, tei, has_tei, g, bias, has_bias, renormalize), (w, ids)): topk_softmax's
    contract without softcapping and bias_on_logits."""
    try:  # the serving call (no buffers, a dense float32 bias or none), each attribute read once
        if (
            topk_weights is None
            and topk_ids is None
            and token_expert_indices is None
            and type(g) is torch.Tensor  # plain tensors (fake ones, subclasses: the full checks)
            and type(topk) is int
            and (renormalize is False or renormalize is True)
        ):
            t, e = g.shape  # not 2-D raises: the full checks name it
            dev = g.device
            if (
                0 < topk <= e
                and g.dtype in _checks.FLOAT_DTYPES
                and (e == 1 or g.stride()[1] == 1)
                and (
                    correction_bias is None
                    or (
                        type(correction_bias) is torch.Tensor
                        and correction_bias.dtype == torch.float32
                        and correction_bias.shape == (e,)
                        and correction_bias.is_contiguous()  # [e], e >= 1: a unit stride (or one expert)
                        and correction_bias.device == dev
                    )
                )
            ):
                p = _checks.PROTOS.get(dev) or _checks.protos(dev)
                w, ids = p[torch.float32].new_empty(t, topk), p[torch.int32].new_empty(t, topk)
                if correction_bias is None:
                    return (w, ids, ids, False, g, g, False, renormalize), (w, ids)
                return (w, ids, ids, False, g, correction_bias, True, renormalize), (w, ids)
    except Exception:  # not a tensor, ...: the full checks say what is wrong
        pass
    return _check_route(
        _TS, g, topk, renormalize, correction_bias, topk_weights, topk_ids, token_expert_indices
    )


def outputs_route(g: Tensor, topk: int, *_: Any) -> tuple[tuple[Any, ...], tuple[Tensor, Tensor]]:
    """A routing op's serving lane outputs (Decl.outputs): what the contract allocates for a call
    without buffers, float32 weights and int32 ids [T, topk] (no token_expert_indices)."""
    if type(topk) is not int or not 0 < topk <= g.shape[1]:
        raise ValueError("not the serving form")  # the contract speaks
    t, dev = g.shape[0], g.device
    p = _checks.PROTOS.get(dev) or _checks.protos(dev)
    w, ids = p[torch.float32].new_empty(t, topk), p[torch.int32].new_empty(t, topk)
    return (w, ids, None), (w, ids)


def outputs_align(
    ids: Tensor,
    block_size: int,
    num_experts: int,
    expert_map: Tensor | None = None,
    pad_sorted_token_ids: bool = True,
    unused_expert_id: int = -1,
    *_: Any,
) -> tuple[tuple[Any, ...], tuple[Tensor, Tensor, Tensor]]:
    """moe_align_block_size's serving lane outputs (Decl.outputs): the three int32 buffers check_align's
    serving path allocates for a call without buffers (no cumsum_buffer). Only for
    pad_sorted_token_ids=True: the contract pads its own buffer whatever that flag says, the lane
    pads a buffer it is given as the flag says."""
    if not (
        expert_map is None
        and pad_sorted_token_ids is True
        and type(block_size) is int
        and type(num_experts) is int
        and type(unused_expert_id) is int
        and 0 < block_size < 2**31
        and 0 < num_experts < 2**31
        and -(2**31) < unused_expert_id < 2**31
    ):
        raise ValueError("not the serving form")  # the contract speaks
    t, k = ids.shape
    max_padded = t * k + num_experts * (block_size - 1)
    if max_padded >= 2**31:
        raise ValueError("not the serving form")
    dev = ids.device
    new = (_checks.PROTOS.get(dev) or _checks.protos(dev))[torch.int32].new_empty
    sorted_ids, experts, post = new(max_padded), new((max_padded + block_size - 1) // block_size), new(1)
    return (sorted_ids, experts, post, None), (sorted_ids, experts, post)


def outputs_batched(
    expert_num_tokens: Tensor, max_tokens_per_batch: int, block_size: int, *_: Any
) -> tuple[tuple[Any, ...], tuple[Tensor, Tensor, Tensor]]:
    """batched_moe_align_block_size's serving lane outputs (Decl.outputs): the three int32 buffers
    check_batched's serving path allocates for a call without buffers."""
    if not (
        type(max_tokens_per_batch) is int
        and type(block_size) is int
        and 0 < max_tokens_per_batch < 2**31
        and 0 < block_size < 2**31
    ):
        raise ValueError("not the serving form")  # the contract speaks
    (e,) = expert_num_tokens.shape
    n = e * ((max_tokens_per_batch + block_size - 1) // block_size * block_size)
    if not (0 < e and n < 2**31 and e * max_tokens_per_batch < 2**31):
        raise ValueError("not the serving form")
    dev = expert_num_tokens.device
    new = (_checks.PROTOS.get(dev) or _checks.protos(dev))[torch.int32].new_empty
    sorted_ids, experts, post = new(n), new(n // block_size), new(1)
    return (sorted_ids, experts, post), (sorted_ids, experts, post)


def _check_ids_range(ids: Tensor, num_experts: int, expert_map: Tensor | None = None) -> None:
    """CPU only (free there); on CUDA the kernels skip bad ids instead of synchronising."""
    if ids.is_cpu:
        if not _checks.in_range(ids, 0, num_experts):  # the rest only when something is wrong
            bad = ((ids < 0) | (ids >= num_experts)).nonzero()
            where = tuple(bad[0].tolist())
            raise ValueError(
                f"{_AL}: topk_ids{list(where)} = {int(ids[where])} is out of range "
                f"[0, {num_experts}) (num_experts)"
            )
    if expert_map is not None and expert_map.is_cpu and expert_map.numel():
        if not _checks.in_range(expert_map, -1, num_experts):
            e = int(((expert_map < -1) | (expert_map >= num_experts)).nonzero()[0, 0])
            raise ValueError(
                f"{_AL}: expert_map[{e}] = {int(expert_map[e])} is out of range: local expert ids are "
                f"[0, {num_experts}), or -1 for an expert not on this rank"
            )


def _align_bound(numel: int, num_experts: int, block_size: int) -> int:
    """An upper bound of the padded total: every used expert (at most min(E, numel)) pads by
    fewer than block_size slots."""
    return numel + min(num_experts, numel) * (block_size - 1)


def _int32_vector(op: str, ref_name: str, name: str, buf: Tensor, n: int, what: str, ref: Tensor) -> Tensor:
    """A caller's int32 vector of at least ``n`` elements (dense, on ``ref``'s device, at most
    2^31 - 1 elements as the kernels index it); the kernels write all of it."""
    _checks.tensor(op, name, buf)
    _checks.exact_dtype(op, name, buf, torch.int32)
    _checks.same_device(op, ref_name, ref, **{name: buf})
    if buf.dim() != 1 or buf.shape[0] < n:
        raise ValueError(
            f"{op}: {name} has shape {tuple(buf.shape)}, expected a vector of at least {n} ({what})"
        )
    if buf.shape[0] > 1 and buf.stride(0) != 1:
        raise ValueError(f"{op}: {name} has stride {buf.stride(0)}; it must be dense")
    if buf.shape[0] >= 2**31:
        raise ValueError(f"{op}: {name} has {buf.shape[0]} elements; at most {2**31 - 1}")
    return buf


_vec_buffer = partial(_int32_vector, _AL, "topk_ids")  # moe_align_block_size's buffers
_batched_buffer = partial(_int32_vector, _BA, "expert_num_tokens")  # batched_moe_align_block_size's


def check_align(
    op: str,
    ids: Tensor,
    block_size: int,
    num_experts: int,
    expert_map: Tensor | None = None,
    pad_sorted_token_ids: bool = True,
    unused_expert_id: int = -1,
    sorted_token_ids: Tensor | None = None,
    expert_ids: Tensor | None = None,
    num_tokens_post_padded: Tensor | None = None,
    cumsum_buffer: Tensor | None = None,
) -> tuple[tuple[Any, ...], Any]:
    """-> ((sorted_token_ids, expert_ids, num_tokens_post_padded, cumsum, has_cumsum, ids,
    expert_map, has_map, block_size, num_experts, pad, unused_expert_id), the three outputs);
    absent optional tensors are passed as another (unread) tensor with its flag False."""
    try:  # the serving call (no map, no buffers), each attribute read once; else the full checks
        if (
            expert_map is None
            and sorted_token_ids is None
            and expert_ids is None
            and num_tokens_post_padded is None
            and cumsum_buffer is None
            and type(ids) is torch.Tensor  # plain tensors (fake ones, subclasses: the full checks)
            and type(block_size) is int
            and type(num_experts) is int
            and type(pad_sorted_token_ids) is bool
            and type(unused_expert_id) is int
            and 0 < block_size < 2**31
            and 0 < num_experts < 2**31
            and -(2**31) < unused_expert_id < 2**31
        ):
            t, k = ids.shape  # not 2-D raises: the full checks name it
            dt = ids.dtype
            max_padded = t * k + num_experts * (block_size - 1)
            if (dt is torch.int32 or dt is torch.int64) and ids.is_contiguous() and max_padded < 2**31:
                # int32 ids: new_empty takes their dtype and device; int64 ones: the int32 prototype
                if dt is torch.int64:
                    dev = ids.device
                    new = (_checks.PROTOS.get(dev) or _checks.protos(dev))[torch.int32].new_empty
                else:
                    new = ids.new_empty
                sorted_ids = new(max_padded)
                experts = new((max_padded + block_size - 1) // block_size)
                post = new(1)
                fast = (sorted_ids, experts, post, post, False, ids, ids, False)
                return (*fast, block_size, num_experts, True, unused_expert_id), (sorted_ids, experts, post)
    except Exception:  # not a tensor, ...: the full checks say what is wrong
        pass
    _checks.no_caller_outputs_when_compiling(
        _AL,
        "sorted_token_ids / expert_ids / num_tokens_post_padded / cumsum_buffer",
        sorted_token_ids,
        expert_ids,
        num_tokens_post_padded,
        cumsum_buffer,
    )
    _checks.tensor(_AL, "topk_ids", ids)
    if ids.dtype != torch.int64:
        _checks.exact_dtype(_AL, "topk_ids", ids, torch.int32)
    if ids.dim() != 2:
        raise ValueError(f"{_AL}: topk_ids has shape {tuple(ids.shape)}, expected [T, k]")
    if not ids.is_contiguous():
        raise ValueError(
            f"{_AL}: topk_ids is non-contiguous (strides {ids.stride()}); pass topk_ids.contiguous()"
        )
    bs = _checks.positive_int(_AL, "block_size", block_size)
    e = _checks.positive_int(_AL, "num_experts", num_experts)
    for name, v in (("block_size", bs), ("num_experts", e)):
        if v >= 2**31:  # the kernels count in int32: report it here, not as a wrapped expert id
            raise ValueError(f"{_AL}: {name} = {v} does not fit int32 (at most {2**31 - 1})")
    if not isinstance(pad_sorted_token_ids, bool):
        raise TypeError(f"{_AL}: pad_sorted_token_ids must be a bool, got {pad_sorted_token_ids!r}")
    if (
        isinstance(unused_expert_id, bool)
        or not isinstance(unused_expert_id, int)
        or abs(unused_expert_id) >= 2**31
    ):
        raise ValueError(f"{_AL}: unused_expert_id must be an int32, got {unused_expert_id!r}")
    numel = ids.numel()
    max_padded = numel + e * (bs - 1)
    if max_padded >= 2**31:
        raise ValueError(f"{_AL}: {max_padded} padded slots do not fit int32")
    if expert_map is not None:
        _checks.tensor(_AL, "expert_map", expert_map)
        _checks.exact_dtype(_AL, "expert_map", expert_map, torch.int32)
        _checks.same_device(_AL, "topk_ids", ids, expert_map=expert_map)
        _checks.vector(_AL, "expert_map", expert_map, e, "global expert id -> local id, or -1")
    dev = ids.device
    need = _align_bound(numel, e, bs)
    if sorted_token_ids is None:
        sorted_ids = torch.empty(max_padded, dtype=torch.int32, device=dev)
        pad = True  # the op's own buffer is always padded
    else:
        sorted_ids = _vec_buffer(
            "sorted_token_ids", sorted_token_ids, need, "T*k + min(E, T*k)*(block_size-1)", ids
        )
        pad = pad_sorted_token_ids
    if expert_ids is None:
        experts = torch.empty((max_padded + bs - 1) // bs, dtype=torch.int32, device=dev)
    else:
        experts = _vec_buffer("expert_ids", expert_ids, need // bs, "one per block", ids)
    if num_tokens_post_padded is None:
        post = torch.empty(1, dtype=torch.int32, device=dev)
    else:
        post = _vec_buffer("num_tokens_post_padded", num_tokens_post_padded, 1, "the padded total", ids)
    if cumsum_buffer is not None:
        _vec_buffer("cumsum_buffer", cumsum_buffer, e + 1, "num_experts + 1", ids)
    kargs = (
        sorted_ids,
        experts,
        post,
        post if cumsum_buffer is None else cumsum_buffer,
        cumsum_buffer is not None,
        ids,
        ids if expert_map is None else expert_map,
        expert_map is not None,
        bs,
        e,
        pad,
        unused_expert_id,
    )
    return kargs, (sorted_ids, experts, post)


def values_align(
    ids: Tensor, block_size: int, num_experts: int, expert_map: Tensor | None = None, *_: Any
) -> None:
    _check_ids_range(ids, num_experts, expert_map)


def _softcap(g: Tensor, cap: float) -> Tensor:
    return g if not cap else torch.tanh(g / cap) * cap


def _token_expert_indices(buf: Tensor, t: int, k: int) -> None:
    """``[i, j] = j * T + i``: the row of token i's j-th copy in the expanded (k-major) input."""
    src = torch.arange(k, device=buf.device, dtype=torch.int64).mul_(t)
    buf.copy_(src.unsqueeze(0) + torch.arange(t, device=buf.device, dtype=torch.int64).unsqueeze(1))


def _ref_route(
    scores: Tensor,
    key: Tensor,
    topk: int,
    renormalize: bool,
    topk_weights: Tensor | None,
    topk_ids: Tensor | None,
    token_expert_indices: Tensor | None,
) -> tuple[Tensor, Tensor]:
    """The reference routing's common tail: the ``topk`` experts by ``key`` (a stable descending
    sort: equal keys keep index order, so the lower id wins), weighted by ``scores``, into the
    caller's buffers when given."""
    ids = torch.sort(key, dim=-1, descending=True, stable=True).indices[:, :topk]
    w = scores.gather(-1, ids)
    if renormalize:
        w = w / w.sum(-1, keepdim=True)
    if token_expert_indices is not None:
        _token_expert_indices(token_expert_indices, scores.shape[0], topk)
    w = w if topk_weights is None else topk_weights.copy_(w)
    ids = ids.to(torch.int32) if topk_ids is None else topk_ids.copy_(ids)
    return w, ids


def _torch_route_out(
    w: Tensor, ids: Tensor, tei: Tensor, has_tei: bool, order: Tensor, wk: Tensor, renormalize: bool
) -> None:
    """The torch backend's common tail: the chosen experts ``order`` and their weights ``wk``
    (renormalized when asked) into ``w`` / ``ids``, and ``tei`` when given."""
    if renormalize:
        wk = wk / wk.sum(-1, keepdim=True)
    w.copy_(wk)
    ids.copy_(order)
    if has_tei:
        _token_expert_indices(tei, w.shape[0], w.shape[1])


def ref_topk(
    gating_output: Tensor,
    topk: int,
    renormalize: bool = False,
    correction_bias: Tensor | None = None,
    moe_softcapping: float = 0.0,
    bias_on_logits: bool = False,
    topk_weights: Tensor | None = None,
    topk_ids: Tensor | None = None,
    token_expert_indices: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    g = _softcap(gating_output.float(), float(moe_softcapping))
    bias = None if correction_bias is None else correction_bias.float()
    if bias is not None and bias_on_logits:
        g = g + bias
    probs = torch.softmax(g, dim=-1)
    # rank by logit (by softmax + bias for DeepSeek's correction bias)
    key = probs + bias if bias is not None and not bias_on_logits else g
    return _ref_route(probs, key, topk, renormalize, topk_weights, topk_ids, token_expert_indices)


def torch_topk(
    w: Tensor,
    ids: Tensor,
    tei: Tensor,
    has_tei: bool,
    gating_output: Tensor,
    bias: Tensor,
    has_bias: bool,
    renormalize: bool,
    softcap: float,
    bias_on_logits: bool,
) -> None:
    g = _softcap(gating_output.float(), softcap)
    if has_bias and bias_on_logits:
        g = g + bias
    k = w.shape[1]
    lse = torch.logsumexp(g, dim=-1, keepdim=True)
    if has_bias and not bias_on_logits:
        p = torch.softmax(g, dim=-1)
        order = torch.argsort(p + bias, dim=-1, descending=True, stable=True)[:, :k]
        wk = p.gather(-1, order)
    else:
        # stable argsort: logit order, equal logits by lower index
        order = torch.argsort(g, dim=-1, descending=True, stable=True)[:, :k]
        wk = torch.exp(g.gather(-1, order) - lse)
    _torch_route_out(w, ids, tei, has_tei, order, wk, renormalize)


def ref_sigmoid(
    gating_output: Tensor,
    topk: int,
    renormalize: bool = False,
    correction_bias: Tensor | None = None,
    topk_weights: Tensor | None = None,
    topk_ids: Tensor | None = None,
    token_expert_indices: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    s = torch.sigmoid(gating_output.float())
    key = s if correction_bias is None else s + correction_bias.float()
    return _ref_route(s, key, topk, renormalize, topk_weights, topk_ids, token_expert_indices)


def torch_sigmoid(
    w: Tensor,
    ids: Tensor,
    tei: Tensor,
    has_tei: bool,
    gating_output: Tensor,
    bias: Tensor,
    has_bias: bool,
    renormalize: bool,
) -> None:
    s = torch.sigmoid(gating_output.float())
    k = w.shape[1]
    order = torch.argsort(s + bias if has_bias else s, dim=-1, descending=True, stable=True)[:, :k]
    _torch_route_out(w, ids, tei, has_tei, order, s.gather(-1, order), renormalize)


def _mapped(flat: Tensor, num_experts: int, expert_map: Tensor | None) -> Tensor:
    """Each entry's bin: its expert (through ``expert_map``), or ``num_experts`` when it is not
    placed (mapped to -1; on CUDA also an id out of range)."""
    e = num_experts
    valid = (flat >= 0) & (flat < e)
    flat = torch.where(valid, flat, e)
    if expert_map is not None:
        local = torch.cat([expert_map.long(), expert_map.new_full((1,), -1).long()])[flat]
        flat = torch.where((local >= 0) & (local < e), local, e)
    return flat


def ref_align(
    topk_ids: Tensor,
    block_size: int,
    num_experts: int,
    expert_map: Tensor | None = None,
    pad_sorted_token_ids: bool = True,
    unused_expert_id: int = -1,
    sorted_token_ids: Tensor | None = None,
    expert_ids: Tensor | None = None,
    num_tokens_post_padded: Tensor | None = None,
    cumsum_buffer: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    flat = topk_ids.flatten()
    n = flat.numel()
    if n and (int(flat.min()) < 0 or int(flat.max()) >= num_experts):
        _check_ids_range(topk_ids.cpu(), num_experts)
    if expert_map is not None:
        _check_ids_range(topk_ids[:0].cpu(), num_experts, expert_map.cpu())
    bins = _mapped(flat.long(), num_experts, expert_map)
    max_padded = n + num_experts * (block_size - 1)
    dev = topk_ids.device
    if sorted_token_ids is None:
        sorted_ids = torch.full((max_padded,), n, dtype=torch.int32, device=dev)
    else:
        sorted_ids = sorted_token_ids
        if pad_sorted_token_ids:
            sorted_ids.fill_(n)
    nblocks = (max_padded + block_size - 1) // block_size if expert_ids is None else expert_ids.numel()
    experts = torch.full((nblocks,), unused_expert_id, dtype=torch.int32, device=dev)
    starts = []
    pos = 0
    for e in range(num_experts):
        starts.append(pos)
        idx = (bins == e).nonzero().flatten()  # increasing: token order within the expert
        c = idx.numel()
        sorted_ids[pos : pos + c] = idx.to(torch.int32)
        padded = (c + block_size - 1) // block_size * block_size
        experts[pos // block_size : (pos + padded) // block_size] = e
        pos += padded
    if expert_ids is not None:
        experts = expert_ids.copy_(experts)
    post = torch.tensor([pos], dtype=torch.int32, device=dev)
    if num_tokens_post_padded is not None:
        post = num_tokens_post_padded
        post[0] = pos
    if cumsum_buffer is not None:
        cumsum_buffer[: num_experts + 1].copy_(torch.tensor([*starts, pos], dtype=torch.int32))
    return sorted_ids, experts, post


def torch_align(
    sorted_ids: Tensor,
    expert_ids: Tensor,
    post: Tensor,
    cumsum: Tensor,
    has_cumsum: bool,
    topk_ids: Tensor,
    expert_map: Tensor,
    has_map: bool,
    block_size: int,
    num_experts: int,
    pad: bool,
    fill: int,
) -> None:
    flat = topk_ids.flatten().long()
    n, e, bs = flat.numel(), num_experts, block_size
    flat = _mapped(flat, e, expert_map if has_map else None)  # bad ids (CUDA only) sort last, dropped
    counts = torch.bincount(flat, minlength=e + 1)[:e]
    padded = (counts + bs - 1) // bs * bs
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(flat, stable=True)
    se = flat[order]
    keep = se < e
    order, se = order[keep], se[keep]
    first = torch.cumsum(counts, 0) - counts  # rank of an expert's first entry in `order`
    pos = starts[se] + torch.arange(se.numel(), device=flat.device) - first[se]
    if pad:
        sorted_ids.fill_(n)
    sorted_ids[pos] = order.to(torch.int32)
    total = ends[-1:]
    blocks = torch.arange(expert_ids.numel(), device=flat.device)
    owner = torch.searchsorted(ends // bs, blocks, right=True)
    expert_ids.copy_(torch.where(blocks < total // bs, owner, fill))
    post[:1].copy_(total)
    if has_cumsum:
        cumsum[:e].copy_(starts)
        cumsum[e : e + 1].copy_(total)


def check_batched(
    op: str,
    expert_num_tokens: Tensor,
    max_tokens_per_batch: int,
    block_size: int,
    sorted_ids: Tensor | None = None,
    expert_ids: Tensor | None = None,
    num_tokens_post_padded: Tensor | None = None,
) -> tuple[tuple[Any, ...], Any]:
    """-> ((sorted_ids, expert_ids, num_tokens_post_padded, expert_num_tokens,
    max_tokens_per_batch, block_size), the three outputs)."""
    try:  # the serving call (no buffers), each attribute read once; else the full checks
        if (
            sorted_ids is None
            and expert_ids is None
            and num_tokens_post_padded is None
            and type(expert_num_tokens) is torch.Tensor  # plain ones (fake, subclasses: the full checks)
            and type(max_tokens_per_batch) is int
            and type(block_size) is int
            and max_tokens_per_batch > 0
            and block_size > 0
        ):
            (e,) = expert_num_tokens.shape  # not 1-D raises: the full checks name it
            n = e * ((max_tokens_per_batch + block_size - 1) // block_size * block_size)
            if (
                e > 0
                and expert_num_tokens.dtype is torch.int32
                and (e == 1 or expert_num_tokens.stride()[0] == 1)
                and n < 2**31
                and e * max_tokens_per_batch < 2**31
            ):
                new = expert_num_tokens.new_empty  # int32 on the counts' device
                out = (new(n), new(n // block_size), new(1))
                return (*out, expert_num_tokens, max_tokens_per_batch, block_size), out
    except Exception:  # not a tensor, ...: the full checks say what is wrong
        pass
    _checks.no_caller_outputs_when_compiling(
        _BA,
        "sorted_ids / expert_ids / num_tokens_post_padded",
        sorted_ids,
        expert_ids,
        num_tokens_post_padded,
    )
    counts = expert_num_tokens
    _checks.tensor(_BA, "expert_num_tokens", counts)
    _checks.exact_dtype(_BA, "expert_num_tokens", counts, torch.int32)
    if counts.dim() != 1 or counts.shape[0] == 0:
        raise ValueError(
            f"{_BA}: expert_num_tokens has shape {tuple(counts.shape)}, expected [E] with E >= 1"
        )
    if counts.shape[0] > 1 and counts.stride(0) != 1:
        raise ValueError(f"{_BA}: expert_num_tokens has stride {counts.stride(0)}; it must be dense")
    m = _checks.positive_int(_BA, "max_tokens_per_batch", max_tokens_per_batch)
    bs = _checks.positive_int(_BA, "block_size", block_size)
    e = counts.shape[0]
    n = e * ((m + bs - 1) // bs * bs)
    if n >= 2**31 or e * m >= 2**31:
        raise ValueError(
            f"{_BA}: {e} experts of {m} tokens padded to blocks of {bs} ({n} slots) do not fit int32"
        )
    dev = counts.device
    what = "E * round_up(max_tokens_per_batch, block_size)"
    sorted_ = (
        torch.empty(n, dtype=torch.int32, device=dev)
        if sorted_ids is None
        else _batched_buffer("sorted_ids", sorted_ids, n, what, counts)
    )
    experts = (
        torch.empty(n // bs, dtype=torch.int32, device=dev)
        if expert_ids is None
        else _batched_buffer("expert_ids", expert_ids, n // bs, "one per block", counts)
    )
    post = (
        torch.empty(1, dtype=torch.int32, device=dev)
        if num_tokens_post_padded is None
        else _batched_buffer("num_tokens_post_padded", num_tokens_post_padded, 1, "the padded total", counts)
    )
    return (sorted_, experts, post, counts, m, bs), (sorted_, experts, post)


def values_batched(expert_num_tokens: Tensor, max_tokens_per_batch: int, *_: Any) -> None:
    """CPU only (free there); on CUDA the kernels clamp counts into [0, max_tokens_per_batch]."""
    c = expert_num_tokens
    if c.is_cpu and not _checks.in_range(c, 0, max_tokens_per_batch + 1):
        e = int(((c < 0) | (c > max_tokens_per_batch)).nonzero()[0, 0])
        raise ValueError(
            f"{_BA}: expert_num_tokens[{e}] = {int(c[e])} is out of range "
            f"[0, {max_tokens_per_batch}] (max_tokens_per_batch)"
        )


def ref_batched(
    expert_num_tokens: Tensor,
    max_tokens_per_batch: int,
    block_size: int,
    sorted_ids: Tensor | None = None,
    expert_ids: Tensor | None = None,
    num_tokens_post_padded: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    counts = expert_num_tokens.cpu()
    values_batched(counts, max_tokens_per_batch)
    e, m, bs = counts.numel(), max_tokens_per_batch, block_size
    dev = expert_num_tokens.device
    n = e * ((m + bs - 1) // bs * bs) if sorted_ids is None else sorted_ids.numel()
    nb = e * ((m + bs - 1) // bs) if expert_ids is None else expert_ids.numel()
    out = torch.full((n,), e * m, dtype=torch.int32)
    blocks = torch.full((nb,), -1, dtype=torch.int32)
    pos = 0
    for x in range(e):
        c = int(counts[x])
        out[pos : pos + c] = torch.arange(x * m, x * m + c, dtype=torch.int32)
        padded = (c + bs - 1) // bs * bs
        blocks[pos // bs : (pos + padded) // bs] = x
        pos += padded
    post = torch.tensor([pos], dtype=torch.int32)
    res = []
    for mine, theirs in ((out, sorted_ids), (blocks, expert_ids), (post, num_tokens_post_padded)):
        if theirs is None:
            res.append(mine.to(dev))
        else:
            theirs[: mine.numel()].copy_(mine)
            res.append(theirs)
    return res[0], res[1], res[2]


def torch_batched(
    sorted_ids: Tensor, expert_ids: Tensor, post: Tensor, counts: Tensor, m: int, bs: int
) -> None:
    dev = counts.device
    c = counts.long().clamp(0, m)  # CPU counts were checked; CUDA ones are clamped, as the kernels do
    e = c.numel()
    padded = (c + bs - 1) // bs * bs
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    sorted_ids.fill_(e * m)
    rows = torch.repeat_interleave(torch.arange(e, device=dev), c)
    j = torch.arange(rows.numel(), device=dev) - (torch.cumsum(c, 0) - c)[rows]
    sorted_ids[starts[rows] + j] = (rows * m + j).to(torch.int32)
    total = ends[-1:]
    blocks = torch.arange(expert_ids.numel(), device=dev)
    owner = torch.searchsorted(ends // bs, blocks, right=True)
    expert_ids.copy_(torch.where(blocks < total // bs, owner, -1))
    post[:1].copy_(total)


# the routing ops: weights are float32 whatever the gating dtype; expert ids must match exactly
_ROUTING_TOLERANCES = (*TOLERANCES, INT32_EXACT, ("int64", (0.0, 0.0)))
topk_softmax = declare(
    _TK,
    "(Tensor gating_output, int topk, bool renormalize=False, Tensor? correction_bias=None, "
    "float moe_softcapping=0.0, bool bias_on_logits=False, Tensor(a!)? topk_weights=None, "
    "Tensor(a!)? topk_ids=None, Tensor(a!)? token_expert_indices=None) -> (Tensor, Tensor)",
    doc="gating [T, E] -> (softmax weights fp32 [T, k], expert ids int32/int64 [T, k]); ties -> lower id; "
    "softcap, correction bias (DeepSeek: chosen by softmax + bias; bias_on_logits: sgl-kernel's), "
    "caller buffers, token_expert_indices",
    check=check_topk,
    reference=ref_topk,
    torch=torch_topk,
    tolerances=_ROUTING_TOLERANCES,
    outputs=outputs_route,
)
moe_align_block_size = declare(
    _AL,
    "(Tensor topk_ids, int block_size, int num_experts, Tensor? expert_map=None, "
    "bool pad_sorted_token_ids=True, int unused_expert_id=-1, Tensor(a!)? sorted_token_ids=None, "
    "Tensor(a!)? expert_ids=None, Tensor(a!)? num_tokens_post_padded=None, "
    "Tensor(a!)? cumsum_buffer=None) -> (Tensor, Tensor, Tensor)",
    doc="topk_ids [T, k] -> (sorted_token_ids, expert_ids, num_tokens_post_padded), vLLM layout; "
    "expert_map (global -> local, -1: not on this rank), caller buffers, cumsum_buffer",
    check=check_align,
    values=values_align,
    reference=ref_align,
    torch=torch_align,
    dtypes=("int32", "int64"),  # int64 ids (vLLM's, sgl's) are read as they are
    tolerances=(INT32_EXACT, ("int64", (0.0, 0.0))),
    outputs=outputs_align,
)
topk_sigmoid = declare(
    _TS,
    "(Tensor gating_output, int topk, bool renormalize=False, Tensor? correction_bias=None, "
    "Tensor(a!)? topk_weights=None, Tensor(a!)? topk_ids=None, Tensor(a!)? token_expert_indices=None) "
    "-> (Tensor, Tensor)",
    doc="gating [T, E] -> (sigmoid weights fp32 [T, k], expert ids int32/int64 [T, k]), chosen by the sigmoid "
    "score (+ correction_bias: DeepSeek's, vLLM's); ties -> lower id; caller buffers, token_expert_indices",
    check=check_sigmoid,
    reference=ref_sigmoid,
    torch=torch_sigmoid,
    tolerances=_ROUTING_TOLERANCES,
    outputs=outputs_route,
)
batched_moe_align_block_size = declare(
    _BA,
    "(Tensor expert_num_tokens, int max_tokens_per_batch, int block_size, Tensor(a!)? sorted_ids=None, "
    "Tensor(a!)? expert_ids=None, Tensor(a!)? num_tokens_post_padded=None) -> (Tensor, Tensor, Tensor)",
    doc="expert_num_tokens int32 [E] (batched layout [E, max_tokens_per_batch]) -> (sorted_ids, expert_ids, "
    "num_tokens_post_padded), vLLM's batched layout; caller buffers",
    check=check_batched,
    values=values_batched,
    reference=ref_batched,
    torch=torch_batched,
    dtypes=("int32",),
    tolerances=(INT32_EXACT,),
    outputs=outputs_batched,
)
