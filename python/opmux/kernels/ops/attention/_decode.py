"""``attention.paged_decode``: its contract as data, its values hook, its definition and its torch
backend (the op's description is ``op.py``'s docstring).

Kernel arguments: ``(out, lse, has_lse, query, key_cache, value_cache, block_tables, seq_lens,
sinks, has_sinks, k_scale, v_scale, fp8, scale, softcap, window_left)``: ``scale`` resolved (0.0
-> ``1 / sqrt(D)``), an absent ``lse`` / ``sinks`` an empty float32 tensor, and in the plain form
(a cache of query's dtype) ``seq_lens`` in the places of the scales (unread), as kvcache does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .. import _checks
from .._contract import FLOATS, FP8, Arg, Contract, Forms, Rule, Scalar, When

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

OP = "attention.paged_decode"
_I32 = 2**31 - 1
#: the most table positions (max_blocks_per_seq * page_size): the kernels step a few tiles and
#: splits past a table's end in 32-bit position arithmetic (masked), so the table stays far below
#: 2**31 (a billion tokens)
_POSITIONS = 2**30
#: the cache layouts the kernels take: any non-negative strides with a dense head dim (kvcache's)
_CACHE_HINT = (
    "has strides {{t}.stride()}; its head_dim must be dense (stride 1) and no stride negative (NHD "
    "[num_blocks, page_size, Hkv, D] and HND [num_blocks, Hkv, page_size, D] caches, as their "
    "[num_blocks, page_size, Hkv, D] view, are both fine)"
)
_CACHE_EXPECT = "[num_blocks, page_size, Hkv, {D}] (vLLM's flash layout; HND as its permuted view)"


def cache_scales(fp8: bool) -> tuple[Any, ...]:
    """The per-tensor k / v scales: required with an fp8 cache, refused with any other."""
    scales: tuple[Any, ...]
    if fp8:
        scales = (
            Rule(
                "k_scale is not None and v_scale is not None",
                "an fp8 cache needs k_scale and v_scale (float32, one element each: K = fp8 * k_scale)",
            ),
            *(
                Arg(
                    n,
                    "",
                    dtypes=("float32",),
                    device_of="query",
                    layout="element",
                    note=" (a per-tensor scale)",
                )
                for n in ("k_scale", "v_scale")
            ),
        )
    else:
        scales = (
            Rule(
                "k_scale is None and v_scale is None",
                "k_scale / v_scale apply to an fp8 cache (float8_e4m3fn); this cache is "
                "{str(key_cache.dtype)[6:]}: pass no scales, or an fp8 cache",
            ),
        )
    return scales


#: the value cache of a decode whose value head dim ``Dv`` may be below the key's ``D`` (absorbed
#: MLA: one latent cache [.., 1, 576], V its first 512 dims, often the view ``key_cache[..., :512]``)
_VALUE_EXPECT_MLA = (
    "[{NB}, {PS}, {Hkv}, Dv] like key_cache (Dv <= {D}: the value head dim, e.g. MLA's 512 of a "
    "576-dim latent cache)"
)


def value_dim_rule() -> Rule:
    """``Dv``, the value cache's head dim, at most the key's (MLA); out is ``[.., Dv]``."""
    return Rule(
        "Dv >= 1 and Dv <= D",
        "value_cache has head dim {Dv} and key_cache {D}: the value head dim must be between 1 and the "
        "key's (MLA: V is the first Dv dims of the latent cache, e.g. value_cache = key_cache[..., :512] "
        "of a 576-dim cache)",
    )


def cache_items(fp8: bool, value_dim: str = "D") -> tuple[Any, ...]:
    """The two paged caches (fp8 e4m3, or the query's dtype) and the head-count rules, as both
    paged attention ops state them. ``value_dim``: ``"D"`` (the value cache's head dim is the
    key's) or ``"Dv"`` (its own, at most ``D``: MLA, as paged_decode and paged_prefill take it;
    the rule follows the value cache)."""
    cache: dict[str, Any] = {"dtypes": FP8, "device_of": "query"} if fp8 else {"like": "query"}
    mla = value_dim != "D"
    return (
        Arg(
            "key_cache",
            "NB, PS, Hkv, D",
            layout="dense_last",
            expect=_CACHE_EXPECT,
            layout_hint=_CACHE_HINT,
            **cache,
        ),
        Rule(
            "PS >= 1 and Hkv >= 1",
            "key_cache has shape {tuple(key_cache.shape)}: page_size and Hkv must be at least 1",
        ),
        Rule(
            "Hq % Hkv == 0",
            "query has {Hq} heads, key_cache {Hkv}: the query heads must be a multiple of the KV heads "
            "(GQA / MQA)",
        ),
        Arg(
            "value_cache",
            f"NB, PS, Hkv, {value_dim}",
            like="key_cache",
            layout="dense_last",
            expect=_VALUE_EXPECT_MLA if mla else "{tuple(key_cache.shape)} like key_cache",
            layout_hint=_CACHE_HINT,
        ),
        *((value_dim_rule(),) if mla else ()),
    )


def knob_items() -> tuple[Any, ...]:
    """scale, softcap, the sliding window and the sinks, as both paged attention ops take them."""
    return (
        Scalar("scale", "off_or_positive"),
        Scalar("softcap", "off_or_positive"),
        Scalar("window_left", "int32"),
        Rule(
            "window_left >= -1",
            "window_left = {window_left}: -1 (no window) or the number of positions before the query "
            "to attend (>= 0)",
        ),
        Arg(
            "sinks",
            "Hq",
            dtypes=("float32",),
            device_of="query",
            layout="vector",
            note=" (one sink logit per query head)",
        ),
    )


def _items(fp8: bool) -> tuple[Any, ...]:
    scales = cache_scales(fp8)
    return (
        Arg(
            "query",
            "B, Hq, D",
            dtypes=FLOATS,
            layout="dense_last",
            expect="[batch, num_heads, head_dim]",
            layout_hint="has strides {{t}.stride()}; its head_dim must be dense (stride 1)",
        ),
        Rule(
            "Hq >= 1 and D >= 1",
            "query has shape {tuple(query.shape)}: num_heads and head_dim must be at least 1",
        ),
        *cache_items(fp8, "Dv"),
        Arg(
            "block_tables",
            "B, MB",
            dtypes=("int32",),
            device_of="query",
            layout="strided",
            expect="[{B}, max_blocks_per_seq]",
        ),
        Arg(
            "seq_lens",
            "B",
            dtypes=("int32",),
            device_of="query",
            layout="dense_last",
            note=" (one length per sequence)",
            layout_hint="has stride {{t}.stride(0)}; pass {t}.contiguous()",
        ),
        *knob_items(),
        *scales,
        Rule(
            f"MB * PS <= {_POSITIONS} and B * Hq <= {_I32}",
            "block_tables [{B}, {MB}] of {PS}-token pages: sizes exceed the kernel's 32-bit positions "
            f"(at most {_POSITIONS} table positions)",
            device="cuda",
        ),
        Arg("lse", "B, Hq", dtypes=("float32",), device_of="query", layout="strided", expect="[{B}, {Hq}]"),
        Arg(
            "out",
            "B, Hq, Dv",
            like="query",
            layout="dense_last",
            expect="[{B}, {Hq}, {Dv}] (value_cache's head dim {Dv})",
            out=True,
        ),
    )


_ARGS: tuple[str, ...] = (
    "out",
    "lse",
    "lse is not None",
    "query",
    "key_cache",
    "value_cache",
    "block_tables",
)
_ARGS += ("seq_lens", "sinks", "sinks is not None")
_TAIL = ("scale if scale > 0 else D ** -0.5", "softcap", "window_left")
PAGED_DECODE = Forms(
    "paged_decode",
    cases=(
        (
            (When("key_cache", dtype="float8_e4m3fn"),),
            Contract("decode_fp8", _items(True), (*_ARGS, "k_scale", "v_scale", "True", *_TAIL), "out"),
        ),
    ),
    default=Contract("decode", _items(False), (*_ARGS, "seq_lens", "seq_lens", "False", *_TAIL), "out"),
)


def values(
    query: Tensor, key_cache: Tensor, value_cache: Tensor, block_tables: Tensor, seq_lens: Tensor, *_: Any
) -> None:
    """CPU tensors (free there): every length within the table's capacity, every block id a
    sequence uses (the first ``cdiv(seq_len, page_size)`` entries of its row) a block of the
    cache. On CUDA the kernels clamp the lengths and skip bad blocks instead (no sync)."""
    if not (seq_lens.is_cpu and block_tables.is_cpu):
        return
    nb, ps = key_cache.shape[0], key_cache.shape[1]
    width = block_tables.shape[1]
    cap = width * ps
    if not _checks.in_range(seq_lens, 0, cap + 1):
        b = int(((seq_lens < 0) | (seq_lens > cap)).nonzero()[0, 0])
        raise ValueError(
            f"{OP}: seq_lens[{b}] = {int(seq_lens[b])} is out of range [0, {cap}] (block_tables has {width} "
            f"entries per sequence of {ps}-token pages)"
        )
    if not block_tables.numel() or _checks.in_range(block_tables, 0, nb):
        return
    need = (seq_lens.long() + ps - 1) // ps
    used = torch.arange(width)[None, :] < need[:, None]
    bad = (used & ((block_tables < 0) | (block_tables >= nb))).nonzero()
    if bad.numel():
        r, c = int(bad[0, 0]), int(bad[0, 1])
        raise ValueError(
            f"{OP}: block_tables[{r}, {c}] = {int(block_tables[r, c])} is out of range [0, {nb}) (key_cache's "
            f"blocks): sequence {r} (seq_len {int(seq_lens[r])}) uses the first {int(need[r])} entries of its row"
        )


# -- the definition --------------------------------------------------------------------------------
def _rows(cache: Tensor, blocks: Tensor, offsets: Tensor) -> Tensor:
    """``cache[blocks, offsets]`` (fp8 caches gathered as bytes: no fp8 index kernel)."""
    if cache.element_size() == 1 and cache.is_floating_point():
        return cache.view(torch.uint8)[blocks, offsets].view(cache.dtype)
    return cache[blocks, offsets]


def reference(
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    scale: float = 0.0,
    softcap: float = 0.0,
    window_left: int = -1,
    sinks: Tensor | None = None,
    k_scale: Tensor | None = None,
    v_scale: Tensor | None = None,
    lse: Tensor | None = None,
    out: Tensor | None = None,
) -> Tensor:
    """The definition, one sequence at a time: its keys and values gathered through its block
    table, scores in float32 (float64 for a float64 call: the parity harness's oracle), softcap,
    the window, the sinks in the denominator, the weighted sum in float32, one cast. Scores over
    the key head dim ``D``, values over the value cache's ``Dv`` (MLA: ``Dv < D``)."""
    f = torch.float64 if query.dtype == torch.float64 else torch.float32
    bsz, hq, d = query.shape
    ps, hkv, dv = key_cache.shape[1], key_cache.shape[2], value_cache.shape[3]
    g = hq // hkv
    sm = scale if scale > 0 else d**-0.5
    o = torch.zeros((bsz, hq, dv), dtype=f, device=query.device)
    lses = torch.full((bsz, hq), float("-inf"), dtype=f, device=query.device)
    for b, n in enumerate(seq_lens.tolist()):
        start = max(0, n - 1 - window_left) if window_left >= 0 else 0
        pos = torch.arange(start, n, device=query.device)
        blocks = block_tables[b].long()[pos // ps]
        k = _rows(key_cache, blocks, pos % ps).to(f)  # [n, Hkv, D]
        v = _rows(value_cache, blocks, pos % ps).to(f)  # [n, Hkv, Dv]
        if k_scale is not None and v_scale is not None:
            k, v = k * k_scale.to(f).reshape(()), v * v_scale.to(f).reshape(())
        s = torch.einsum("hgd,nhd->hgn", query[b].to(f).reshape(hkv, g, d), k) * sm
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        s = s.reshape(hq, -1)
        logits = torch.cat([s, sinks.to(f)[:, None]], 1) if sinks is not None else s
        lse_b = torch.logsumexp(logits, 1) if logits.shape[1] else lses[b]
        p = torch.exp(s - lse_b[:, None]) if s.shape[1] else s
        o[b] = torch.einsum("hgn,nhd->hgd", p.reshape(hkv, g, -1), v).reshape(hq, dv)
        lses[b] = lse_b
    if lse is not None:
        lse.copy_(lses)
    y = o.to(query.dtype)
    return y if out is None else out.copy_(y)


#: the torch backend gathers whole block-table rows for this many cache elements at a time
_CHUNK_ELEMENTS = 1 << 25


def attend_rows(
    out: Tensor,
    lse: Tensor | None,
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    blocks: Tensor,
    keep: Tensor,
    sinks: Tensor | None,
    k_scale: Tensor | None,
    v_scale: Tensor | None,
    scale: float,
    softcap: float,
) -> None:
    """One chunk of query rows ``[r, Hq, D]`` (into ``out [r, Hq, Dv]``, the value cache's head
    dim), each against a whole block-table row: ``blocks``
    ``[r, cap]`` the page of every position (already clamped into the cache), ``keep`` which
    positions the row sees. The definition's float32 arithmetic (softcap, sinks in the
    denominator only, an all-masked row gives 0 and its sinks' LSE) into ``out`` / ``lse``, as
    both paged ops' torch backends compute it."""
    r, hq, d = query.shape
    hkv, cap = key_cache.shape[2], blocks.shape[1]
    g = hq // hkv
    offsets = (torch.arange(cap, device=query.device) % key_cache.shape[1])[None, :]
    k = _rows(key_cache, blocks, offsets).float()  # [r, cap, Hkv, D]
    v = _rows(value_cache, blocks, offsets).float()
    if k_scale is not None and v_scale is not None:
        k, v = k * k_scale.reshape(()), v * v_scale.reshape(())
    s = torch.einsum("rhgd,rnhd->rhgn", query.float().reshape(r, hkv, g, d), k) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    s = s.reshape(r, hq, cap).masked_fill(~keep[:, None, :], float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.float()[None, :, None].expand(r, hq, 1)], 2)
    m = s.amax(2, keepdim=True).clamp_min(torch.finfo(torch.float32).min)  # all -inf: no NaN
    e = torch.exp(s - m)
    total = e.sum(2, keepdim=True)
    prob = (e / total.clamp_min(torch.finfo(torch.float32).tiny))[..., :cap]
    out.copy_(torch.einsum("rhgn,rnhd->rhgd", prob.reshape(r, hkv, g, cap), v).reshape(r, hq, -1))
    if lse is not None:
        lse.copy_((total.log() + m).squeeze(2))


def torch_decode(
    out: Tensor,
    lse: Tensor,
    has_lse: bool,
    query: Tensor,
    key_cache: Tensor,
    value_cache: Tensor,
    block_tables: Tensor,
    seq_lens: Tensor,
    sinks: Tensor,
    has_sinks: bool,
    k_scale: Tensor,
    v_scale: Tensor,
    fp8: bool,
    scale: float,
    softcap: float,
    window_left: int,
) -> None:
    """The definition's arithmetic on whole block-table rows, a chunk of sequences at a time:
    static shapes, the lengths kept on the device (no sync, CUDA-graph safe), lengths clamped to
    the table's capacity and bad block ids masked as the Triton kernel does."""
    bsz, hq, d = query.shape
    nb, ps, hkv = key_cache.shape[0], key_cache.shape[1], key_cache.shape[2]
    cap = block_tables.shape[1] * ps
    if bsz == 0:
        return
    if nb == 0 or cap == 0:  # no key at all: the sinks alone
        out.zero_()
        if has_lse:
            lse.copy_(sinks[None, :].expand(bsz, hq) if has_sinks else torch.full_like(lse, float("-inf")))
        return
    dev = query.device
    pos = torch.arange(cap, device=dev)
    step = max(1, _CHUNK_ELEMENTS // max(1, cap * hkv * d))  # the key rows: Dv <= D
    for b0 in range(0, bsz, step):
        b1 = min(bsz, b0 + step)
        table = block_tables[b0:b1].long()
        n = seq_lens[b0:b1].long().clamp(0, cap)[:, None]
        blocks = table[:, pos // ps]  # [b, cap]
        keep = (pos[None, :] < n) & (blocks >= 0) & (blocks < nb)
        if window_left >= 0:
            keep &= pos[None, :] >= n - 1 - window_left
        attend_rows(
            out[b0:b1], lse[b0:b1] if has_lse else None, query[b0:b1], key_cache, value_cache,
            blocks.clamp(0, nb - 1), keep, sinks if has_sinks else None,
            k_scale if fp8 else None, v_scale if fp8 else None, scale, softcap,
        )  # fmt: skip
