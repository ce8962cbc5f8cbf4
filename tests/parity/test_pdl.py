"""Programmatic dependent launch is correct: a chain of dependent native CUDA ops gives the same
bytes with ``enable_pdl`` on, off and by default, eagerly and replayed from one CUDA graph
(where each launch may start before the previous one finishes and must wait for it in the
kernel). Every op reads what the one before it wrote, so a missing ``griddepcontrol.wait``
shows as a race. The chain covers every CUDA op group, the one op of several launches
(dynamic per-tensor quant: memset, amax kernel, scaling kernel) and, at T = 16384, the
prefill launch layouts (rmsnorm 4 vectors per thread, the fused add-rmsnorm loop, group quant a
row per block, exact GELU a block per row). On a device without sm_90 the flag is accepted and
changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from opmux.kernels import registry
from opmux.kernels.errors import BackendUnavailable, FallbackError
from opmux.kernels.ops import activation, kvcache, layernorm, moe, quantization, rope

H, D, E, BLOCK = 4096, 128, 64, 16

Chain = Callable[[dict[str, torch.Tensor]], list[torch.Tensor]]


def _chain(backend: str, pdl: bool | None) -> Chain:
    kw = {"backend": backend, "enable_pdl": pdl}

    def run(b: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        x, res = b["x"], b["res"]
        t = x.shape[0]
        layernorm.fused_add_rmsnorm(x, res, b["w"], 1e-6, **kw)  # x, res <- in place
        act = activation.silu_and_mul(x, **kw)  # [T, H/2], reads the normalized x
        gelu = activation.gelu_and_mul(x, **kw)
        q, s = quantization.per_token_group_quant_fp8(act, 128, **kw)
        tq, ts = quantization.per_tensor_quant_fp8(gelu, **kw)  # three launches
        h = layernorm.rmsnorm(act, b["w2"], 1e-6, **kw)
        qv = h[:, : H // 4].view(t, H // 4 // D, D)  # q and k heads of one buffer
        kv = h[:, H // 4 :].view(t, H // 4 // D, D)
        layernorm.qk_norm(qv, kv, b["wq"], b["wk"], 1e-6, **kw)
        rope.rotary_embedding(b["pos"], qv, kv, D, b["cache"], True, **kw)
        kvcache.reshape_and_cache(kv, qv, b["kc"], b["vc"], b["slots"], **kw)
        logits = h[:, :E].float()
        w, ids = moe.topk_softmax(logits, 8, True, **kw)
        sorted_ids, experts, post = moe.moe_align_block_size(ids, BLOCK, E, **kw)
        sw, sids = moe.topk_sigmoid(logits, 8, True, **kw)
        ones = torch.ones(ids.numel(), dtype=torch.int32, device=ids.device)
        counts = torch.zeros(E, dtype=torch.int32, device=ids.device).index_add_(
            0, ids.flatten().long(), ones
        )
        bsorted, bexperts, bpost = moe.batched_moe_align_block_size(counts, t, BLOCK, **kw)  # <= t per expert
        u8 = torch.uint8
        return [
            x,
            res,
            act,
            gelu,
            q.view(u8),
            s,
            tq.view(u8),
            ts,
            h,
            b["kc"],
            b["vc"],
            w,
            ids,
            sorted_ids,
            experts,
            post,
            sw,
            sids,
            bsorted,
            bexperts,
            bpost,
        ]

    return run


def _inputs(tokens: int, seed: int, dev: str = "cuda") -> dict[str, torch.Tensor]:
    g = torch.Generator(device=dev).manual_seed(seed)
    bf = torch.bfloat16
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
    freqs = torch.arange(4096, device=dev, dtype=torch.float32)[:, None] * inv[None, :]
    blocks = (tokens + BLOCK - 1) // BLOCK + 1
    heads = H // 4 // D
    return {
        "x": torch.randn(tokens, H, generator=g, device=dev).to(bf),
        "res": torch.randn(tokens, H, generator=g, device=dev).to(bf),
        "w": torch.rand(H, generator=g, device=dev).to(bf) + 0.5,
        "w2": torch.rand(H // 2, generator=g, device=dev).to(bf) + 0.5,
        "wq": torch.rand(D, generator=g, device=dev).to(bf) + 0.5,
        "wk": torch.rand(D, generator=g, device=dev).to(bf) + 0.5,
        "pos": torch.randint(0, 4096, (tokens,), generator=g, device=dev),
        "cache": torch.cat([freqs.cos(), freqs.sin()], dim=-1),
        "kc": torch.zeros(blocks, BLOCK, heads, D, device=dev, dtype=bf),
        "vc": torch.zeros(blocks, BLOCK, heads, D, device=dev, dtype=bf),
        "slots": torch.randperm(blocks * BLOCK, generator=g, device=dev)[:tokens],
    }


def _same(expected: list[torch.Tensor], got: list[torch.Tensor], what: str) -> None:
    for i, (e, o) in enumerate(zip(expected, got, strict=True)):
        same = torch.equal(e, o) or (
            e.is_floating_point()
            and torch.equal(e.isnan(), o.isnan())
            and torch.equal(e.nan_to_num(), o.nan_to_num())
        )
        assert same, f"{what}: output {i} differs from the eager chain without PDL"


@pytest.mark.parametrize("tokens", [512, 16384])
@pytest.mark.parametrize("backend", ["aot", "jit"])
def test_pdl_chain_eager_and_graph(device_type: str, backend: str, tokens: int) -> None:
    if device_type != "cuda":
        pytest.skip(f"PDL is a CUDA launch attribute; this target's device is {device_type}")
    if not any(b.name == backend for b in registry.get("layernorm.rmsnorm").backends):
        pytest.skip(f"no {backend} backend registered")
    try:
        expected = _chain(backend, False)(_inputs(tokens, 0))
    except (BackendUnavailable, FallbackError) as exc:  # e.g. a source tree: no AOT library
        pytest.skip(f"{backend} unavailable here: {str(exc).splitlines()[0]}")
    for pdl in (True, None):
        _same(expected, _chain(backend, pdl)(_inputs(tokens, 0)), f"eager, enable_pdl={pdl}")

    # one graph, replayed over fresh inputs copied into its static buffers
    static = _inputs(tokens, 0)
    chain = _chain(backend, True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain({k: v.clone() for k, v in static.items()})  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = chain(static)
    for seed in (1, 2):
        new = _inputs(tokens, seed)
        for k in static:
            static[k].copy_(new[k])
        graph.replay()
        torch.cuda.synchronize()
        ref = _chain(backend, False)({k: v.clone() for k, v in new.items()})
        _same(ref, outs, f"graph replay (seed {seed})")
