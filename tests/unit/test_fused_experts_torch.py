"""The torch backend of moe.fused_experts where it left the definition: a product rounded to fp16
before its routing weight (inf where the definition's weighted product fits), and ids the
expert_map does not cover, which on CUDA reach the backend unchecked (the CPU check is in the
op's values check): a negative id wrapped around the map, one past it indexed out of bounds."""

from __future__ import annotations

import torch

from opmux.kernels import ops
from opmux.kernels.ops.moe import _experts


def _overflowing(m: int = 2, k: int = 16, n: int = 16) -> dict[str, torch.Tensor]:
    """Each expert output ~75000 before its weight 0.5 (past fp16's 65504), ~37700 after."""
    w1 = torch.full((2, 2 * n, k), 0.25, dtype=torch.float16)  # gate = up = 4
    return {
        "hidden": torch.ones(m, k, dtype=torch.float16),
        "w1": w1,
        "w2": torch.full((2, k, n), 300.0, dtype=torch.float16),
        "topk_weights": torch.full((m, 1), 0.5),
        "topk_ids": torch.zeros(m, 1, dtype=torch.int32),
    }


def test_fp16_weighted_output_does_not_overflow_before_its_weight() -> None:
    p = _overflowing()
    ref = _experts.reference(**p)
    assert torch.isfinite(ref).all()
    got = ops.moe.fused_experts(**p, backend="torch")
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)


def test_fp16_weight_on_input_does_not_overflow_before_its_weight() -> None:
    p = _overflowing()
    p["w1"][:, :16] = 0.125  # gate 2, weighted 1
    p["w1"][:, 16:] = 4800.0  # up ~77000, weighted ~38400: silu(1) * 38400 fits fp16
    p["w2"] = torch.full_like(p["w2"], 1e-4)
    ref = _experts.reference(**p, apply_router_weight_on_input=True)
    assert torch.isfinite(ref).all()
    got = ops.moe.fused_experts(**p, apply_router_weight_on_input=True, backend="torch")
    torch.testing.assert_close(got, ref, atol=2e-2, rtol=2e-2)


def _mapped_problem() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return {
        "hidden": torch.randn(4, 16, generator=g).bfloat16(),
        "w1": (torch.randn(2, 32, 16, generator=g) / 4).bfloat16(),
        "w2": (torch.randn(2, 16, 16, generator=g) / 4).bfloat16(),
        "topk_weights": torch.ones(4, 1),
    }


def test_ids_the_map_does_not_cover_are_skipped_unchecked() -> None:
    """What a CUDA call gives the backend (no host check there): ids -1 and G are skipped, as the
    routing of the Triton backend skips them, never read through the map."""
    p = _mapped_problem()
    emap = torch.tensor([0, -1, 1], dtype=torch.int32)
    ids = torch.tensor([[0], [-1], [3], [2]], dtype=torch.int32)
    out = torch.full((4, 16), float("nan"), dtype=torch.bfloat16)
    empty = torch.empty(0)
    _experts.torch_experts(
        out, p["hidden"], p["w1"], p["w2"], p["topk_weights"], ids, empty, empty, emap, "silu", False, False
    )
    assert torch.equal(out[1:3], torch.zeros(2, 16, dtype=torch.bfloat16))
    good = ids[[0, 3]]
    ref = _experts.reference(
        p["hidden"][[0, 3]], p["w1"], p["w2"], p["topk_weights"][[0, 3]], good, expert_map=emap
    )
    torch.testing.assert_close(out[[0, 3]], ref, atol=2e-2, rtol=2e-2)
