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

from typing import TYPE_CHECKING, Any

from ...spec import Requirement
from .. import _checks
from .._common import INT32_EXACT, TOLERANCES
from .._decl import declare
from . import _experts, fused_experts_cuda, fused_experts_cutlass
from ._contract_items import BATCHED_ALIGN, MOE_ALIGN, TOPK_SIGMOID, TOPK_SOFTMAX

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

_TK = "moe.topk_softmax"
_TS = "moe.topk_sigmoid"
_BA = "moe.batched_moe_align_block_size"
_AL = "moe.moe_align_block_size"


def _check_ids_range(ids: Tensor, num_experts: int, expert_map: Tensor | None = None) -> None:
    """CPU only (free there); on CUDA the kernels skip bad ids instead of synchronising."""
    _experts.check_ids(_AL, ids, num_experts, "num_experts", expert_map, num_experts)


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
    contract=TOPK_SOFTMAX,
    reference=ref_topk,
    torch=torch_topk,
    tolerances=_ROUTING_TOLERANCES,
)
moe_align_block_size = declare(
    _AL,
    "(Tensor topk_ids, int block_size, int num_experts, Tensor? expert_map=None, "
    "bool pad_sorted_token_ids=True, int unused_expert_id=-1, Tensor(a!)? sorted_token_ids=None, "
    "Tensor(a!)? expert_ids=None, Tensor(a!)? num_tokens_post_padded=None, "
    "Tensor(a!)? cumsum_buffer=None) -> (Tensor, Tensor, Tensor)",
    doc="topk_ids [T, k] -> (sorted_token_ids, expert_ids, num_tokens_post_padded), vLLM layout; "
    "expert_map (global -> local, -1: not on this rank), caller buffers, cumsum_buffer",
    contract=MOE_ALIGN,
    values=values_align,
    reference=ref_align,
    torch=torch_align,
    dtypes=("int32", "int64"),  # int64 ids (vLLM's, sgl's) are read as they are
    tolerances=(INT32_EXACT, ("int64", (0.0, 0.0))),
)
topk_sigmoid = declare(
    _TS,
    "(Tensor gating_output, int topk, bool renormalize=False, Tensor? correction_bias=None, "
    "Tensor(a!)? topk_weights=None, Tensor(a!)? topk_ids=None, Tensor(a!)? token_expert_indices=None) "
    "-> (Tensor, Tensor)",
    doc="gating [T, E] -> (sigmoid weights fp32 [T, k], expert ids int32/int64 [T, k]), chosen by the sigmoid "
    "score (+ correction_bias: DeepSeek's, vLLM's); ties -> lower id; caller buffers, token_expert_indices",
    contract=TOPK_SIGMOID,
    reference=ref_sigmoid,
    torch=torch_sigmoid,
    tolerances=_ROUTING_TOLERANCES,
)
batched_moe_align_block_size = declare(
    _BA,
    "(Tensor expert_num_tokens, int max_tokens_per_batch, int block_size, Tensor(a!)? sorted_ids=None, "
    "Tensor(a!)? expert_ids=None, Tensor(a!)? num_tokens_post_padded=None) -> (Tensor, Tensor, Tensor)",
    doc="expert_num_tokens int32 [E] (batched layout [E, max_tokens_per_batch]) -> (sorted_ids, expert_ids, "
    "num_tokens_post_padded), vLLM's batched layout; caller buffers",
    contract=BATCHED_ALIGN,
    values=values_batched,
    reference=ref_batched,
    torch=torch_batched,
    dtypes=("int32",),
    tolerances=(INT32_EXACT,),
)
fused_experts = declare(
    _experts.OP,
    '(Tensor hidden, Tensor w1, Tensor w2, Tensor topk_weights, Tensor topk_ids, str activation="silu", '
    "bool apply_router_weight_on_input=False, Tensor? expert_map=None, Tensor? w1_scale=None, "
    "Tensor? w2_scale=None, bool vllm_rounding=False, Tensor(a!)? out=None) -> Tensor",
    doc="hidden [M, K] x experts w1 [E, 2N, K] (gate rows, then up), w2 [E, K, N] routed by topk_ids / "
    "topk_weights [M, topk] -> [M, K]: sum_j w_j * W2 act(W1 x); silu, gelu or swigluoai; expert_map "
    "(expert parallelism); bf16 / fp16 / fp32 weights, or fp8 e4m3 with 128x128 block scales (activations "
    "quantized per 1x128 group); vllm_rounding: vLLM's rounding of the activation and of the fp8 group scales",
    contract=_experts.FUSED_EXPERTS,
    values=_experts.values,
    reference=_experts.reference,
    torch=_experts.torch_experts,
    native=False,
    # the fp8 block-scaled form on sm_90a: CUTLASS grouped GEMMs (its own unit,
    # jit/csrc/moe_grouped_cuda.cu); its predicate refuses every other call with the reason
    vendor=(
        (
            fused_experts_cutlass.BACKEND,
            fused_experts_cutlass.fused_experts,
            Requirement(
                devices=("cuda",),
                dtypes=("float16", "bfloat16"),
                sm_min=90,
                sm_max=90,
                predicate="opmux.kernels.ops.moe.fused_experts_cutlass:supports",
            ),
        ),
        # the decode regime (at most MAX_TOKENS tokens): GEMVs on the CUDA cores in opmux's own
        # unit (jit/csrc/moe_decode_cuda.cu); its predicate refuses what the unit does not take
        (
            fused_experts_cuda.BACKEND,
            fused_experts_cuda.fused_experts,
            Requirement(
                devices=("cuda",),
                dtypes=("float16", "bfloat16"),
                sm_min=80,
                predicate="opmux.kernels.ops.moe.fused_experts_cuda:supports",
            ),
        ),
    ),
    # Triton first until measured: an H200 select table per (E, N) and M (configs/moe.fused_experts/
    # ...,dtype=fp8_w8a8,block_shape=[128,128],backend=select.json) puts cutlass or cuda first
    # where it wins
    priority=(("cuda", ("triton", "cutlass", fused_experts_cuda.BACKEND, "torch")),),
    # vLLM's tolerance for its fused MoE tests (atol 2e-2); fp8: one e4m3 step of an activation
    # group moves a product by up to 1/16 of a term (vLLM's block-fp8 MoE test: 0.035 relative)
    tolerances=(("float32", (1e-4, 1e-4)), ("float16", (2e-2, 2e-2)), ("bfloat16", (2e-2, 2e-2))),
)
