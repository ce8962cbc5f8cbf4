"""benchmarks/bench_chain.py on the CPU: ``--device cpu --dry-run`` builds every chain (opmux with
PDL on and off, opmux with the fused activation + quantization op, the bf16 torch chain; peers skipped) on tiny shapes, runs each once and checks it
against the float32 reference; ``--render`` turns its json into the markdown table."""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
# T = 2 and 5: the wiring, on shapes where every opmux op takes the q/k views of one qkv buffer
TOKENS = "2,5"


@pytest.fixture
def bench_chain(monkeypatch: pytest.MonkeyPatch) -> Iterator[ModuleType]:
    monkeypatch.setenv("OPMUX_JIT", "0")  # the torch/triton backends: no C++ compiler in a unit test
    monkeypatch.setenv("OPMUX_FALLBACK", "silent")  # no AOT library in the tree: expected fallbacks
    monkeypatch.syspath_prepend(str(BENCH))
    from opmux.kernels import _dispatch_state

    _dispatch_state._stale()
    for name in ("bench_chain", "bench_gpu", "bench_cases"):
        sys.modules.pop(name, None)
    yield importlib.import_module("bench_chain")
    for name in ("bench_chain", "bench_gpu", "bench_cases", "render_bench"):
        sys.modules.pop(name, None)


def _has_pdl(mod: ModuleType) -> bool:
    for _, public in mod.OPMUX_OPS.values():
        m, attr = public.split(":")
        if "enable_pdl" not in inspect.signature(getattr(importlib.import_module(m), attr)).parameters:
            return False
    return True


def _statuses(result: dict[str, Any]) -> dict[tuple[str, int, str], dict[str, Any]]:
    return {
        (lrec["layer"], c["T"], name): r
        for lrec in result["layers"]
        for c in lrec["cases"]
        for name, r in c["impls"].items()
    }


def test_dry_run(bench_chain: ModuleType, tmp_path: Path) -> None:
    rc = bench_chain.main(["--device", "cpu", "--dry-run", "--tokens", TOKENS, "--out", str(tmp_path)])
    result = json.loads((tmp_path / "bench_chain.json").read_text())
    st = _statuses(result)
    assert {lrec["layer"] for lrec in result["layers"]} == {"llama3-8b", "qwen3-moe", "decode-mlp"}
    # T x (opmux PDL, no PDL, fused, FlashInfer, Liger, torch) per layer; decode-mlp has no fused chain
    assert len(st) == 2 * (6 + 6 + 5)
    mlp = next(lrec for lrec in result["layers"] if lrec["layer"] == "decode-mlp")
    assert mlp["steps"] == ["add_norm1", "silu_and_mul", "add_norm2"]
    check = mlp["cases"][0]["impls"]["opmux (PDL)"].get("check", "")
    assert "silu" in check and "add_norm2.res" in check and "quant" not in check and " q " not in check
    for (layer, T, name), r in st.items():
        if name in ("FlashInfer", "Liger"):
            assert r["status"] == "unavailable" and "dry-run" in r["why"]
        elif name == "torch eager":
            assert r["status"] == "ok", (layer, T, r)
        elif _has_pdl(bench_chain):
            assert r["status"] == "ok", (layer, T, name, r)
        else:  # the keyword is missing: a clear failure, never a silent run without it
            assert r["status"] == "failed" and "enable_pdl" in r["error"], r
    assert rc == (0 if _has_pdl(bench_chain) else bench_chain.PDL_EXIT)
    md = (tmp_path / "bench_chain.md").read_text()
    assert "## qwen3-moe" in md and "torch.compile piece" in md and "Dry run" in md


def test_opmux_chains_match_reference(
    bench_chain: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The opmux chains' wiring, whether or not the ops have ``enable_pdl`` yet (dropped if not)."""
    real = bench_chain.opmux_api

    def api() -> dict[str, Callable[..., Any]]:
        if _has_pdl(bench_chain):
            return real()  # type: ignore[no-any-return]
        out = {}
        for step, (_, public) in bench_chain.OPMUX_OPS.items():
            m, attr = public.split(":")
            fn = getattr(importlib.import_module(m), attr)

            def call(*a: Any, _fn: Any = fn, enable_pdl: bool | None = None, **kw: Any) -> Any:
                return _fn(*a, **kw)

            out[step] = call
        return out

    fused = bench_chain.FUSED_OP[1].split(":")
    assert hasattr(importlib.import_module(fused[0]), fused[1])  # this tree has the fused op

    monkeypatch.setattr(bench_chain, "opmux_api", api)
    argv = ["--device", "cpu", "--dry-run", "--tokens", TOKENS, "--impls", "opmux", "--out", str(tmp_path)]
    assert bench_chain.main(argv) == 0
    result = json.loads((tmp_path / "bench_chain.json").read_text())
    st = _statuses(result)
    assert len(st) == 2 * (3 + 3 + 2)  # decode-mlp: no fused chain
    for key, r in st.items():
        assert r["status"] == "ok", (key, r)
        assert r["rel_err"] < 1e-2, (key, r)
    qwen = next(lrec for lrec in result["layers"] if lrec["layer"] == "qwen3-moe")
    assert "align exact" in qwen["cases"][0]["impls"]["opmux (PDL)"]["check"]
    fused_check = qwen["cases"][0]["impls"]["opmux fused (PDL)"]["check"]
    assert "silu_quant.q" in fused_check and "quant.q" not in fused_check.replace("silu_quant.q", "")
    md = tmp_path / "h200_chain.md"
    assert bench_chain.main(["--render", str(tmp_path / "bench_chain.json"), "--md", str(md)]) == 0
    assert "| T | opmux (PDL) | opmux (no PDL) |" in md.read_text()


def test_static_align_matches_loop_reference(bench_chain: ModuleType) -> None:
    import torch

    g = torch.Generator().manual_seed(0)
    for T, k, E, block in ((1, 8, 128, 64), (7, 4, 16, 16), (33, 2, 5, 4)):
        ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)]).to(torch.int32)
        sorted_ids, expert_ids, post = bench_chain.t_align(ids, block, E)
        s_ref, e_ref, n_ref = bench_chain.align_reference(ids, block, E)
        n = int(post[0])
        assert n == n_ref
        assert torch.equal(sorted_ids[:n].long(), s_ref)
        assert torch.equal(expert_ids[: n // block].long(), e_ref)
        assert bool((sorted_ids[n:] == T * k).all()) and bool((expert_ids[n // block :] == -1).all())
        assert sorted_ids.numel() == T * k + E * (block - 1)


def test_checked_chains_timed_together(bench_chain: ModuleType, monkeypatch: pytest.MonkeyPatch) -> None:
    """A case's checked chains go to one ``time_impls`` call (their replays interleaved), and each
    op alone times its PDL on / off columns together; a chain that fails the check is not timed,
    and a column the timer could not time is recorded failed with its error."""
    calls: list[tuple[list[str], int]] = []

    def fake_time_impls(
        torch: Any, fns: dict[str, Any], sets: list[Any], R: int, replays: int
    ) -> dict[str, Any]:
        calls.append((list(fns), len(sets)))
        for fn in fns.values():  # each column runs on the case's sets, as a capture would
            for b in sets:
                fn(b)
        out: dict[str, Any] = {}
        for k, name in enumerate(fns):
            if name == "opmux (no PDL)" and len(calls) == 3:  # the second op's no-PDL column
                out[name] = {"error": "replays: stand-in fault"}
            else:
                out[name] = {
                    "us": 10.0 + k,
                    "us_min": 9.0,
                    "us_max": 12.0,
                    "method": "graph, interleaved",
                    "R": R,
                }
        return out

    monkeypatch.setattr(bench_chain.bg, "time_impls", fake_time_impls)
    real_check, seen = bench_chain.check, []

    def check(layer: Any, b: Any, st: Any, ref: Any) -> tuple[bool, float, str]:
        seen.append(1)
        if len(seen) == 4:  # the fourth chain (torch eager) fails its check: recorded, never timed
            return False, 1.0, "stand-in: wrong"
        return real_check(layer, b, st, ref)  # type: ignore[no-any-return]

    monkeypatch.setattr(bench_chain, "check", check)
    args = bench_chain.parse_args(["--device", "cpu", "--dry-run", "--tokens", "2"])
    layer = bench_chain.TINY["llama3-8b"]
    impls = [i for i in bench_chain.build_impls(layer, args) if not i.unavailable]
    assert [i.name for i in impls] == ["opmux (PDL)", "opmux (no PDL)", "opmux fused (PDL)", "torch eager"]
    args.dry_run = False  # time on the CPU through the stand-in timer
    consts = bench_chain.make_consts(layer, 0, "cpu")
    fib = bench_chain.bg.FlashInferBuild(None, None, 0.0)
    crec = bench_chain.run_case(layer, 2, impls, consts, args, 1 << 20, float("inf"), fib)
    chain_call = calls[0]
    # the checked chains in one call, in order
    assert chain_call[0] == ["opmux (PDL)", "opmux (no PDL)", "opmux fused (PDL)"]
    assert timed_status(crec, "torch eager") == ("wrong", False)
    timed = crec["impls"]
    assert timed["opmux (PDL)"]["status"] == "ok" and timed["opmux (PDL)"]["us"] == 10.0
    assert timed["opmux (PDL)"]["GBps"] > 0 and timed["opmux (PDL)"]["method"] == "graph, interleaved"
    assert timed["opmux (no PDL)"]["status"] == "ok" and timed["opmux (no PDL)"]["us"] == 11.0
    fused = timed["opmux fused (PDL)"]  # its GB/s from the bytes its own ops move (fewer)
    assert fused["us"] == 12.0 and fused["GBps"] < timed["opmux (PDL)"]["GBps"] * 10.0 / 12.0
    op_calls = calls[1:]
    assert len(op_calls) == len(layer.steps())
    assert all(names == ["opmux (PDL)", "opmux (no PDL)"] for names, _ in op_calls)
    assert set(crec["ops"]) == {"opmux (PDL)", "opmux (no PDL)"}
    assert all(r["status"] == "ok" for r in crec["ops"]["opmux (PDL)"].values())
    second = layer.steps()[1]
    no_pdl = crec["ops"]["opmux (no PDL)"]
    assert no_pdl[second]["status"] == "failed" and "stand-in fault" in no_pdl[second]["error"]
    assert all(r["status"] == "ok" for op, r in no_pdl.items() if op != second)
    assert "*" not in bench_chain.case_line(crec).split("|")[0]  # graph timing: no event mark


def timed_status(crec: dict[str, Any], name: str) -> tuple[str, bool]:
    r = crec["impls"][name]
    return r["status"], "us" in r
