"""Attention ops over opmux's paged KV cache, one declaration each (``ops/_decl.py``).

``paged_decode``: one query token per sequence against its paged KV cache (vLLM's
``paged_attention`` / FlashInfer's batch decode). ``query [B, Hq, D]`` (bf16, fp16, fp32; a unit
last stride, any other strides); ``key_cache`` / ``value_cache`` ``[num_blocks, page_size, Hkv, D]``
as ``kvcache.reshape_and_cache`` writes them: vLLM's flash layout (NHD), or HND given as its
permuted view (any non-negative strides, a dense head dim); ``Hq`` a multiple of ``Hkv`` (query
head ``h`` reads KV head ``h // (Hq / Hkv)``: GQA / MQA). The value cache's head dim ``Dv`` may be
below the key's ``D`` (absorbed MLA, DeepSeek-V2 / V3 / R1 and Kimi: one KV head of a 576-dim
latent cache, V its first 512 dims, passed as ``value_cache = key_cache[..., :512]``, a view of
the same memory, or as a tensor of its own): scores over ``D``, values and ``out [B, Hq, Dv]``
over ``Dv`` (``1 <= Dv <= D``). ``block_tables`` int32
``[B, max_blocks_per_seq]``: sequence ``b``'s position ``i`` is in block
``block_tables[b, i // page_size]`` at offset ``i % page_size``; ``seq_lens`` int32 ``[B]`` (0
allowed: the output is 0 and the lse -inf, or the sink).

Per sequence and query head: ``s_i = scale * q . k_i`` in float32 (``scale`` 0.0: ``1 / sqrt(D)``);
``softcap > 0``: ``s_i = softcap * tanh(s_i / softcap)`` (Gemma-2, Grok); ``window_left >= 0``: only
positions ``i >= seq_len - 1 - window_left`` are attended (vLLM's / FlashInfer's sliding window);
``sinks [Hq]`` (float32, gpt-oss): a logit per head added to the softmax denominator only
(``exp(sink - max)``, no value). ``out = sum_i softmax(s)_i v_i`` (float32, one cast to query's
dtype); ``lse [B, Hq]`` (float32, when given): the natural log of the softmax denominator, the sink
included. fp8 e4m3 caches take ``k_scale`` / ``v_scale`` (float32, one element each: ``K = fp8 *
k_scale``, kvcache's ``fp8(x / scale)`` entries read back).

Bad indices: for CPU tensors the values hook raises ValueError (naming the sequence, the entry and
the valid range) when a ``seq_len`` is outside ``[0, max_blocks_per_seq * page_size]`` or a block id
a sequence uses (the first ``cdiv(seq_len, page_size)`` entries of its row) is outside
``[0, num_blocks)``. On CUDA there is no host check (it would synchronise): the kernels clamp each
``seq_len`` to the table's capacity and treat a block id outside ``[0, num_blocks)`` as masked
(its tokens are skipped), so they never read out of bounds.

``paged_prefill``: prefill with a cached prefix (extend; vLLM's / FlashInfer's batch prefill with
a paged KV cache), plain causal prefill being the case of an empty prefix. A ragged batch:
``query [T, Hq, D]`` holds every sequence's new tokens, sequence ``b``'s rows
``cu_seqlens_q[b] : cu_seqlens_q[b + 1]`` (int32 ``[B + 1]``, from 0 to ``T``, non-decreasing);
``seq_lens`` int32 ``[B]`` are the total KV lengths (cached prefix + new tokens, so
``q_len <= seq_len``), every position, new tokens included, read from the cache through
``block_tables`` as for paged_decode (``kvcache.reshape_and_cache`` writes the new tokens first).
Query ``i`` of a sequence with ``q_len`` new tokens sees the positions ``<= seq_len - q_len + i``
(the causal mask aligned to the end of the KV); ``window_left``: only positions
``>= seq_len - q_len + i - window_left``. Cache forms, GQA / MQA, ``scale``, ``softcap``,
``sinks``, the fp8 scales and ``lse [T, Hq]`` are paged_decode's, and so is the value head dim:
``Dv <= D`` (MLA's 576-dim latent cache with ``value_cache = key_cache[..., :512]``, or a value
cache of its own, e.g. ``D = 192``, ``Dv = 128``), ``out [T, Hq, Dv]``. The values hook checks CPU
tensors (``cu_seqlens_q`` against query's rows, the lengths, the block ids); on CUDA the kernels
clamp the offsets to ``[0, T]`` and the lengths to the table's capacity and skip bad block ids.

A custom mask replaces the causal one (speculative decoding's tree verification: FlashInfer's
``custom_mask``, SGLang's ``custom_mask`` / ``mask_indptr``): ``custom_mask`` bool, flat, holds
each sequence's ``[q_len, seq_len]`` matrix row-major from offset ``mask_indptr[b]`` (int32 / int64
``[B + 1]``; ``mask_indptr[b + 1] - mask_indptr[b] = q_len * seq_len``), and query ``i`` of sequence
``b`` sees position ``j < seq_len`` iff ``custom_mask[mask_indptr[b] + i * seq_len + j]``, within
the window as above (it is still measured from ``seq_len - q_len + i``); ``mask_prefix=False``
(SGLang's ``skip_prefix_custom_mask``): every query sees the cached prefix's positions
``j < seq_len - q_len`` whatever its mask says there. A row the mask leaves empty gets 0 and an lse
of -inf (or the sink). The values hook checks the offsets of CPU tensors; on CUDA a mask entry
outside ``[0, len(custom_mask))`` reads as False (never out of bounds). ``causal=False`` (encoder
and vision attention, SGLang's ``is_causal=False``): every query sees all ``seq_len`` positions of
its sequence (within the window, still counted back from ``seq_len - q_len + i``); a custom mask
takes the place of either rule.

Other page-table forms convert to the block table without a copy of the cache: FlashInfer's /
SGLang's CSR form (``kv_indptr [B + 1]``, ``kv_indices``, ``kv_last_page_len [B]``) is
``block_tables[b, :kv_indptr[b + 1] - kv_indptr[b]] = kv_indices[kv_indptr[b] : kv_indptr[b + 1]]``
(rows padded to the widest) and ``seq_lens[b] = (kv_indptr[b + 1] - kv_indptr[b] - 1) * page_size
+ kv_last_page_len[b]``; SGLang's token-level ``req_to_token`` table is the page-size-1 case. Only
the block-table form is taken (as paged_decode).
"""

from __future__ import annotations

from ...spec import Requirement
from .._decl import declare
from . import (
    _decode,
    _prefill,
    paged_decode_cuda,
    paged_decode_flashinfer,
    paged_prefill_cudnn,
    paged_prefill_flashinfer,
)

paged_decode = declare(
    _decode.OP,
    "(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_tables, Tensor seq_lens, "
    "float scale=0.0, float softcap=0.0, int window_left=-1, Tensor? sinks=None, Tensor? k_scale=None, "
    "Tensor? v_scale=None, Tensor(a!)? lse=None, Tensor(a!)? out=None) -> Tensor",
    doc="query [B, Hq, D] against the paged KV cache [num_blocks, page_size, Hkv, D] (NHD or HND view; "
    "the value cache's head dim Dv <= D: MLA's 576 / 512) through block_tables [B, max_blocks] / "
    "seq_lens [B] -> [B, Hq, Dv] (+ lse [B, Hq]); GQA / MQA, softcap, sliding window, attention sinks, "
    "fp8 e4m3 caches with k_scale / v_scale",
    contract=_decode.PAGED_DECODE,
    values=_decode.values,
    reference=_decode.reference,
    torch=_decode.torch_decode,
    native=False,
    # split-KV decode in opmux's own CUDA unit (jit/csrc/attention_decode_cuda.cu, its own unit as
    # moe's cutlass backend); its predicate refuses what the unit does not instantiate
    vendor=(
        (
            paged_decode_cuda.BACKEND,
            paged_decode_cuda.paged_decode,
            Requirement(
                devices=("cuda",),
                sm_min=80,
                predicate="opmux.kernels.ops.attention.paged_decode_cuda:supports",
            ),
        ),
        # FlashInfer's batch decode where installed (a plan per batch, run per layer)
        (
            paged_decode_flashinfer.BACKEND,
            paged_decode_flashinfer.paged_decode,
            Requirement(
                devices=("cuda",),
                dtypes=("float16", "bfloat16"),
                sm_min=80,
                capabilities=("flashinfer",),
                predicate="opmux.kernels.ops.attention.paged_decode_flashinfer:supports",
            ),
        ),
    ),
    # Triton first; the native unit (or FlashInfer) first only where a select table says it was
    # measured faster (benchmarks/bench_attention_decode.py --select-out, in CUDA graphs; tuned.SCHEMAS)
    priority=(("cuda", ("triton", paged_decode_cuda.BACKEND, paged_decode_flashinfer.BACKEND, "torch")),),
    # attention over <= 100 tokens: one rounding of the output, p in the value dtype for the dot
    tolerances=(("float32", (1e-4, 1e-4)), ("float16", (2e-3, 2e-3)), ("bfloat16", (1.6e-2, 1.6e-2))),
)

paged_prefill = declare(
    _prefill.OP,
    "(Tensor query, Tensor key_cache, Tensor value_cache, Tensor block_tables, Tensor seq_lens, "
    "Tensor cu_seqlens_q, float scale=0.0, float softcap=0.0, int window_left=-1, Tensor? sinks=None, "
    "Tensor? k_scale=None, Tensor? v_scale=None, Tensor? custom_mask=None, Tensor? mask_indptr=None, "
    "bool mask_prefix=True, bool causal=True, Tensor(a!)? lse=None, Tensor(a!)? out=None) -> Tensor",
    doc="ragged query [T, Hq, D] (cu_seqlens_q [B + 1]) of new tokens attending causally over their "
    "sequences' paged KV cache [num_blocks, page_size, Hkv, D] (cached prefix + new tokens, NHD or HND "
    "view; the value cache's head dim Dv <= D: MLA's 576 / 512) through block_tables [B, max_blocks] / "
    "seq_lens [B] -> [T, Hq, Dv] (+ lse [T, Hq]); GQA / MQA, "
    "softcap, sliding window, attention sinks, fp8 e4m3 caches with k_scale / v_scale, a custom (tree) mask "
    "in place of the causal one (custom_mask / mask_indptr), or none (causal=False)",
    contract=_prefill.PAGED_PREFILL,
    values=_prefill.values,
    reference=_prefill.reference,
    torch=_prefill.torch_prefill,
    native=False,
    # FlashInfer's batch prefill where installed (a plan per batch, run per layer)
    vendor=(
        (
            paged_prefill_flashinfer.BACKEND,
            paged_prefill_flashinfer.paged_prefill,
            Requirement(
                devices=("cuda",),
                dtypes=("float16", "bfloat16"),
                sm_min=80,
                capabilities=("flashinfer",),
                predicate="opmux.kernels.ops.attention.paged_prefill_flashinfer:supports",
            ),
        ),
        # cuDNN's fused attention over the paged cache where its frontend is installed (a plan
        # per batch, a graph per shape class)
        (
            paged_prefill_cudnn.BACKEND,
            paged_prefill_cudnn.paged_prefill,
            Requirement(
                devices=("cuda",),
                dtypes=("float16", "bfloat16"),
                sm_min=80,
                capabilities=("cudnn",),
                predicate="opmux.kernels.ops.attention.paged_prefill_cudnn:supports",
            ),
        ),
    ),
    # Triton first; FlashInfer or cuDNN first only where a select table says it was measured
    # faster (benchmarks/bench_attention_prefill.py --select-out; tuned.SCHEMAS); both are refused
    # inside graph captures, where serving engines run their decode steps, anyway
    priority=(("cuda", ("triton", paged_prefill_flashinfer.BACKEND, paged_prefill_cudnn.BACKEND, "torch")),),
    # attention over <= a few hundred tokens: one rounding of the output, p in the value dtype
    tolerances=(("float32", (1e-4, 1e-4)), ("float16", (2e-3, 2e-3)), ("bfloat16", (1.6e-2, 1.6e-2))),
)
