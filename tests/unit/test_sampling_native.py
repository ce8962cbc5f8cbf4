"""The sampling group's native units: the CPU unit's draws equal the Triton backend's (one Philox
stream), its selections hold on rows that defeat a naive quickselect, its native ABI refuses bad
arguments; the CUDA unit compiles for sm_90a and sm_80 (OPMUX_TEST_NVCC=1: nvcc, no GPU needed)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from opmux.kernels.ops import sampling as S


def test_cpu_unit_draws_equal_triton() -> None:
    """The same seed, offset and rows give the same ids on the native CPU and Triton backends."""
    probs = torch.softmax(torch.randn(200, 48, generator=torch.Generator().manual_seed(1)) * 2, -1)
    for kw in ({"top_k": 9, "top_p": 0.8}, {"top_k": 20, "top_p": 0.9, "filter_apply_order": "joint"}, {}):
        a = S.top_k_top_p_sampling_from_probs(probs, seed=2**62 + 5, offset=2**40 + 7, backend="jit", **kw)
        b = S.top_k_top_p_sampling_from_probs(probs, seed=2**62 + 5, offset=2**40 + 7, backend="triton", **kw)
        assert torch.equal(a, b), kw
    a = S.min_p_sampling_from_probs(probs, min_p=0.1, seed=-5, offset=3, backend="jit")
    assert torch.equal(a, S.min_p_sampling_from_probs(probs, min_p=0.1, seed=-5, offset=3, backend="triton"))


def _hard_rows(v: int) -> torch.Tensor:
    """Sorted, reversed, organ-pipe, few distinct values, many zeros: the pivot choices a
    quickselect can get wrong."""
    ramp = torch.arange(1, v + 1, dtype=torch.float64)
    organ = torch.minimum(ramp, ramp.flip(0))
    few = (torch.arange(v) % 3 + 1).double()
    zeros = torch.where(torch.arange(v) % 5 == 0, ramp, 0.0)
    rows = torch.stack([ramp, ramp.flip(0), organ, few, zeros])
    return (rows / rows.sum(1, keepdim=True)).float()


def test_cpu_unit_hard_rows_equal_the_reference() -> None:
    probs = _hard_rows(3001)
    for k in (1, 2, 1500, 3000):
        torch.testing.assert_close(
            S.top_k_renorm_probs(probs, top_k=k, backend="jit"),
            S.top_k_renorm_probs(probs, top_k=k, backend="torch"),
            atol=1e-6,
            rtol=1e-6,
        )
    for p in (0.01, 0.5, 0.99):
        got = S.top_p_renorm_probs(probs, top_p=p, backend="jit")
        want = S.top_p_renorm_probs(probs, top_p=p, backend="torch")
        assert torch.equal(got > 0, want > 0), p
        torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-5)
    keep = S.top_p_renorm_probs(probs, top_p=0.5, backend="torch") > 0
    ids = S.top_k_top_p_sampling_from_probs(probs, top_p=0.5, seed=1, backend="jit")
    assert keep.gather(1, ids.long()[:, None]).all()


def test_cpu_unit_refuses_bad_native_arguments() -> None:
    """Direct callers of the native ABI (no Python contract): shapes and dtypes that would read or
    write out of bounds raise ValueError."""
    from opmux.kernels import jit

    mod = jit.load_module("sampling_cpu")
    probs = torch.full((3, 8), 1 / 8)
    ids = torch.empty(3, dtype=torch.int32)
    none_i = torch.empty(0, dtype=torch.int32)
    none_f = torch.empty(0)
    none_l = torch.empty(0, dtype=torch.int64)
    with pytest.raises(ValueError, match="top_k_arr"):
        mod.top_k_renorm_probs_cpu(torch.empty_like(probs), probs, torch.ones(2, dtype=torch.int32), True, 0)
    with pytest.raises(ValueError, match="out"):
        mod.top_k_renorm_probs_cpu(torch.empty(3, 7), probs, none_i, False, 2)
    with pytest.raises(ValueError, match="out"):
        mod.greedy_cpu(torch.empty(2, dtype=torch.int32), probs)
    with pytest.raises(ValueError, match="seed_tensor"):
        mod.min_p_sampling_from_probs_cpu(ids, probs, none_f, False, 0.0, none_l, True, 0, none_l, False, 0)
    with pytest.raises(ValueError, match="filter_apply_order"):
        mod.top_k_top_p_sampling_from_probs_cpu(
            ids, probs, none_i, False, 0, none_f, False, 1.0, none_l, False, 0, none_l, False, 0, "sideways"
        )
    with pytest.raises(ValueError, match="float32"):
        mod.top_p_renorm_probs_cpu(probs.half(), probs.half(), none_f, False, 0.5)
    # in range: k past V is off (the contract refuses it before a kernel runs)
    out = torch.empty_like(probs)
    mod.top_k_renorm_probs_cpu(out, probs, torch.tensor([0, 8, 99], dtype=torch.int32), True, 0)
    assert torch.equal(out, probs)


def test_cuda_unit_compiles_for_sm90a_and_sm80(nvcc_unit: Callable[[str], Any]) -> None:
    mod = nvcc_unit("sampling_cuda")
    for name in ("top_k_renorm_probs", "top_p_renorm_probs", "top_k_mask_logits", "greedy"):
        assert mod[f"{name}_cuda"] is not None
    for name in ("top_k_top_p_sampling_from_probs", "min_p_sampling_from_probs"):
        assert mod[f"{name}_cuda"] is not None


@pytest.mark.parametrize("backend", ["torch", "jit", "triton"])
def test_signed_zeros_tie_at_the_threshold(backend: str) -> None:
    """-0.0 equals +0.0: a -0 logit tied with a +0 k-th value is kept (the definition's
    ``x >= t``), on every backend; the key-based kernels (Triton, CUDA) once ordered -0 below +0
    and masked it."""
    x = torch.tensor(
        [[1.0, 0.0, -0.0, -1.0, -2.0, 0.5, -3.0, -4.0], [-0.0, 2.0, 0.0, -1.0, 1.0, -5.0, 0.0, -0.0]]
    )
    want = S.top_k_mask_logits(x, top_k=3, backend="torch")
    assert torch.equal(torch.isinf(want), torch.isinf(x) | (x < 0))  # both zeros kept in both rows
    assert torch.equal(S.top_k_mask_logits(x, top_k=3, backend=backend), want)
    assert torch.equal(S.top_k_mask_logits(x.bfloat16(), top_k=3, backend=backend), want.bfloat16())


def test_an_all_zero_row_keeps_the_whole_row_on_every_backend() -> None:
    """No mass to reach p: the definition keeps the whole row (top-p renorm: 0 / 0, NaN); the
    Triton and CUDA kernels' boundary search used to keep nothing (zeros)."""
    probs = torch.zeros(3, 40)
    probs[1, 7] = 1.0
    probs[2] = torch.softmax(torch.arange(40.0), 0)
    want = S.top_p_renorm_probs(probs, top_p=0.5, backend="torch")
    assert bool(want[0].isnan().all())
    import numpy as np

    for backend in ("jit", "triton"):
        with np.errstate(invalid="ignore"):  # the interpreter's numpy 0 / 0 (the point of the row)
            got = S.top_p_renorm_probs(probs, top_p=0.5, backend=backend)
        torch.testing.assert_close(got, want, equal_nan=True, atol=1e-6, rtol=1e-6)
