"""Programmatic dependent launch is correct: a chain of dependent native CUDA ops gives the same
bytes with ``enable_pdl`` on, off and by default, eagerly and replayed from one CUDA graph
(where each launch may start before the previous one finishes and must wait for it in the
kernel). Every op reads what the one before it wrote, so a missing ``griddepcontrol.wait``
shows as a race. On a device without sm_90 the flag is accepted and changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from opmux.kernels import registry
from opmux.kernels.errors import BackendUnavailable, FallbackError
from opmux.kernels.ops import activation, layernorm, quantization, rope

T, H, HEADS, D = 512, 4096, 32, 128


def _chain(backend: str, pdl: bool | None) -> Callable[[dict[str, torch.Tensor]], list[torch.Tensor]]:
    kw = {"backend": backend, "enable_pdl": pdl}

    def run(b: dict[str, torch.Tensor]) -> list[torch.Tensor]:
        x, res = b["x"], b["res"]
        layernorm.fused_add_rmsnorm(x, res, b["w"], 1e-6, **kw)  # x, res <- in place
        act = activation.silu_and_mul(x, **kw)  # [T, H/2], reads the normalized x
        q, s = quantization.per_token_group_quant_fp8(act, 128, **kw)
        h = layernorm.rmsnorm(act, b["w2"], 1e-6, **kw)
        qk = h.view(T, -1)[:, : 2 * (H // 2 // 2)]  # [T, 2 * 1024]: q and k halves
        qv, kv = qk[:, : H // 4], qk[:, H // 4 :]
        rope.rotary_embedding(b["pos"], qv, kv, D, b["cache"], True, **kw)  # in place
        return [x, res, act, q.view(torch.uint8), s, h]

    return run


def _inputs(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    dev, bf = "cuda", torch.bfloat16
    inv = 1.0 / (10000.0 ** (torch.arange(0, D, 2, device=dev, dtype=torch.float32) / D))
    freqs = torch.arange(4096, device=dev, dtype=torch.float32)[:, None] * inv[None, :]
    return {
        "x": torch.randn(T, H, generator=g, device=dev).to(bf),
        "res": torch.randn(T, H, generator=g, device=dev).to(bf),
        "w": torch.rand(H, generator=g, device=dev).to(bf) + 0.5,
        "w2": torch.rand(H // 2, generator=g, device=dev).to(bf) + 0.5,
        "pos": torch.randint(0, 4096, (T,), generator=g, device=dev),
        "cache": torch.cat([freqs.cos(), freqs.sin()], dim=-1),
    }


@pytest.mark.parametrize("backend", ["aot", "jit"])
def test_pdl_chain_eager_and_graph(device_type: str, backend: str) -> None:
    if device_type != "cuda":
        pytest.skip(f"PDL is a CUDA launch attribute; this target's device is {device_type}")
    if not any(b.name == backend for b in registry.get("layernorm.rmsnorm").backends):
        pytest.skip(f"no {backend} backend registered")
    try:
        expected = _chain(backend, False)(_inputs(0))
    except (BackendUnavailable, FallbackError) as exc:  # e.g. a source tree: no AOT library
        pytest.skip(f"{backend} unavailable here: {str(exc).splitlines()[0]}")
    for pdl in (True, None):
        got = _chain(backend, pdl)(_inputs(0))
        for e, o in zip(expected, got, strict=True):
            assert torch.equal(e, o), f"enable_pdl={pdl}: eager result differs from enable_pdl=False"

    # one graph, replayed over fresh inputs copied into its static buffers
    static = _inputs(0)
    chain = _chain(backend, True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        chain({k: v.clone() for k, v in static.items()})  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = chain(static)
    for seed in (1, 2, 3):
        new = _inputs(seed)
        for k in static:
            static[k].copy_(new[k])
        graph.replay()
        torch.cuda.synchronize()
        ref = _chain(backend, False)({k: v.clone() for k, v in new.items()})
        for e, o in zip(ref, outs, strict=True):
            assert torch.equal(e, o), f"graph replay (seed {seed}) differs from the eager chain without PDL"
