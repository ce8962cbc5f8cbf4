"""A toy decode loop written against sgl_kernel's and vLLM's kernel names, run by opmux.

The engine code below is what an engine writes; the only opmux-specific lines are the two
imports at the top (swap them back and the same loop runs on sgl_kernel / vLLM). Random
weights, one MoE-routed layer, a paged KV cache (vLLM's flash layout), fp8 activations.

    PYTHONPATH=python python examples/engine_dropin.py [--steps 4] [--device cpu]
"""

from __future__ import annotations

import argparse

import torch

import opmux.compat.sgl_kernel as sgl_kernel  # was: import sgl_kernel
from opmux.compat import vllm as ops  # was: from vllm import _custom_ops as ops

H, HEADS, D, INTER, EXPERTS, TOPK, BLOCK, VOCAB = 128, 4, 32, 256, 8, 2, 16, 101


class Layer:
    def __init__(self, g: torch.Generator, device: str) -> None:
        def w(*shape: int) -> torch.Tensor:
            return (torch.randn(*shape, generator=g) / shape[-1] ** 0.5).to(device)

        self.norm1, self.norm2 = torch.ones(H, device=device), torch.ones(H, device=device)
        self.qkv, self.o = w(3 * HEADS * D, H), w(H, HEADS * D)
        self.router = w(EXPERTS, H)
        self.up = [w(2 * INTER, H) for _ in range(EXPERTS)]
        self.down = [w(H, INTER) for _ in range(EXPERTS)]


def attention(q: torch.Tensor, kc: torch.Tensor, vc: torch.Tensor, n: int) -> torch.Tensor:
    """q [1, HEADS, D] against the first n cached tokens (one sequence, blocks in order)."""
    k = kc.reshape(-1, HEADS, D)[:n].transpose(0, 1)
    v = vc.reshape(-1, HEADS, D)[:n].transpose(0, 1)
    return torch.nn.functional.scaled_dot_product_attention(q.transpose(0, 1), k, v).transpose(0, 1)


def decode_step(x: torch.Tensor, residual: torch.Tensor | None, layer: Layer, state: dict) -> tuple:
    pos, kc, vc, cache = state["pos"], state["k_cache"], state["v_cache"], state["cos_sin"]
    if residual is None:
        residual, h = x, sgl_kernel.rmsnorm(x, layer.norm1)
    else:
        sgl_kernel.fused_add_rmsnorm(x, residual, layer.norm1)
        h = x
    q, k, v = (h @ layer.qkv.t()).split(HEADS * D, dim=-1)
    q, k = q.contiguous(), k.contiguous()
    positions = torch.tensor([pos], device=x.device)
    sgl_kernel.rotary_embedding(positions, q, k, D, cache, True)
    slot = torch.tensor([pos], device=x.device)
    one = torch.tensor(1.0, device=x.device)
    ops.reshape_and_cache_flash(k.view(1, HEADS, D), v.view(1, HEADS, D), kc, vc, slot, "auto", one, one)
    attn = attention(q.view(1, HEADS, D), kc, vc, pos + 1).reshape(1, HEADS * D)
    x = attn @ layer.o.t()
    sgl_kernel.fused_add_rmsnorm(x, residual, layer.norm2)
    # MoE: route, quantize activations (fp8, per token), run the chosen experts
    weights = torch.empty(1, TOPK, device=x.device)
    ids = torch.empty(1, TOPK, dtype=torch.int32, device=x.device)
    sgl_kernel.topk_softmax(weights, ids, x @ layer.router.t(), True)
    xq, scale = ops.scaled_fp8_quant(x, use_per_token_if_dynamic=True)
    xd = xq.float() * scale
    out = torch.zeros_like(x)
    for j in range(TOPK):
        e = int(ids[0, j])
        act = torch.empty(1, INTER, device=x.device)
        ops.silu_and_mul(act, xd @ layer.up[e].t())
        out += weights[0, j] * (act @ layer.down[e].t())
    return out, residual


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    g = torch.Generator().manual_seed(0)
    dev = args.device
    embed, head = torch.randn(VOCAB, H, generator=g).to(dev), torch.randn(VOCAB, H, generator=g).to(dev)
    layers = [Layer(g, dev) for _ in range(2)]
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    freqs = torch.outer(torch.arange(64).float(), inv)
    cache = torch.cat([freqs.cos(), freqs.sin()], -1).to(dev)
    blocks = (args.steps + BLOCK - 1) // BLOCK + 1
    states = [
        {
            "k_cache": torch.zeros(blocks, BLOCK, HEADS, D, device=dev),
            "v_cache": torch.zeros(blocks, BLOCK, HEADS, D, device=dev),
            "cos_sin": cache,
        }
        for _ in layers
    ]
    token, tokens = 1, []
    for pos in range(args.steps):
        x, residual = embed[token].view(1, H).clone(), None
        for layer, state in zip(layers, states, strict=True):
            state["pos"] = pos
            x, residual = decode_step(x, residual, layer, state)
        sgl_kernel.fused_add_rmsnorm(x, residual, torch.ones(H, device=dev))
        token = int((x @ head.t()).argmax())
        tokens.append(token)
    print("generated:", tokens)


if __name__ == "__main__":
    main()
