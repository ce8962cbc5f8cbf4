"""The sampling ops' ``flashinfer`` backend: how the kernel arguments map onto FlashInfer's API (k = 0
as V, per-row tensors, the Philox seed / offset, the filter order), its refusals (no FlashInfer,
one whose samplers take no seed), and its place in the declarations. FlashInfer needs a GPU, so a
stand-in ``flashinfer.sampling`` (opmux's torch backend behind FlashInfer's signatures) records
the calls here; tests/unit/test_sampling_stats.py runs the real one statistically on a GPU."""

from __future__ import annotations

import sys
import types
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from opmux.kernels import facts, registry
from opmux.kernels.errors import BackendUnavailable
from opmux.kernels.ops import sampling as S
from opmux.kernels.ops.sampling import flashinfer_backend as fib

Calls = list[tuple[str, dict[str, Any]]]


def _arr(v: Any, name: str) -> dict[str, Any]:
    return {f"{name}_arr": v} if isinstance(v, torch.Tensor) else {name: v}


def _stand_in(calls: Calls, with_seed: bool = True) -> types.ModuleType:
    fs = types.ModuleType("flashinfer.sampling")

    def top_k_renorm_probs(probs: torch.Tensor, top_k: Any) -> torch.Tensor:
        calls.append(("top_k_renorm_probs", {"top_k": top_k}))
        return S.top_k_renorm_probs(probs, **_arr(top_k, "top_k"), backend="torch")

    def top_p_renorm_probs(probs: torch.Tensor, top_p: Any) -> torch.Tensor:
        calls.append(("top_p_renorm_probs", {"top_p": top_p}))
        return S.top_p_renorm_probs(probs, **_arr(top_p, "top_p"), backend="torch")

    def top_k_mask_logits(logits: torch.Tensor, top_k: Any) -> torch.Tensor:
        calls.append(("top_k_mask_logits", {"top_k": top_k}))
        return S.top_k_mask_logits(logits, **_arr(top_k, "top_k"), backend="torch")

    def top_k_top_p_sampling_from_probs(
        probs: torch.Tensor, top_k: Any, top_p: Any, indices: Any = None, filter_apply_order: str = "top_k_first",
        deterministic: bool = True, generator: Any = None, check_nan: bool = False, seed: Any = None,
        offset: Any = None,
    ) -> torch.Tensor:  # fmt: skip
        calls.append(("top_k_top_p", {"top_k": top_k, "top_p": top_p, "order": filter_apply_order,
                                      "deterministic": deterministic, "seed": seed, "offset": offset}))  # fmt: skip
        return torch.zeros(probs.shape[0], dtype=torch.int32) + 7

    def min_p_sampling_from_probs(
        probs: torch.Tensor, min_p: Any, indices: Any = None, deterministic: bool = True, generator: Any = None,
        check_nan: bool = False, seed: Any = None, offset: Any = None,
    ) -> torch.Tensor:  # fmt: skip
        calls.append(("min_p", {"min_p": min_p, "seed": seed, "offset": offset}))
        return torch.full((probs.shape[0],), 3, dtype=torch.int32)

    if not with_seed:

        def top_k_top_p_sampling_from_probs(  # an older FlashInfer: a Generator, no seed
            probs: torch.Tensor, top_k: Any, top_p: Any, generator: Any = None
        ) -> torch.Tensor:
            raise AssertionError("never called: refused")

    for fn in (top_k_renorm_probs, top_p_renorm_probs, top_k_mask_logits, top_k_top_p_sampling_from_probs,
               min_p_sampling_from_probs):  # fmt: skip
        setattr(fs, fn.__name__, fn)
    return fs


def _install(monkeypatch: pytest.MonkeyPatch, fs: types.ModuleType | None) -> None:
    pkg = types.ModuleType("flashinfer")
    pkg.__path__ = []  # type: ignore[attr-defined]
    pkg.sampling = fs  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "flashinfer", pkg if fs is not None else None)
    monkeypatch.setitem(sys.modules, "flashinfer.sampling", fs)
    fib._sampling.cache_clear()
    fib.refusal.cache_clear()


@pytest.fixture
def calls(monkeypatch: pytest.MonkeyPatch) -> Iterator[Calls]:
    recorded: Calls = []
    _install(monkeypatch, _stand_in(recorded))
    yield recorded
    fib._sampling.cache_clear()
    fib.refusal.cache_clear()


def _probs(b: int, v: int) -> torch.Tensor:
    return torch.softmax(torch.randn(b, v, generator=torch.Generator().manual_seed(b + v)) * 3, -1)


def test_k_zero_is_every_token_and_rows_map_through(calls: Calls) -> None:
    probs = _probs(3, 40)
    k = torch.tensor([0, 5, 40], dtype=torch.int32)
    out = torch.empty_like(probs)
    fib.top_k_renorm_probs(out, probs, k, True, 0)
    assert calls[-1][1]["top_k"].tolist() == [40, 5, 40]  # 0 (off) became V
    assert calls[-1][1]["top_k"].dtype == torch.int32 and k.tolist() == [0, 5, 40]  # a new tensor
    torch.testing.assert_close(out, S.top_k_renorm_probs(probs, top_k_arr=k, backend="torch"))
    fib.top_k_renorm_probs(out, probs, k.long(), True, 0)  # int64 rows: FlashInfer takes int32
    assert calls[-1][1]["top_k"].dtype == torch.int32 and calls[-1][1]["top_k"].tolist() == [40, 5, 40]
    fib.top_k_mask_logits(out, probs.log(), k, False, 0)
    assert calls[-1][1]["top_k"] == 40
    fib.top_p_renorm_probs(out, probs, torch.empty(0), False, 0.5)
    assert calls[-1][1]["top_p"] == 0.5
    torch.testing.assert_close(out, S.top_p_renorm_probs(probs, top_p=0.5, backend="torch"))


def test_draws_pass_the_seed_offset_and_order(calls: Calls) -> None:
    probs = _probs(4, 16)
    out = torch.empty(4, dtype=torch.int32)
    seed, offset = torch.tensor([11]), torch.tensor([2])
    none = torch.empty(0)
    fib.top_k_top_p_sampling_from_probs(
        out, probs, none, False, 3, none, False, 0.9, seed, True, 0, offset, True, 0, "joint"
    )
    got = calls[-1][1]
    assert got["seed"].shape == (1,) and int(got["seed"]) == 11 and int(got["offset"]) == 2
    assert got["deterministic"] is True
    assert (got["top_k"], got["top_p"], got["order"]) == (3, 0.9, "joint")
    assert out.tolist() == [7] * 4
    fib.min_p_sampling_from_probs(out, probs, none, False, 0.2, none, False, 5, none, False, 9)
    assert calls[-1][1] == {"min_p": 0.2, "seed": 5, "offset": 9}
    assert out.tolist() == [3] * 4
    before = len(calls)
    fib.min_p_sampling_from_probs(out[:0], probs[:0], none, False, 0.2, none, False, 5, none, False, 9)
    assert len(calls) == before  # no rows: no call


class _Compiled:
    """A stand-in of FlashInfer's compiled sampling module: each function records its arguments
    and writes its output tensor (the second argument) in place, as the real ones do."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple[Any, ...]]] = []

    def __getattr__(self, name: str) -> Any:
        def fn(*args: Any) -> None:
            self.calls.append((name, args))
            x, out = args[0], args[1]
            if name == "top_k_renorm_probs":
                k_arr, k = args[2], args[3]
                out.copy_(
                    S.top_k_renorm_probs(
                        x, **_arr(k_arr if k_arr is not None else k, "top_k"), backend="torch"
                    )
                )
            elif out.dtype == torch.int32:
                out.fill_(5)
            else:
                out.fill_(0.25)

        return fn


@pytest.fixture
def compiled(calls: Calls, monkeypatch: pytest.MonkeyPatch) -> _Compiled:
    mod = _Compiled()
    rows = types.SimpleNamespace(
        module=mod, row_states=lambda name, device: torch.zeros(4, dtype=torch.uint8)
    )
    monkeypatch.setattr(fib, "_raw", lambda: rows)
    return mod


def test_the_compiled_module_writes_out_in_place(calls: Calls, compiled: _Compiled) -> None:
    probs, none = _probs(3, 40), torch.empty(0)
    k = torch.tensor([0, 5, 40], dtype=torch.int32)
    out = torch.empty_like(probs)
    fib.top_k_renorm_probs(out, probs, k, True, 0)
    name, args = compiled.calls[-1]
    assert (
        name == "top_k_renorm_probs" and args[1] is out and args[2].tolist() == [40, 5, 40] and args[3] == 0
    )
    assert args[4] is False and args[5].dtype == torch.uint8
    torch.testing.assert_close(out, S.top_k_renorm_probs(probs, top_k_arr=k, backend="torch"))
    fib.top_p_renorm_probs(out, probs, none, False, 0.5)
    name, args = compiled.calls[-1]
    assert name == "top_p_renorm_probs" and args[1] is out and args[2:5] == (None, 0.5, False)
    assert args[5].numel() >= 3 * 384 and bool((out == 0.25).all())
    fib.top_k_mask_logits(out, probs.log(), none, False, 7)
    assert compiled.calls[-1][0] == "top_k_mask_logits" and compiled.calls[-1][1][2:4] == (None, 7)
    assert calls == []  # the public functions never ran: no copy
    ids, seed, offset = torch.empty(3, dtype=torch.int32), torch.tensor(11), torch.tensor([2])
    fib.top_k_top_p_sampling_from_probs(
        ids, probs, k, True, 0, none, False, 0.9, seed, True, 0, offset, True, 0, "joint"
    )
    name, args = compiled.calls[-1]
    assert name == "top_k_top_p_sampling_from_probs" and args[1] is ids and args[6:9] == (None, 0.9, True)
    assert args[9].shape == (1,) and int(args[9]) == 11 and args[11].shape == (1,) and ids.tolist() == [5] * 3
    fib.top_k_top_p_sampling_from_probs(
        ids, probs, none, False, 4, none, False, 0.9, none, False, 3, none, False, 8, "top_k_first"
    )
    (n1, a1), (n2, a2) = compiled.calls[-2:]  # the public composition: top-k renorm, then the top-p draw
    assert (n1, n2) == ("top_k_renorm_probs", "top_p_sampling_from_probs") and a2[0] is a1[1] and a2[1] is ids
    assert a1[2:4] == (None, 4) and a2[4:] == (None, 0.9, True, None, 3, None, 8)
    fib.min_p_sampling_from_probs(ids, probs, none, False, 0.2, none, False, 5, none, False, 9)
    assert compiled.calls[-1][0] == "min_p_sampling_from_probs" and compiled.calls[-1][1][4:] == (
        None,
        0.2,
        True,
        None,
        5,
        None,
        9,
    )
    assert calls == []


def test_strided_rows_and_outputs_and_the_radix_path(calls: Calls, compiled: _Compiled) -> None:
    wide, none = _probs(3, 80), torch.empty(0)
    out = torch.empty(3, 40)
    fib.top_k_renorm_probs(out, wide[:, :40], none, False, 4)  # strided rows: a dense copy, in place
    assert calls == [] and compiled.calls[-1][1][0].is_contiguous() and compiled.calls[-1][1][1] is out
    strided_out = torch.empty(3, 80)[:, :40]
    fib.top_k_renorm_probs(strided_out, wide[:, :40], none, False, 4)  # strided out: the public function
    assert calls[-1][0] == "top_k_renorm_probs" and len(compiled.calls) == 1
    want = S.top_k_renorm_probs(wide[:, :40].contiguous(), top_k=4, backend="torch")
    torch.testing.assert_close(strided_out, want)
    probs, ids = _probs(2, fib._FAST_MIN_V), torch.empty(2, dtype=torch.int32)
    fib.top_k_top_p_sampling_from_probs(
        ids, probs, none, False, 50, none, False, 0.9, none, False, 1, none, False, 0, "top_k_first"
    )
    assert calls[-1][0] == "top_k_top_p" and len(compiled.calls) == 1  # FlashInfer's own radix path decides


def test_seed_and_offset_take_flashinfers_one_form(calls: Calls) -> None:
    """FlashInfer takes both as ints or both as 1-d one-element tensors: a 0-d tensor, a longer one
    (its first element counts, as on the native unit) and a tensor beside an int are brought to it."""
    probs, out, none = _probs(2, 16), torch.empty(2, dtype=torch.int32), torch.empty(0)
    seed0d, offsets = torch.tensor(5), torch.tensor([3, 9, 9])
    fib.min_p_sampling_from_probs(out, probs, none, False, 0.1, seed0d, True, 0, none, False, 7)
    got = calls[-1][1]
    assert isinstance(got["seed"], torch.Tensor) and isinstance(got["offset"], torch.Tensor)
    assert got["seed"].shape == got["offset"].shape == (1,) and (int(got["seed"]), int(got["offset"])) == (
        5,
        7,
    )
    fib.min_p_sampling_from_probs(out, probs, none, False, 0.1, none, False, 4, offsets, True, 0)
    got = calls[-1][1]
    assert got["seed"].shape == (1,) and (int(got["seed"]), int(got["offset"])) == (4, 3)
    fib.min_p_sampling_from_probs(out, probs, none, False, 0.1, none, False, 4, none, False, 6)
    assert (calls[-1][1]["seed"], calls[-1][1]["offset"]) == (4, 6)  # ints stay ints


def test_an_output_over_its_own_rows_takes_the_public_function(calls: Calls, compiled: _Compiled) -> None:
    probs, none = _probs(3, 40), torch.empty(0)
    want = S.top_k_renorm_probs(probs, top_k=4, backend="torch")
    fib.top_k_renorm_probs(probs, probs, none, False, 4)  # in place: FlashInfer writes a new tensor
    assert compiled.calls == [] and calls[-1][0] == "top_k_renorm_probs"
    torch.testing.assert_close(probs, want)


def test_refusals_name_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    _install(monkeypatch, _stand_in([], with_seed=False))
    why = fib.refusal("top_k_top_p_sampling_from_probs")
    assert why is not None and "seed / offset" in why and "0.5 or later" in why
    assert fib.refusal("top_k_renorm_probs") is None  # the filters need no seed
    with pytest.raises(BackendUnavailable, match="seed / offset"):
        fib.top_k_top_p_sampling_from_probs(
            torch.empty(1, dtype=torch.int32), _probs(1, 8), torch.empty(0), False, 2, torch.empty(0), False,
            1.0, torch.empty(0), False, 0, torch.empty(0), False, 0, "top_k_first",
        )  # fmt: skip
    _install(monkeypatch, None)
    assert fib.refusal("min_p_sampling_from_probs") == "flashinfer.sampling cannot be imported"
    fib._sampling.cache_clear()
    fib.refusal.cache_clear()


def test_declared_first_on_cuda_and_never_for_greedy() -> None:
    for name in fib.FUNCTIONS:
        spec = registry.get(f"sampling.{name}")
        backend = spec.backend("flashinfer")
        assert backend.requires.capabilities == ("flashinfer",) and backend.requires.devices == ("cuda",)
        order = dict(spec.priority)["cuda"]
        assert order[0] == "flashinfer" and order[-1] == "torch", order  # measured fastest (op.py)
    assert "flashinfer" not in {b.name for b in registry.get("sampling.greedy").backends}


def test_the_capability_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda n, *a: None if n == "flashinfer" else real(n, *a))
    facts.reset()
    try:
        found = facts.detect_facts("cuda", "sm_90")
        assert "flashinfer" not in found.capabilities
        assert "pip install flashinfer-python" in found.missing["flashinfer"][1]
    finally:
        facts.reset()
