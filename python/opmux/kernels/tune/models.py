"""Linear-layer GEMM shapes (N, K) of fp8 block-quantized models, for ``--models``.

A weight is [N, K] (out_features, in_features), as the op takes it. Each entry says how tensor
parallelism splits it: ``col`` (column-parallel: N / tp), ``row`` (row-parallel: K / tp) or
``rep`` (replicated). MoE expert weights are not here (a grouped GEMM, another op); shared
experts and dense MLP layers are.

Sources (each model's ``config.json`` on the Hugging Face Hub, and vLLM's layer code for which
projections are fused and how they are split):

- DeepSeek-V3 (deepseek-ai/DeepSeek-V3): hidden 7168, 128 heads, q_lora_rank 1536,
  kv_lora_rank 512, qk_nope_head_dim 128, qk_rope_head_dim 64, v_head_dim 128, intermediate
  18432 (first 3 dense layers), moe_intermediate 2048 with 1 shared expert. vLLM's MLA fuses
  q_a_proj and kv_a_proj_with_mqa (1536 + 512 + 64 = 2112 rows, replicated); the unfused
  kv_a_proj (576) is there for checkpoints without q_lora. vLLM's
  benchmarks/kernels/benchmark_w8a8_block_fp8.py lists the same shapes.
- Qwen3-235B-A22B (Qwen/Qwen3-235B-A22B-FP8): hidden 4096, 64 heads, 4 KV heads, head_dim 128,
  every layer MoE (no shared expert): only attention is a dense GEMM.
- Qwen3-32B (Qwen/Qwen3-32B-FP8): hidden 5120, 64 heads, 8 KV heads, head_dim 128, intermediate
  25600.
- Llama-3.1-70B (meta-llama/Llama-3.1-70B-Instruct): hidden 8192, 64 heads, 8 KV heads,
  head_dim 128, intermediate 28672.
- Llama-3.1-8B (meta-llama/Llama-3.1-8B-Instruct): hidden 4096, 32 heads, 8 KV heads, head_dim
  128, intermediate 14336.

qkv = (heads + 2 * kv_heads) * head_dim rows; gate_up = 2 * intermediate rows (merged).
"""

from __future__ import annotations

from typing import Literal

__all__ = ["MODELS", "MOE_MODELS", "MoeShape", "model_shapes", "moe_shapes"]

Split = Literal["col", "row", "rep"]

#: model -> [(layer, N, K, split)]
MODELS: dict[str, list[tuple[str, int, int, Split]]] = {
    "DeepSeek-V3": [
        ("fused_qkv_a_proj", 1536 + 512 + 64, 7168, "rep"),
        ("kv_a_proj_with_mqa", 512 + 64, 7168, "rep"),
        ("q_b_proj", 128 * (128 + 64), 1536, "col"),
        ("kv_b_proj", 128 * (128 + 128), 512, "col"),
        ("o_proj", 7168, 128 * 128, "row"),
        ("dense_gate_up_proj", 2 * 18432, 7168, "col"),
        ("dense_down_proj", 7168, 18432, "row"),
        ("shared_gate_up_proj", 2 * 2048, 7168, "col"),
        ("shared_down_proj", 7168, 2048, "row"),
    ],
    "Qwen3-235B-A22B": [
        ("qkv_proj", (64 + 2 * 4) * 128, 4096, "col"),
        ("o_proj", 4096, 64 * 128, "row"),
    ],
    "Qwen3-32B": [
        ("qkv_proj", (64 + 2 * 8) * 128, 5120, "col"),
        ("o_proj", 5120, 64 * 128, "row"),
        ("gate_up_proj", 2 * 25600, 5120, "col"),
        ("down_proj", 5120, 25600, "row"),
    ],
    "Llama-3.1-70B": [
        ("qkv_proj", (64 + 2 * 8) * 128, 8192, "col"),
        ("o_proj", 8192, 64 * 128, "row"),
        ("gate_up_proj", 2 * 28672, 8192, "col"),
        ("down_proj", 8192, 28672, "row"),
    ],
    "Llama-3.1-8B": [
        ("qkv_proj", (32 + 2 * 8) * 128, 4096, "col"),
        ("o_proj", 4096, 32 * 128, "row"),
        ("gate_up_proj", 2 * 14336, 4096, "col"),
        ("down_proj", 4096, 14336, "row"),
    ],
}


def model_shapes(name: str, *, tp: int = 1) -> list[tuple[int, int]]:
    """The distinct (N, K) of ``name``'s linear layers at tensor-parallel size ``tp``.

    >>> model_shapes("Llama-3.1-8B", tp=2)
    [(3072, 4096), (4096, 2048), (14336, 4096), (4096, 7168)]
    """
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; presets: {', '.join(MODELS)}")
    if tp < 1:
        raise ValueError(f"tp={tp}: expected a positive tensor-parallel size")
    shapes: list[tuple[int, int]] = []
    for layer, n, k, split in MODELS[name]:
        if split == "col":
            if n % tp:
                raise ValueError(f"{name} {layer}: N={n} does not split over tp={tp}")
            n //= tp
        elif split == "row":
            if k % tp:
                raise ValueError(f"{name} {layer}: K={k} does not split over tp={tp}")
            k //= tp
        if (n, k) not in shapes:
            shapes.append((n, k))
    return shapes


#: The MoE layers of ``moe.fused_experts``: model -> (E experts, N intermediate per expert,
#: K hidden, topk, weight form). Tensor parallelism splits N (vLLM's and SGLang's files name the
#: per-shard N). From each model's ``config.json``: Mixtral-8x7B (num_local_experts 8,
#: intermediate_size 14336, hidden 4096, 2 per token), Qwen3-30B-A3B (128 experts,
#: moe_intermediate_size 768, hidden 2048, 8 per token), Qwen3-235B-A22B (128, 1536, 4096, 8),
#: DeepSeek-V3 (n_routed_experts 256, moe_intermediate_size 2048, hidden 7168, 8 per token; its
#: checkpoint is fp8 with 128x128 block scales).
MOE_MODELS: dict[str, tuple[int, int, int, int, str]] = {
    "Mixtral-8x7B": (8, 14336, 4096, 2, "bf16"),
    "Qwen3-30B-A3B": (128, 768, 2048, 8, "bf16"),
    "Qwen3-235B-A22B": (128, 1536, 4096, 8, "bf16"),
    "DeepSeek-V3": (256, 2048, 7168, 8, "fp8"),
}
MoeShape = tuple[int, int, int, int, str]


def moe_shapes(name: str, *, tp: int = 1) -> MoeShape:
    """(E, N, K, topk, form) of ``name``'s experts at tensor-parallel size ``tp`` (N / tp).

    >>> moe_shapes("Mixtral-8x7B", tp=2)
    (8, 7168, 4096, 2, 'bf16')
    """
    if name not in MOE_MODELS:
        raise ValueError(f"unknown MoE model {name!r}; presets: {', '.join(MOE_MODELS)}")
    e, n, k, topk, form = MOE_MODELS[name]
    if tp < 1 or n % tp:
        raise ValueError(f"{name}: N={n} does not split over tp={tp}")
    return e, n // tp, k, topk, form
