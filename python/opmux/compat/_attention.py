"""The engines' paged-attention entry points on opmux's ``attention.paged_decode`` /
``attention.paged_prefill`` (docs/compat.md): vLLM's ``unified_attention`` (``opmux.compat.vllm``)
and SGLang's Triton ``decode_attention_fwd`` / ``extend_attention_fwd`` (``opmux.compat.sgl_kernel``).

Each maps the engine's arguments onto the op's (window conventions, the CSR ``kv_indptr`` /
``kv_indices`` of SGLang's page-size-1 pools as a block table) and writes the caller's output
buffer. What the ops cannot compute (ALiBi, a q-q bias, fp8 output, tree masks, ...) raises
``NotImplementedError`` naming the argument: nothing is silently dropped. Importing this module
imports no torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from opmux.kernels.ops._torch import torch

__all__ = [
    "build_unified_kv_indices",
    "decode_attention_fwd",
    "decode_attention_fwd_grouped",
    "decode_attention_fwd_normal",
    "extend_attention_fwd",
    "extend_attention_fwd_unified",
    "unified_attention",
]

#: (value, device) -> a one-element float32 tensor (the op's per-tensor fp8 scales)
_SCALES: dict[tuple[float, Any], Tensor] = {}


def _attention() -> Any:
    return importlib.import_module("opmux.kernels.ops.attention")


def _refuse(name: str, why: str) -> None:
    raise NotImplementedError(
        f"{name}: {why}; opmux's attention.paged_decode / paged_prefill do not compute it"
    )


def _is_fp8(t: Tensor) -> bool:
    return t.dtype in (torch.float8_e4m3fn, torch.float8_e5m2)


def _scale_tensor(scale: Any, device: Any, name: str) -> Tensor:
    """A per-tensor scale as the op takes it (float32, one element): a tensor's first element (a
    view, no copy, no sync), a number cached per value and device (a fill, CUDA-graph safe)."""
    if isinstance(scale, torch.Tensor):
        if scale.numel() < 1:
            raise ValueError(f"{name} is empty: a per-tensor scale needs one element")
        flat = scale.reshape(-1)[:1]
        return flat if flat.dtype == torch.float32 else flat.float()
    key = (float(scale), device)
    t = _SCALES.get(key)
    if t is None:
        t = _SCALES[key] = torch.full((1,), float(scale), dtype=torch.float32, device=device)
    return t


def _sinks(sinks: Tensor | None) -> Tensor | None:
    """The op takes float32 sink logits (models keep them in their weight dtype)."""
    return sinks if sinks is None or sinks.dtype == torch.float32 else sinks.float()


def _capturing(t: Tensor) -> bool:
    return bool(t.is_cuda and torch.cuda.is_current_stream_capturing())


def _width(lens: Tensor, bound: int) -> int:
    """The block table's width for page size 1: the longest sequence, read once from the device,
    except while a CUDA graph is being captured (a read would fail there): then ``bound``, a
    static upper limit from the shapes (the table then costs ``B * bound`` int32)."""
    if lens.numel() == 0:
        return 1
    if _capturing(lens):
        return max(1, bound)
    return max(1, int(lens.max()))


def _csr_table(indptr: Tensor, indices: Tensor, width: int) -> Tensor:
    """``block_tables[b, j] = indices[indptr[b] + j]`` (page size 1) as int32 ``[B, width]``,
    gathered on the device; entries past a sequence's length are never read by the ops (they
    hold a neighbour's ids, clamped into ``indices``)."""
    b = indptr.shape[0] - 1
    if indices.numel() == 0:
        return torch.zeros((b, width), dtype=torch.int32, device=indptr.device)
    pos = indptr[:-1].long()[:, None] + torch.arange(width, device=indptr.device)[None, :]
    return indices[pos.clamp_(0, indices.numel() - 1)].to(torch.int32)


def _lse_f32(lse: Tensor | None) -> Tensor | None:
    """The ops' lse is float32: an engine's lse of another dtype is written through a float32
    copy (:func:`_lse_back` after the call)."""
    if lse is None or lse.dtype == torch.float32:
        return lse
    return torch.empty(lse.shape, dtype=torch.float32, device=lse.device)


def _lse_back(lse: Tensor | None, lse32: Tensor | None) -> None:
    if lse is not None and lse32 is not None and lse32 is not lse:
        lse.copy_(lse32)


def _i32(t: Tensor) -> Tensor:
    return t if t.dtype == torch.int32 else t.to(torch.int32)


def _engine_mask(
    name: str,
    custom_mask: Tensor | None,
    mask_indptr: Tensor | None,
    is_causal: bool,
    window: int,
    bsz: int,
    two_sided: bool = True,
    flag: str = "is_causal",
) -> dict[str, Any]:
    """The op's masking arguments for the engines' extend / prefill entries. A ``custom_mask``
    (speculative decoding's tree masks: each request's ``[extend_len, seq_len]`` bools row-major
    from ``mask_indptr[b]``, the op's layout) passes as it is and replaces either rule;
    ``is_causal=False`` without one is the op's ``causal=False`` (every key of the request).
    ``two_sided``: the engine's non-causal window bounds later keys too (SGLang: ``|k - q| <=
    window``), which the op's (positions back from the query) does not: refused, naming the
    engine's ``flag``; vLLM's non-causal window is one-sided, the op's."""
    if not is_causal and window >= 0 and two_sided:
        _refuse(f"{name}: {flag}=False with a sliding window", "a window on both sides of the query")
    if custom_mask is not None:
        if mask_indptr is None:
            raise ValueError(f"{name}: custom_mask needs mask_indptr (its [bs + 1] offsets per request)")
        mask = custom_mask if custom_mask.dtype == torch.bool else custom_mask.to(torch.bool)
        return {"custom_mask": mask.reshape(-1), "mask_indptr": mask_indptr[: bsz + 1]}
    return {} if is_causal else {"causal": False}


# -- vLLM ------------------------------------------------------------------------------------------
#: vLLM's ``KVQuantMode`` values this entry computes: NONE, FP8_PER_TENSOR
_KV_NONE, _KV_FP8_PER_TENSOR = 0, 1


def unified_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    cu_seqlens_q: Tensor,
    max_seqlen_q: int,
    seqused_k: Tensor,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_size: tuple[int, int] | list[int],
    block_table: Tensor,
    softcap: float,
    q_descale: Tensor | None,
    k_descale: Tensor | None,
    v_descale: Tensor | None,
    seq_threshold_3D: int | None = None,
    num_par_softmax_segments: int | None = None,
    softmax_segm_output: Tensor | None = None,
    softmax_segm_max: Tensor | None = None,
    softmax_segm_expsum: Tensor | None = None,
    alibi_slopes: Tensor | None = None,
    output_scale: Tensor | None = None,
    qq_bias: Tensor | None = None,
    sinks: Tensor | None = None,
    mm_prefix_range: Tensor | None = None,
    use_alibi_sqrt: bool = False,
    kv_quant_mode: Any = None,
    k_scale_cache: Tensor | None = None,
    v_scale_cache: Tensor | None = None,
) -> None:
    """vLLM's ``unified_attention`` (``vllm/v1/attention/ops/triton_unified_attention.py``): a
    mixed batch of prefills, chunked prefills and decodes over the flash-layout cache, as one
    ``attention.paged_prefill`` call (a decode is a sequence with one new token) into ``out``.

    ``q [T, Hq, D]`` holds sequence ``b``'s new tokens at rows ``cu_seqlens_q[b] :
    cu_seqlens_q[b + 1]``; ``seqused_k [B]`` are the total KV lengths; ``k`` / ``v`` ``[num_blocks,
    block_size, Hkv, D]`` with ``block_table [B, max_blocks]``: the op's own conventions, passed
    as they are. ``window_size = (left, right)``: ``left >= 0`` attends to the ``left`` positions
    before each query and itself (vLLM's ``SLIDING_WINDOW = 1 + left``), ``right`` is moot under
    the causal mask (vLLM's kernel ignores it too). fp8 caches (e4m3, or uint8 bytes read as e4m3)
    are dequantized per tensor by ``k_descale`` / ``v_descale``: their first element, as vLLM's
    kernel reads its ``[num_seqs, Hkv]`` flash-attention-shaped scales. ``max_seqlen_*`` and the
    3-D split workspaces (``seq_threshold_3D``, ``softmax_segm_*``) are launch hints: opmux's
    kernel picks its own tiles and writes no workspace. Query rows past ``cu_seqlens_q[-1]``
    (CUDA-graph padding) are left as they are, as vLLM leaves them.

    Refused (``NotImplementedError`` naming the argument): ``causal=False``, ``alibi_slopes`` /
    ``use_alibi_sqrt``, ``qq_bias``, ``output_scale`` (fp8 output), ``mm_prefix_range``, fp8
    queries / ``q_descale``, the per-token-head and sub-byte ``kv_quant_mode`` forms and their
    ``k_scale_cache`` / ``v_scale_cache``: the ops have no such term.
    """
    if not causal:
        _refuse("causal=False", "non-causal attention (vLLM's kernel asserts causal too)")
    for name, val in (
        ("alibi_slopes", alibi_slopes),
        ("qq_bias", qq_bias),
        ("output_scale", output_scale),
        ("mm_prefix_range", mm_prefix_range),
        ("k_scale_cache", k_scale_cache),
        ("v_scale_cache", v_scale_cache),
    ):
        if val is not None:
            _refuse(name, "given")
    if use_alibi_sqrt:
        _refuse("use_alibi_sqrt", "ALiBi")
    if q_descale is not None or _is_fp8(q):
        _refuse("q_descale / an fp8 query", f"query {q.dtype} (the ops take bf16 / fp16 / fp32 queries)")
    mode = None if kv_quant_mode is None else int(getattr(kv_quant_mode, "value", kv_quant_mode))
    if mode not in (None, _KV_NONE, _KV_FP8_PER_TENSOR):
        _refuse(f"kv_quant_mode={kv_quant_mode!r}", "only NONE and FP8_PER_TENSOR caches")
    if k.dtype == torch.uint8:  # vLLM's fp8 cache allocated as bytes
        k, v = k.view(torch.float8_e4m3fn), v.view(torch.float8_e4m3fn)
    fp8 = _is_fp8(k)
    if fp8 and mode == _KV_NONE:
        raise ValueError(
            f"kv_quant_mode=NONE with a {k.dtype} cache: vLLM reads such a cache unscaled; pass "
            "FP8_PER_TENSOR with k_descale / v_descale (opmux's fp8 caches are per-tensor scaled)"
        )
    if mode == _KV_FP8_PER_TENSOR and not fp8:
        raise ValueError(f"kv_quant_mode=FP8_PER_TENSOR needs an fp8 cache, not {k.dtype}")
    if not float(softmax_scale) > 0:
        raise ValueError(f"softmax_scale = {softmax_scale}: must be > 0")
    k_scale = v_scale = None
    if fp8:
        if k_descale is None or v_descale is None:
            raise ValueError("an fp8 cache needs k_descale and v_descale (per-tensor: K = fp8 * k_descale)")
        k_scale = _scale_tensor(k_descale, q.device, "k_descale")
        v_scale = _scale_tensor(v_descale, q.device, "v_descale")
    left = int(window_size[0]) if window_size is not None else -1
    num_seqs = seqused_k.shape[0]
    cu = _i32(cu_seqlens_q[: num_seqs + 1])
    if cu.is_cpu:  # free on the CPU: the op's rows are exactly the batch's tokens
        rows = int(cu[-1]) if cu.numel() else 0
        q, out = q[:rows], out[:rows]
    _attention().paged_prefill(
        q,
        k,
        v,
        _i32(block_table[:num_seqs]),
        _i32(seqused_k),
        cu,
        scale=float(softmax_scale),
        softcap=float(softcap or 0.0),
        window_left=left if left >= 0 else -1,
        sinks=_sinks(sinks),
        k_scale=k_scale,
        v_scale=v_scale,
        out=out,
    )


def vllm_decode_attention_fwd(
    q: Tensor,
    k_buffer: Tensor,
    v_buffer: Tensor,
    o: Tensor,
    lse: Tensor,
    req_to_token: Tensor,
    b_seq_len: Tensor,
    attn_logits: Tensor,
    num_kv_splits: int,
    sm_scale: float,
    page_size: int = 1,
    logit_cap: float = 0.0,
    k_scale: Tensor | float | None = None,
    v_scale: Tensor | float | None = None,
) -> None:
    """vLLM's Triton decode (``vllm/v1/attention/ops/triton_decode_attention.py``, its Triton MLA
    backend's; ``opmux.compat.vllm.decode_attention_fwd``): ``attention.paged_decode`` into ``o``
    and ``lse [B, Hq]`` (natural log, written in ``lse``'s dtype). Page size 1: ``k_buffer`` /
    ``v_buffer [tokens, Hkv, D]`` with token ids ``req_to_token [B, >= seq_len]``; page size > 1:
    ``[pages, page_size, Hkv, D]`` with page ids ``req_to_token [B, pages(, 1)]``: the op's block
    table either way (no copy of the cache). The value head dim may be below the key's (MLA's 576 /
    512, ``v_buffer`` a view of ``k_buffer``). ``attn_logits`` / ``num_kv_splits`` are vLLM's split
    workspace and count: opmux picks its own split and writes no workspace. ``k_scale`` /
    ``v_scale`` scale an fp8 cache (e4m3, or uint8 bytes read as e4m3) only, as vLLM's kernel.
    A value head dim above the key's is the op's ValueError."""
    three = k_buffer.dim() == 3 and v_buffer.dim() == 3
    if three and page_size == 1:
        kc, vc = k_buffer.unsqueeze(1), v_buffer.unsqueeze(1)
    elif (
        three
        and page_size > 1
        and k_buffer.shape[0] % page_size == 0
        and v_buffer.shape[0] == k_buffer.shape[0]
    ):
        # pages of page_size consecutive token rows (splitting the first dim is always a view)
        kc = k_buffer.view(-1, page_size, *k_buffer.shape[1:])
        vc = v_buffer.view(-1, page_size, *v_buffer.shape[1:])
    elif k_buffer.dim() == 4 and v_buffer.dim() == 4 and k_buffer.shape[1] == page_size == v_buffer.shape[1]:
        kc, vc = k_buffer, v_buffer
    else:
        raise ValueError(
            f"decode_attention_fwd: k_buffer {tuple(k_buffer.shape)} and v_buffer {tuple(v_buffer.shape)} with "
            f"page_size={page_size}; vLLM's layouts are [tokens, Hkv, D] (pages of page_size consecutive "
            "tokens) and [pages, page_size, Hkv, D]"
        )
    if kc.dtype == torch.uint8:  # vLLM's fp8 cache allocated as bytes
        kc, vc = kc.view(torch.float8_e4m3fn), vc.view(torch.float8_e4m3fn)
    scales: dict[str, Tensor] = {}
    if _is_fp8(kc):
        scales = {
            "k_scale": _scale_tensor(1.0 if k_scale is None else k_scale, q.device, "k_scale"),
            "v_scale": _scale_tensor(1.0 if v_scale is None else v_scale, q.device, "v_scale"),
        }
    bsz = q.shape[0]
    if req_to_token.shape[0] < bsz:
        raise ValueError(
            f"decode_attention_fwd: req_to_token has {req_to_token.shape[0]} rows for {bsz} queries (one row a request)"
        )
    table = _i32(req_to_token.reshape(req_to_token.shape[0], -1)[:bsz])  # rows past the batch: unread
    lse32 = _lse_f32(lse)
    _attention().paged_decode(
        q, kc, vc, table, _i32(b_seq_len), scale=float(sm_scale), softcap=float(logit_cap or 0.0), lse=lse32,
        out=o, **scales,
    )  # fmt: skip
    _lse_back(lse, lse32)


# -- vLLM's legacy-layout prefix prefill -----------------------------------------------------------
#: vLLM's ``kv_cache_dtype`` names of fp8 caches, with the dtype their bytes hold
_VLLM_FP8 = {"fp8": "float8_e4m3fn", "fp8_e4m3": "float8_e4m3fn", "fp8_e5m2": "float8_e5m2"}


def _legacy_rows(
    cache: Tensor, blocks: Tensor, offsets: Tensor, kv_cache_dtype: str, name: str, keys: bool
) -> Tensor:
    """Rows of vLLM's legacy paged caches as ``[N, Hkv, D]``: the key cache (``keys``) ``[num_blocks,
    Hkv, D / x, block_size, x]`` or the value cache ``[num_blocks, Hkv, D, block_size]``, at (block,
    offset) pairs; fp8 bytes (a uint8 cache) read as the dtype ``kv_cache_dtype`` names."""
    if kv_cache_dtype in _VLLM_FP8:
        cache = cache.view(getattr(torch, _VLLM_FP8[kv_cache_dtype])) if cache.dtype == torch.uint8 else cache
    elif kv_cache_dtype != "auto" and not kv_cache_dtype.startswith(("float", "bfloat", "half")):
        raise ValueError(
            f"{name}: kv_cache_dtype={kv_cache_dtype!r}; valid: 'auto', a float dtype's name, "
            f"{', '.join(map(repr, _VLLM_FP8))}"
        )
    if keys:  # [nb, H, D/x, bs, x] -> [N, H, D/x, x]
        rows = cache[blocks, :, :, offsets, :]
        return rows.reshape(rows.shape[0], rows.shape[1], -1)
    return cache[blocks, :, :, offsets]  # [nb, H, D, bs] -> [N, H, D]


def _legacy_layout(k_cache: Tensor, v_cache: Tensor, name: str, names: tuple[str, str]) -> None:
    """The legacy caches' ranks and their one block size and block count (ValueError naming the
    caller's argument, ``names``, and the layout vLLM allocates otherwise), before any row is read."""
    if k_cache.dim() != 5:
        raise ValueError(
            f"{name}: {names[0]} has shape {tuple(k_cache.shape)}; vLLM's paged key layout is [num_blocks, Hkv, "
            "D / x, block_size, x]"
        )
    if v_cache.dim() != 4 or v_cache.shape[3] != k_cache.shape[3] or v_cache.shape[0] != k_cache.shape[0]:
        raise ValueError(
            f"{name}: {names[1]} has shape {tuple(v_cache.shape)}; vLLM's paged value layout is [num_blocks, "
            f"Hkv, D, block_size] with the key cache's {k_cache.shape[0]} blocks of {k_cache.shape[3]} tokens"
        )


def vllm_context_attention_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    kv_cache_dtype: str,
    k_cache: Tensor,
    v_cache: Tensor,
    b_loc: Tensor,
    b_start_loc: Tensor,
    b_seq_len: Tensor,
    max_seq_len: int,
    max_input_len: int,
    k_scale: Tensor | float = 1.0,
    v_scale: Tensor | float = 1.0,
    alibi_slopes: Tensor | None = None,
    sliding_window: int | None = None,
    sm_scale: float | None = None,
    skip_decode: bool = False,
    fp8_out_scale: Tensor | None = None,
    sinks: Tensor | None = None,
    is_block_table_ptr: bool = False,
    causal: bool = True,
) -> None:
    """vLLM's prefix prefill ``context_attention_fwd`` (``vllm/v1/attention/ops/prefix_prefill.py``;
    ``opmux.compat.vllm.context_attention_fwd``): request ``b``'s new
    tokens ``q / k / v [b_start_loc[b] : b_start_loc[b + 1]]`` attend to its cached context (the
    first ``b_seq_len[b] - query_len`` positions, through the block table ``b_loc`` in vLLM's
    legacy paged layout: keys ``[num_blocks, Hkv, D / x, block_size, x]``, values ``[num_blocks,
    Hkv, D, block_size]``) and causally to each other: ``attention.paged_prefill`` into ``o``.

    The op's cache is built for the call, as SGLang's extend entry builds it: the context rows
    gathered from the legacy caches (fp8 bytes read as e4m3 or e5m2 by ``kv_cache_dtype``; fp8
    rows times ``k_scale`` / ``v_scale``, into the query's dtype), ``max_context`` rows a request (one device
    read of the longest context; under CUDA-graph capture the table's capacity), then the new
    tokens' ``k`` / ``v``; page size 1. That copies the batch's context K / V (what the kernel
    reads anyway). ``sliding_window > 0``: the ``sliding_window`` positions up to the query's own
    (the op's ``window_left = sliding_window - 1``); ``sm_scale`` None: ``1 / sqrt(D)``; ``sinks
    [Hq]`` the op's. ``skip_decode``: rows of one-token requests (and rows past the last request)
    are left as they are. ``causal=False``: every key of the request (the op's ``causal=False``;
    vLLM's window stays one-sided there, as the op's). ``max_seq_len`` / ``max_input_len`` bound
    the launch (``max_input_len``: the table's new-token columns).

    Refused (``NotImplementedError``): ``alibi_slopes``, ``fp8_out_scale``, ``is_block_table_ptr``
    (a table of block addresses), ``k`` / ``v`` None (cross-attention).
    """
    _prefix_prefill(
        "context_attention_fwd", q, k, v, o, kv_cache_dtype, k_cache, v_cache, b_loc, b_start_loc, b_seq_len,
        max_input_len, k_scale, v_scale, alibi_slopes, sliding_window, sm_scale, skip_decode, fp8_out_scale, sinks,
        is_block_table_ptr, causal, ("k_cache", "v_cache"),
    )  # fmt: skip


def chunked_prefill_paged_decode(
    query: Tensor,
    key: Tensor,
    value: Tensor,
    output: Tensor,
    kv_cache_dtype: str,
    key_cache: Tensor,
    value_cache: Tensor,
    block_table: Tensor,
    query_start_loc: Tensor,
    seq_lens: Tensor,
    max_seq_len: int,
    max_query_len: int,
    k_scale: Tensor | float = 1.0,
    v_scale: Tensor | float = 1.0,
    alibi_slopes: Tensor | None = None,
    sliding_window: int | None = None,
    sm_scale: float | None = None,
    output_scale: Tensor | None = None,
    sinks: Tensor | None = None,
    is_block_table_ptr: bool = False,
    causal: bool = True,
) -> None:
    """vLLM's ``chunked_prefill_paged_decode`` (``vllm/v1/attention/ops/``): a mixed batch over the
    legacy paged caches, prefills through the prefix prefill and one-token requests through a
    paged decode. Here one :func:`vllm_context_attention_fwd` computes both: a decode is a request of
    one new token, its key and value taken from ``key`` / ``value`` (vLLM's decode half reads the
    token from the cache it was written to: the same values, but for an fp8 cache the quantized
    ones, so there the two differ by that token's rounding). Refused as there, and
    ``output_scale`` (fp8 output)."""
    _prefix_prefill(
        "chunked_prefill_paged_decode", query, key, value, output, kv_cache_dtype, key_cache, value_cache,
        block_table, query_start_loc, seq_lens, max_query_len, k_scale, v_scale, alibi_slopes, sliding_window,
        sm_scale, False, output_scale, sinks, is_block_table_ptr, causal, ("key_cache", "value_cache"),
    )  # fmt: skip


def _prefix_prefill(
    name: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    kv_cache_dtype: str,
    k_cache: Tensor,
    v_cache: Tensor,
    b_loc: Tensor,
    b_start_loc: Tensor,
    b_seq_len: Tensor,
    max_input_len: int,
    k_scale: Tensor | float,
    v_scale: Tensor | float,
    alibi_slopes: Tensor | None,
    sliding_window: int | None,
    sm_scale: float | None,
    skip_decode: bool,
    out_scale: Tensor | None,
    sinks: Tensor | None,
    is_block_table_ptr: bool,
    causal: bool,
    cache_names: tuple[str, str],
) -> None:
    """:func:`vllm_context_attention_fwd` / :func:`chunked_prefill_paged_decode` on one code path
    (``cache_names``: the caller's names of its two cache arguments, for the layout's errors)."""
    if alibi_slopes is not None:
        _refuse(f"{name}: alibi_slopes", "ALiBi position biases")
    if out_scale is not None:
        _refuse(f"{name}: an fp8 output scale", "fp8 outputs")
    if is_block_table_ptr:
        _refuse(f"{name}: is_block_table_ptr=True", "block tables of addresses (the ops take block ids)")
    if k is None or v is None:
        _refuse(f"{name}: key / value None", "cross-attention over the cache alone")
    _legacy_layout(k_cache, v_cache, name, cache_names)
    dtype, dev = q.dtype, q.device
    bsz = b_seq_len.shape[0]
    block = v_cache.shape[-1]
    starts = b_start_loc[: bsz + 1].long()
    if q.is_cpu and bsz:  # free on the CPU: the op's rows are the batch's tokens (CUDA: padding rows
        q, o = q[: int(starts[-1])], o[: int(starts[-1])]  # past them are clamped away and kept)
    rows = q.shape[0]
    q_lens = starts[1:] - starts[:-1]
    ctx = (b_seq_len.long() - q_lens).clamp_(min=0)
    width = _width(ctx, b_loc.shape[1] * block)  # the longest context (rows per request below)
    j = torch.arange(width, device=dev)
    pos = j[None, :].expand(bsz, width)
    blocks = b_loc.long().gather(1, (pos // block).clamp_(max=max(0, b_loc.shape[1] - 1)))
    blocks = blocks.clamp_(0, max(0, k_cache.shape[0] - 1)).reshape(-1)
    offsets = (pos % block).reshape(-1)
    k_rows = _legacy_rows(k_cache, blocks, offsets, kv_cache_dtype, name, True)
    v_rows = _legacy_rows(v_cache, blocks, offsets, kv_cache_dtype, name, False)
    fp8 = _is_fp8(k_rows)  # vLLM scales fp8 loads only (by the loaded dtype, whatever the name)
    keys = _dequant(k_rows, k_scale if fp8 else 1.0, dtype)
    values = _dequant(v_rows, v_scale if fp8 else 1.0, dtype)
    for what, cached, new in (("key", keys, k), ("value", values, v)):
        if cached.shape[1:] != new.shape[1:]:
            raise ValueError(
                f"{name}: the {what} cache's rows are [Hkv, D] = {list(cached.shape[1:])} but the new tokens' "
                f"{what} rows are {list(new.shape[1:])}"
            )
    keys, values = torch.cat([keys, k.to(dtype)]), torch.cat([values, v.to(dtype)])
    cols = torch.arange(width + max(1, int(max_input_len)), device=dev)[None, :]
    c = ctx[:, None]
    table = torch.where(
        cols < c,
        torch.arange(bsz, device=dev)[:, None] * width + cols,
        bsz * width + starts[:-1, None] + cols - c,
    ).clamp_(0, max(0, keys.shape[0] - 1))
    window = int(sliding_window) - 1 if sliding_window is not None and sliding_window > 0 else -1
    mask = _engine_mask(name, None, None, causal, window, bsz, two_sided=False, flag="causal")
    target = torch.empty_like(o) if skip_decode else o
    _attention().paged_prefill(
        q,
        keys.unsqueeze(1),
        values.unsqueeze(1),
        table.to(torch.int32),
        _i32(b_seq_len),
        _i32(starts),
        scale=float(sm_scale or 0.0),
        window_left=window,
        sinks=_sinks(sinks),
        out=target,
        **mask,
    )
    if skip_decode:  # rows of one-token requests, and rows past the last request, keep what o held
        row = torch.arange(rows, device=dev)
        row_seq = torch.searchsorted(starts[1:].contiguous(), row, right=True)
        keep = (q_lens == 1)[row_seq.clamp_(max=max(0, bsz - 1))] | (row >= starts[-1])
        o.copy_(torch.where(keep[:, None, None], o, target))


# -- SGLang ----------------------------------------------------------------------------------------
def _sgl_common(name: str, xai_temperature_len: int) -> None:
    """The refusal SGLang's Triton attention entry points share. Their value head dim may be below
    the query's (MLA's 576 / 512): both ops take it, and refuse a value head dim above the key's."""
    if xai_temperature_len is not None and xai_temperature_len > 0:
        _refuse(
            f"{name}: xai_temperature_len={xai_temperature_len}",
            "Grok's position-dependent logit temperature",
        )


def decode_attention_fwd(
    q: Tensor,
    k_buffer: Tensor,
    v_buffer: Tensor,
    o: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    attn_logits: Tensor,
    attn_lse: Tensor,
    num_kv_splits: Tensor,
    max_kv_splits: int,
    sm_scale: float,
    k_scale: float | Tensor = 1.0,
    v_scale: float | Tensor = 1.0,
    logit_cap: float = 0.0,
    sinks: Tensor | None = None,
    xai_temperature_len: int = -1,
) -> None:
    """SGLang's ``decode_attention_fwd`` (``triton_ops/decode_attention.py``): one query token per
    request over the token pools ``k_buffer`` / ``v_buffer [num_tokens, Hkv, D]``, request ``b``'s
    tokens at ``kv_indices[kv_indptr[b] : kv_indptr[b + 1]]``: ``attention.paged_decode`` with the
    pools as a page-size-1 cache and that CSR form as its block table (gathered on the device), into
    ``o``. MLA (absorbed, DeepSeek / Kimi): ``k_buffer [num_tokens, 1, 576]``, ``v_buffer`` its
    first 512 dims (``k_buffer[..., :512]``, a view: the kernel reads each row once) and ``o``
    ``[B, Hq, 512]``, as SGLang's MLA backend passes them: the op's value head dim ``Dv <= D``.

    SGLang scales the logits by ``sm_scale * k_scale`` and the output by ``v_scale``: with an fp8
    pool these are the op's per-tensor ``k_scale`` / ``v_scale`` (``K = fp8 * k_scale``); with any
    other pool ``k_scale`` is folded into the scale and ``o`` is multiplied by ``v_scale`` after
    the op when it is not 1 (one more rounding in ``o``'s dtype). ``logit_cap`` is the op's
    softcap, ``sinks [Hq]`` its sinks. ``attn_logits`` / ``attn_lse`` / ``num_kv_splits`` /
    ``max_kv_splits`` are SGLang's split-KV workspace and plan: opmux's kernel plans its own
    splits and does not write them (nothing reads them after the call). The table's width is the
    longest request, read once from the device; while a CUDA graph is captured (SGLang captures
    decode) nothing is read and the width is ``kv_indices.numel()``, a static bound (the table
    costs ``B * kv_indices.numel()`` int32 in the graph's pool).

    Refused (``NotImplementedError``): ``xai_temperature_len > 0``. A value head dim above the
    query's is the op's ValueError.
    """
    _sgl_common("decode_attention_fwd", xai_temperature_len)
    bsz = q.shape[0]
    indptr = kv_indptr[: bsz + 1]
    lens = _i32(indptr[1:] - indptr[:-1])
    table = _csr_table(indptr, kv_indices, _width(lens, kv_indices.numel()))
    fp8 = _is_fp8(k_buffer)
    scale = float(sm_scale or 0.0) or q.shape[-1] ** -0.5
    ks = vs = None
    post = None
    if fp8:
        ks = _scale_tensor(k_scale, q.device, "k_scale")
        vs = _scale_tensor(v_scale, q.device, "v_scale")
    else:
        if isinstance(k_scale, torch.Tensor) or isinstance(v_scale, torch.Tensor):
            raise TypeError(
                "decode_attention_fwd: k_scale / v_scale as tensors apply to an fp8 pool; for a "
                f"{k_buffer.dtype} pool pass numbers (SGLang's layer.k_scale_float)"
            )
        scale *= float(k_scale)
        post = None if float(v_scale) == 1.0 else float(v_scale)
    _attention().paged_decode(
        q,
        k_buffer.unsqueeze(1),
        v_buffer.unsqueeze(1),
        table,
        lens,
        scale=scale,
        softcap=float(logit_cap or 0.0),
        sinks=_sinks(sinks),
        k_scale=ks,
        v_scale=vs,
        out=o,
    )
    if post is not None:
        o.mul_(post)


def decode_attention_fwd_normal(
    q: Tensor,
    k_buffer: Tensor,
    v_buffer: Tensor,
    o: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    attn_logits: Tensor,
    attn_lse: Tensor,
    num_kv_splits: Tensor,
    max_kv_splits: int,
    sm_scale_withk: float,
    v_scale: float | Tensor = 1.0,
    logit_cap: float = 0.0,
    sinks: Tensor | None = None,
    xai_temperature_len: int = -1,
) -> None:
    """SGLang's MHA / grouped decode halves (``sm_scale_withk`` = ``sm_scale * k_scale``):
    ``decode_attention_fwd`` with ``k_scale`` 1. opmux has one kernel for MHA and GQA."""
    decode_attention_fwd(
        q,
        k_buffer,
        v_buffer,
        o,
        kv_indptr,
        kv_indices,
        attn_logits,
        attn_lse,
        num_kv_splits,
        max_kv_splits,
        sm_scale_withk,
        1.0,
        v_scale,
        logit_cap,
        sinks,
        xai_temperature_len,
    )


decode_attention_fwd_grouped = decode_attention_fwd_normal


def _gather_rows(pool: Tensor, idx: Tensor) -> Tensor:
    """``pool[idx]`` (fp8 pools gathered as bytes: no fp8 index kernel on every device)."""
    if pool.element_size() == 1 and pool.is_floating_point():
        return pool.view(torch.uint8)[idx].view(pool.dtype)
    return pool[idx]


def _dequant(rows: Tensor, scale: float | Tensor, dtype: Any) -> Tensor:
    """The prefix rows in the query's dtype, times SGLang's per-tensor scale when it is not 1."""
    if isinstance(scale, torch.Tensor):
        return (rows.float() * scale.reshape(-1)[:1].float()).to(dtype)
    if float(scale) != 1.0:
        return (rows.float() * float(scale)).to(dtype)
    return rows if rows.dtype == dtype else rows.to(dtype)


def extend_attention_fwd(
    q_extend: Tensor,
    k_extend: Tensor,
    v_extend: Tensor,
    o_extend: Tensor,
    k_buffer: Tensor,
    v_buffer: Tensor,
    qo_indptr: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    custom_mask: Tensor | None,
    is_causal: bool,
    mask_indptr: Tensor | None,
    max_len_extend: int,
    k_scale: float | Tensor = 1.0,
    v_scale: float | Tensor = 1.0,
    sm_scale: float | None = None,
    logit_cap: float = 0.0,
    skip_prefix_custom_mask: bool = True,
    sliding_window_size: int = -1,
    sinks: Tensor | None = None,
    window_kv_offsets: Tensor | None = None,
    xai_temperature_len: int = -1,
    lse_extend: Tensor | None = None,
    skip_prefix: bool = False,
    skip_extend: bool = False,
    page_size: int = 1,
    score_mod: Any = None,
    aux_tensors: Any = None,
    extend_seq_lens_cpu: Any = None,
    identity_kv_indices: bool = False,
) -> None:
    """SGLang's ``extend_attention_fwd`` (``triton_ops/extend_attention.py``): request ``b``'s new
    tokens ``q_extend / k_extend / v_extend [qo_indptr[b] : qo_indptr[b + 1]]`` attend causally to
    its cached prefix (pool rows ``kv_indices[kv_indptr[b] : kv_indptr[b + 1]]``) and to each other:
    ``attention.paged_prefill`` into ``o_extend``.

    SGLang hands the new tokens' K / V apart from the pool (their pool slots are not among the
    arguments), so the op's cache is built for the call: the prefix rows gathered through
    ``kv_indices`` (dequantized by ``k_scale`` / ``v_scale`` into the query's dtype, as SGLang
    scales the prefix part only) followed by ``k_extend`` / ``v_extend``, page size 1, with a block
    table per request (prefix rows, then its new rows), all on the device. That costs a copy of the
    batch's prefix K / V (what the kernel reads anyway) and one read of the longest request's length
    (SGLang does not capture extend in CUDA graphs; while a graph is captured the width is the
    static bound ``kv_indices.numel() + max_len_extend`` instead). ``sliding_window_size > 0``:
    query ``i`` sees positions ``>= prefix + i - sliding_window_size`` (the op's ``window_left``);
    ``logit_cap`` is its softcap, ``sinks [Hq]`` its sinks, ``sm_scale`` None or 0: ``1/sqrt(D)``.
    ``custom_mask`` / ``mask_indptr`` (speculative decoding's tree masks, each request's
    ``[extend_len, prefix + extend_len]`` bools row-major) are the op's custom mask, replacing the
    causal rule; ``skip_prefix_custom_mask`` (SGLang's default True) is the op's
    ``mask_prefix=False``: the prefix is seen whatever the mask holds there. ``is_causal=False``:
    every key of the request (``_engine_mask``). With a mask and ``is_causal=True`` SGLang's kernel
    also stops at the end of each 128-query block's causal range, which a tree mask (ancestors
    only) never passes; opmux follows the mask alone. ``window_kv_offsets`` (SWA pools' mask
    offsets, read by SGLang together with a mask and a window) is refused. MLA (SGLang's
    Triton MLA backend, absorbed: ``q_extend`` / ``k_extend`` / ``k_buffer`` of head dim 576,
    ``v_extend`` / ``v_buffer`` 512 and ``o_extend [T, Hq, 512]``): the op's value head dim
    ``Dv <= D``; the values gathered apart from the keys.

    SGLang's later keywords: ``lse_extend [T, Hq]`` the op's lse (natural log, the sink included,
    written in its dtype); ``page_size`` with paged pools ``[pages, page_size, H, D]`` (the
    locations are tokens: the pools read as token rows); ``extend_seq_lens_cpu`` and
    ``identity_kv_indices`` are launch hints.

    Refused (``NotImplementedError``): ``window_kv_offsets`` with a mask and a window,
    ``is_causal=False`` with a window (SGLang's is two-sided), ``xai_temperature_len > 0``,
    ``score_mod`` / ``aux_tensors``, ``skip_prefix`` / ``skip_extend``. A value head dim above the
    query's is the op's ValueError.
    """
    _sgl_common("extend_attention_fwd", xai_temperature_len)
    window = int(sliding_window_size) if sliding_window_size is not None and sliding_window_size > 0 else -1
    if window_kv_offsets is not None and custom_mask is not None and window >= 0:
        _refuse(
            "extend_attention_fwd: window_kv_offsets",
            "sliding-window pools' custom-mask offsets (mask rows longer than the request)",
        )
    if score_mod is not None or aux_tensors is not None:
        _refuse("extend_attention_fwd: score_mod / aux_tensors", "a custom term on the logits")
    if skip_prefix or skip_extend:
        _refuse(
            "extend_attention_fwd: skip_prefix / skip_extend", "one stage alone (DCP's partial attention)"
        )
    k_buffer, v_buffer = (
        _token_rows(k_buffer, page_size, "k_buffer"),
        _token_rows(v_buffer, page_size, "v_buffer"),
    )
    dtype, dev = q_extend.dtype, q_extend.device
    bsz = qo_indptr.shape[0] - 1
    kv_indptr = kv_indptr[: bsz + 1]
    npre, rows = kv_indices.numel(), q_extend.shape[0]
    idx = kv_indices.long().clamp(0, max(0, k_buffer.shape[0] - 1))
    keys = torch.cat([_dequant(_gather_rows(k_buffer, idx), k_scale, dtype), k_extend.to(dtype)])
    values = torch.cat([_dequant(_gather_rows(v_buffer, idx), v_scale, dtype), v_extend.to(dtype)])
    pre = (kv_indptr[1:] - kv_indptr[:-1]).long()
    ext = (qo_indptr[1:] - qo_indptr[:-1]).long()
    lens = _i32(pre + ext)
    width = _width(lens, npre + int(max_len_extend))
    j = torch.arange(width, device=dev)[None, :]
    p = pre[:, None]
    table = torch.where(
        j < p, kv_indptr[:-1].long()[:, None] + j, npre + qo_indptr[:-1].long()[:, None] + j - p
    )
    table = table.clamp_(0, max(0, npre + rows - 1)).to(torch.int32)
    mask = _engine_mask("extend_attention_fwd", custom_mask, mask_indptr, is_causal, window, bsz)
    if custom_mask is not None:
        mask["mask_prefix"] = not skip_prefix_custom_mask
    lse32 = _lse_f32(lse_extend)
    _attention().paged_prefill(
        q_extend,
        keys.unsqueeze(1),
        values.unsqueeze(1),
        table,
        lens,
        _i32(qo_indptr),
        scale=float(sm_scale or 0.0),
        softcap=float(logit_cap or 0.0),
        window_left=window,
        sinks=_sinks(sinks),
        lse=lse32,
        out=o_extend,
        **mask,
    )
    _lse_back(lse_extend, lse32)


def _token_rows(buffer: Tensor, page_size: int, name: str) -> Tensor:
    """An SGLang pool as token rows ``[tokens, H, D]``: as it is, or a paged pool ``[pages,
    page_size, H, D]`` with its first two dims merged (a view; SGLang's locations are tokens)."""
    if buffer.dim() == 3:
        return buffer
    if (
        buffer.dim() == 4
        and buffer.shape[1] == page_size
        and buffer.stride(0) == page_size * buffer.stride(1)
    ):
        return buffer.view(-1, *buffer.shape[2:])
    raise ValueError(
        f"extend_attention_fwd: {name} has shape {tuple(buffer.shape)} and strides {buffer.stride()} with "
        f"page_size={page_size}; SGLang's pools are [tokens, H, D] or [pages, page_size, H, D] with whole pages"
    )


def context_attention_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
    b_start_loc: Tensor,
    b_seq_len: Tensor,
    max_input_len: int,
    is_causal: bool = True,
    sm_scale: float | None = None,
) -> None:
    """SGLang's prefill without a cache (``triton_ops/prefill_attention.py``; its vision
    attention calls it with ``is_causal=False``): request ``b``'s rows
    ``b_start_loc[b] : b_start_loc[b] + b_seq_len[b]`` of ``q`` / ``k`` / ``v [T, H, D]`` attend to
    each other (causally, or all of them), into ``o``: ``attention.paged_prefill`` over ``k`` / ``v``
    as a page-size-1 cache, each request's block-table row its own rows (``max_input_len`` wide:
    no host read), the requests packed back to back as SGLang packs them (``b_start_loc`` the
    running sum of ``b_seq_len``: the query offsets are ``b_start_loc`` and its last end).
    ``is_causal=False`` is the op's ``causal=False``.
    ``sm_scale`` None or 0: ``1 / sqrt(D)``, as SGLang's."""
    bsz, rows = b_seq_len.shape[0], q.shape[0]
    lens = _i32(b_seq_len)
    starts = b_start_loc[:bsz].long()
    cu = torch.empty(bsz + 1, dtype=torch.int32, device=q.device)
    cu[:bsz] = starts
    if bsz:
        cu[bsz] = starts[-1] + b_seq_len[-1].long()
    else:
        cu.zero_()
    if cu.is_cpu and bsz:  # free on the CPU: the packing the offsets assume, and the batch's rows
        packed = torch.cat([starts.new_zeros(1), torch.cumsum(b_seq_len.long(), 0)[:-1]])
        if not torch.equal(starts, packed):
            raise ValueError(
                f"context_attention_fwd: b_start_loc = {starts.tolist()} but b_seq_len = {b_seq_len.tolist()}: "
                "the requests must be packed back to back (b_start_loc the running sum of b_seq_len)"
            )
        q, o = q[: int(cu[bsz])], o[: int(cu[bsz])]
    width = max(1, int(max_input_len))
    table = (starts[:, None] + torch.arange(width, device=q.device)[None, :]).clamp_(0, max(0, rows - 1))
    mask = _engine_mask("context_attention_fwd", None, None, is_causal, -1, bsz)
    _attention().paged_prefill(
        q,
        k.unsqueeze(1),
        v.unsqueeze(1),
        table.to(torch.int32),
        lens,
        cu,
        scale=float(sm_scale or 0.0),
        out=o,
        **mask,
    )


def build_unified_kv_indices(
    prefix_kv_indptr: Tensor,
    prefix_kv_indices: Tensor,
    extend_start_loc: Tensor,
    extend_seq_lens: Tensor,
    extend_kv_indices: Tensor,
    bs: int,
) -> tuple[Tensor, Tensor, Tensor]:
    """SGLang's ``build_unified_kv_indices`` (``triton_ops/extend_attention.py``): request ``b``'s
    pool rows as one list, its prefix rows (``prefix_kv_indices[prefix_kv_indptr[b] : ...]``) then
    its new tokens' (``extend_kv_indices[extend_start_loc[b] : + extend_seq_lens[b]]``). Returns
    ``(unified_kv_indptr int32 [bs + 1], unified_kv_indices [len(prefix) + len(extend)],
    prefix_lens [bs])``, built on the device with no host read (entries past
    ``unified_kv_indptr[bs]`` are 0)."""
    dev = prefix_kv_indptr.device
    prefix_lens = prefix_kv_indptr[1 : bs + 1] - prefix_kv_indptr[:bs]
    unified_lens = prefix_lens + extend_seq_lens[:bs]
    indptr = torch.zeros(bs + 1, dtype=torch.int32, device=dev)
    indptr[1:] = torch.cumsum(unified_lens, dim=0)
    total = prefix_kv_indices.numel() + extend_kv_indices.numel()
    dtype = prefix_kv_indices.dtype if prefix_kv_indices.numel() else extend_kv_indices.dtype
    out = torch.zeros(total, dtype=dtype, device=dev)
    if total == 0 or bs == 0:
        return indptr, out, prefix_lens
    t = torch.arange(total, device=dev)
    b = torch.searchsorted(indptr[1:].long(), t, right=True).clamp_(max=bs - 1)
    j = t - indptr[:-1].long()[b]
    pre = prefix_lens.long()[b]
    in_prefix = j < pre
    src_p = (prefix_kv_indptr[:bs].long()[b] + j).clamp_(0, max(0, prefix_kv_indices.numel() - 1))
    src_e = (extend_start_loc[:bs].long()[b] + j - pre).clamp_(0, max(0, extend_kv_indices.numel() - 1))
    p_vals = prefix_kv_indices[src_p].to(dtype) if prefix_kv_indices.numel() else out
    e_vals = extend_kv_indices[src_e].to(dtype) if extend_kv_indices.numel() else out
    vals = torch.where(in_prefix, p_vals, e_vals)
    return indptr, torch.where(t < indptr[bs].long(), vals, out), prefix_lens


def extend_attention_fwd_unified(
    q: Tensor,
    o: Tensor,
    k_buffer: Tensor,
    v_buffer: Tensor,
    qo_indptr: Tensor,
    kv_indptr: Tensor,
    kv_indices: Tensor,
    prefix_lens: Tensor,
    max_len_extend: int,
    custom_mask: Tensor | None = None,
    mask_indptr: Tensor | None = None,
    sm_scale: float | None = None,
    logit_cap: float = 0.0,
    is_causal: bool = True,
    sliding_window_size: int = -1,
    sinks: Tensor | None = None,
    window_start_pos: Tensor | None = None,
    xai_temperature_len: int = -1,
) -> None:
    """SGLang's one-stage ``extend_attention_fwd_unified`` (deterministic inference): request
    ``b``'s queries ``q[qo_indptr[b] : qo_indptr[b + 1]]`` are the last tokens of its sequence,
    whose pool rows (prefix, then the new tokens, already written) are
    ``kv_indices[kv_indptr[b] : kv_indptr[b + 1]]`` (``build_unified_kv_indices``):
    ``attention.paged_prefill`` into ``o`` over the pools as they are (page size 1, the rows as
    an int32 block table gathered on the device; no K / V copy). ``prefix_lens`` is implied by
    the lengths (sequence length minus query count) and not read. ``sliding_window_size > 0`` is
    the op's ``window_left``; ``logit_cap``, sinks and ``sm_scale`` as ``extend_attention_fwd``.
    MLA as ``extend_attention_fwd``; ``v_buffer = k_buffer[..., :512]`` (a view) stays one: the
    kernel then reads each pool row once.

    ``custom_mask`` / ``mask_indptr``: the op's custom mask over every key (prefix included, as
    SGLang's unified kernel reads it); ``is_causal=False``: every key (``_engine_mask``).

    Refused (``NotImplementedError``): ``window_start_pos`` (SWA pools' position offsets),
    ``is_causal=False`` with a window, ``xai_temperature_len > 0``.
    """
    _sgl_common("extend_attention_fwd_unified", xai_temperature_len)
    if window_start_pos is not None:
        _refuse("extend_attention_fwd_unified: window_start_pos", "sliding-window pools' position offsets")
    bsz = qo_indptr.shape[0] - 1
    kv_indptr = kv_indptr[: bsz + 1]
    lens = _i32(kv_indptr[1:] - kv_indptr[:-1])
    table = _csr_table(kv_indptr, kv_indices, _width(lens, kv_indices.numel()))
    window = int(sliding_window_size) if sliding_window_size is not None and sliding_window_size > 0 else -1
    mask = _engine_mask("extend_attention_fwd_unified", custom_mask, mask_indptr, is_causal, window, bsz)
    _attention().paged_prefill(
        q,
        k_buffer.unsqueeze(1),
        v_buffer.unsqueeze(1),
        table,
        lens,
        _i32(qo_indptr),
        scale=float(sm_scale or 0.0),
        softcap=float(logit_cap or 0.0),
        window_left=window,
        sinks=_sinks(sinks),
        out=o,
        **mask,
    )
