"""What the attention ops' GPU grids share (test_attention_decode_grid.py,
test_attention_prefill_grid.py): a paged batch whose caches sit between NaN guards, the guards'
own check, the backends to run and vLLM's tolerance."""

from __future__ import annotations

from typing import Any

import torch

from opmux.kernels import registry
from opmux.kernels.explain import op_instance

I32 = torch.int32
DT = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def paged_batch(
    lens: list[int],
    q_rows: int,
    hq: int,
    hkv: int,
    d: int,
    page: int,
    dtype: str,
    feats: dict[str, Any],
    seed: int,
    device: str,
) -> tuple[tuple[torch.Tensor, ...], dict[str, Any]]:
    """(query [q_rows, Hq, D], caches, block table, seq_lens) for sequences of ``lens`` tokens
    and the keyword arguments ``feats`` asks for (softcap, window_left, sinks, lse, fp8 scales;
    ``hnd``: the caches as HND views; ``dv``: a value head dim below D (MLA), the value cache its
    own tensor or, with ``v_view``, the key cache's first ``dv`` dims). The caches are views between two NaN blocks of their own
    dtype (a read outside them is a NaN in the output): converted whole, guards included, before
    the view is taken."""
    g = torch.Generator(device=device).manual_seed(seed)
    dt = DT[dtype]
    ks, vs = torch.tensor([0.02], device=device), torch.tensor([0.015], device=device)
    bsz = len(lens)
    width = max(1, max(-(-n // page) for n in lens))
    nb = bsz * width + 3

    def cache(scale: torch.Tensor, dim: int) -> torch.Tensor:
        shape = (nb + 2, hkv, page, dim) if feats.get("hnd") else (nb + 2, page, hkv, dim)
        c = torch.randn(shape, device=device, generator=g)
        c[0] = c[-1] = float("nan")
        c = (c / scale).to(torch.float8_e4m3fn) if feats.get("fp8") else c.to(dt)
        c = c[1:-1]
        return c.transpose(1, 2) if feats.get("hnd") else c

    kc = cache(ks, d)
    dv = feats.get("dv", d)  # MLA: the value head dim below the key's
    # the latent cache passed twice (V its first dv dims), or a value cache of its own
    vc = kc[..., :dv] if feats.get("v_view") else cache(vs, dv)
    table = torch.randperm(nb, device=device, generator=g)[: bsz * width].reshape(bsz, width).to(I32)
    query = torch.randn(q_rows, hq, d, device=device, generator=g).to(dt)
    kw: dict[str, Any] = {k: feats[k] for k in ("softcap", "window_left") if k in feats}
    if feats.get("sinks"):
        kw["sinks"] = torch.randn(hq, device=device, generator=g) * 2
    if feats.get("lse"):
        kw["lse"] = torch.empty(q_rows, hq, device=device)
    if feats.get("fp8"):
        kw |= {"k_scale": ks, "v_scale": vs}
    return (query, kc, vc, table, torch.tensor(lens, dtype=I32, device=device)), kw


def assert_nan_guarded(caches: tuple[torch.Tensor, ...], what: str) -> None:
    """The grid's out-of-bounds detector holds: the block just before and just after each cache
    view is NaN in the cache's own dtype (a conversion after the view was taken would copy the
    view alone and drop the guards)."""
    for c in caches:
        for off in (-c.stride(0), c.shape[0] * c.stride(0)):
            guard = torch.as_strided(c, c.shape[1:], c.stride()[1:], c.storage_offset() + off)
            assert bool(guard.float().isnan().all()), f"{c.dtype} {what}: no NaN guard at {off}"


def backends(op: str) -> list[str]:
    """``default`` (the dispatch) and every backend of ``op`` that runs on CUDA."""
    return ["default", *[b.name for b in registry.get(op).backends if "cuda" in b.requires.devices]]


def fn(op: str, backend: str) -> Any:
    """The op's dispatch (``default``) or one backend of it."""
    instance = op_instance(op)
    return instance if backend == "default" else instance.impl(backend)


def check(got: torch.Tensor, want: torch.Tensor, fp8: bool, what: str) -> None:
    """vLLM's tolerance: atol 1.5e-2 / rtol 1e-2, fp8 caches 0.15."""
    tol = (0.15, 0.15) if fp8 else (1.5e-2, 1e-2)
    torch.testing.assert_close(
        got.float(), want.float(), atol=tol[0], rtol=tol[1], msg=lambda m: f"{what}: {m}"
    )
