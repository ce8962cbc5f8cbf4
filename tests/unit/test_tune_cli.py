"""The tuner end to end on the CPU (Triton interpreter, one tiny shape): tables written in
vLLM's format, the budget, resume, the model presets and the CLI both ways."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from opmux.kernels import _env, tuned
from opmux.kernels.tune import MODELS, candidates, interleaved, model_shapes, runner, tune
from opmux.kernels.tune.__main__ import main
from opmux.kernels.tune.interleaved import time_interleaved
from opmux.kernels.tune.runner import _label

OP = "gemm.w8a8_block_fp8_matmul"
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fresh() -> Iterator[None]:
    tuned.refresh()
    yield
    tuned.refresh()


def _table(out: Path) -> dict[int, dict[str, int]]:
    key = tuned.table_key(OP, "triton", "cpu", (200, 300))
    return {m: dict(c) for m, c in tuned.read_table(out / key.file_name(), key).items()}


def test_tune_writes_resumes_and_serves(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tune([(200, 300)], [1, 7], out=tmp_path, budget_s=60, device="cpu", max_configs=2)
    err = capsys.readouterr().err
    assert "NOT meaningful" in report.timing and "NOT meaningful" in err
    assert "[1/2] N=200 K=300 M=1 best" in err and "[2/2] N=200 K=300 M=7 best" in err
    table = _table(tmp_path)
    assert sorted(table) == [1, 7]
    assert all(e.tried == 2 and not e.skipped for e in report.entries)

    # resume: finished M entries are skipped, only the new one is timed, old ones kept
    again = tune([(200, 300)], [1, 7, 33], out=tmp_path, budget_s=60, device="cpu", max_configs=1)
    assert [(e.m, e.skipped) for e in again.entries] == [(1, True), (7, True), (33, False)]
    assert "[1/1] N=200 K=300 M=33" in capsys.readouterr().err
    assert {m: c for m, c in _table(tmp_path).items() if m != 33} == table

    # the launcher picks the tables up through OPMUX_TUNED_CONFIG_DIR
    with _env.scope(OPMUX_TUNED_CONFIG_DIR=str(tmp_path)):
        assert dict(tuned.lookup(OP, "triton", "cpu", (200, 300), 30)) == _table(tmp_path)[33]


def test_budget_spent_leaves_entries_for_the_next_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tune([(200, 300)], [1, 7], out=tmp_path, budget_s=1e-9, device="cpu")
    assert report.unfinished == [(200, 300, 1), (200, 300, 7)]
    assert "run again to continue" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


def test_candidates_start_with_the_default_and_are_valid() -> None:
    for m in (1, 64, 65, 4096):
        space = candidates(OP, "triton", m, (4096, 7168))
        assert space[0] == tuned.default_config(OP, "triton", m, (4096, 7168))
        assert len({json.dumps(c, sort_keys=True) for c in space}) == len(space)
        assert all(tuned.validate_entry(OP, "triton", c) == [] for c in space)
        assert any("SPLIT_K" in c for c in space) == (m < 4096)  # where a grid leaves SMs idle
        assert all(c["BLOCK_SIZE_M"] <= max(16, m) * 2 for c in space)


def test_split_k_wherever_tiles_leave_sms_idle() -> None:
    """Small N: split-K up to prefill M, the configs that fill the SMs 1-4 times first; a grid
    that fills the GPU on its own gets none."""
    space = candidates(OP, "triton", 512, (576, 7168), sms=132)
    assert any(c.get("SPLIT_K", 1) > 1 for c in space)
    programs = [
        -(-512 // c["BLOCK_SIZE_M"]) * -(-576 // c["BLOCK_SIZE_N"]) * c.get("SPLIT_K", 1) for c in space
    ]
    filled = [132 <= p <= 4 * 132 for p in programs[1:]]
    assert any(filled) and filled == sorted(filled, reverse=True)
    assert not any("SPLIT_K" in c for c in candidates(OP, "triton", 512, (24576, 7168), sms=132))


def test_retune_times_kept_entries_again_their_config_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # a kept entry that is not the default config (the default is timed first anyway)
    kept = candidates(OP, "triton", 7, (200, 300))[1]
    assert kept != candidates(OP, "triton", 7, (200, 300))[0]
    tuned.write_table(tmp_path / tuned.table_key(OP, "triton", "cpu", (200, 300)).file_name(), {7: kept})
    again = tune([(200, 300)], [7], out=tmp_path, budget_s=60, device="cpu", max_configs=2, retune=True)
    (entry,) = again.entries
    assert not entry.skipped and entry.tried == 2
    assert next(iter(entry.timings)) == _label(kept)  # the kept config was timed first
    assert (
        "--retune"
        in subprocess.run(
            [sys.executable, "-m", "opmux.kernels.tune", "--help"], capture_output=True, text=True, check=True
        ).stdout
    )


def test_model_presets() -> None:
    assert set(MODELS) == {"DeepSeek-V3", "Qwen3-235B-A22B", "Qwen3-32B", "Llama-3.1-70B", "Llama-3.1-8B"}
    ds = model_shapes("DeepSeek-V3")
    assert {(2112, 7168), (24576, 1536), (32768, 512), (7168, 16384), (36864, 7168), (7168, 18432)} <= set(ds)
    assert model_shapes("Llama-3.1-70B", tp=8) == [(1280, 8192), (8192, 1024), (7168, 8192), (8192, 3584)]
    assert model_shapes("Qwen3-235B-A22B") == [(9216, 4096), (4096, 8192)]
    with pytest.raises(ValueError, match=r"unknown model 'GPT-5'.*DeepSeek-V3"):
        model_shapes("GPT-5")
    with pytest.raises(ValueError, match="does not split over tp=3"):
        model_shapes("Llama-3.1-8B", tp=3)


def test_cli_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [OP, "--shapes", "200,300", "--m", "3", "--budget-s", "60", "--out", str(tmp_path)]
    assert main([*argv, "--device", "cpu", "--max-configs", "1", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["device_name"] == "cpu" and [e["m"] for e in report["entries"]] == [3]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([OP, "--budget-s", "5", "--out", "x"], "nothing to tune"),
        ([OP, "--models", "GPT-5", "--budget-s", "5", "--out", "x"], "unknown model"),
        ([OP, "--shapes", "1,2", "--budget-s", "0", "--out", "x"], "positive number of seconds"),
    ],
)
def test_cli_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 1
    assert message in capsys.readouterr().err


def test_cli_bad_shapes_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([OP, "--shapes", "1,2,3", "--budget-s", "5", "--out", "x"])
    assert info.value.code == 2 and "expected N,K" in capsys.readouterr().err


def test_cli_subprocess(tmp_path: Path) -> None:
    argv = [
        "--shapes",
        "200,300",
        "--m",
        "1",
        "--budget-s",
        "60",
        "--out",
        str(tmp_path),
        "--max-configs",
        "1",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "opmux.kernels.tune", OP, *argv, "--device", "cpu"],
        capture_output=True,
        text=True,
        env={**_env.child_environ(), "PYTHONPATH": str(ROOT / "python")},
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "1 entries tuned, 0 left" in done.stdout and "[1/1] N=200 K=300 M=1" in done.stderr


def test_select_times_each_backend_and_writes_size_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tune(
        [(200, 300), (130, 260)], [1, 5], out=tmp_path, budget_s=120, device="cpu", backend="select"
    )
    assert not report.unfinished
    for e in report.entries:
        assert e.config["backend"] in e.timings and len(e.timings) >= 2  # at least two backends raced
        # the pick is the fastest of the final round, which a race runs over every backend it timed
        assert set(e.final) == set(e.timings)
        assert e.final[e.config["backend"]] == min(e.final.values()) == e.us
    classes = tuned.table_key(OP, "select", "cpu", (tuned.ANY_SHAPE, tuned.ANY_SHAPE))
    table = tuned.read_table(tmp_path / classes.file_name(), classes)
    assert sorted(table) == [1, 5]
    assert "size classes by M over 4 entries" in capsys.readouterr().err
    with _env.scope(OPMUX_TUNED_CONFIG_DIR=str(tmp_path)):
        assert tuned.lookup(OP, "select", "cpu", (999, 999), 1) == table[1]  # any shape: the classes
    # a later race at other M adds its classes and keeps these (a prefill race keeps the decode sizes)
    tune([(200, 300)], [64], out=tmp_path, budget_s=120, device="cpu", backend="select")
    merged = tuned.read_table(tmp_path / classes.file_name(), classes)
    assert sorted(merged) == [1, 5, 64] and merged[1] == table[1] and merged[5] == table[5]
    # an unusable file is replaced by this run's classes, with a line saying so, not a failed run
    (tmp_path / classes.file_name()).write_text("{}")
    tune([(200, 300)], [32], out=tmp_path, budget_s=120, device="cpu", backend="select")
    assert sorted(tuned.read_table(tmp_path / classes.file_name(), classes)) == [32]
    assert "rewritten with this run's M only" in capsys.readouterr().err


def test_select_races_every_backend_however_short_the_budget(tmp_path: Path) -> None:
    """A race of some backends names no fastest: each entry times them all (the budget is
    checked between entries)."""
    full = tune([(200, 300)], [1], out=tmp_path / "a", budget_s=120, device="cpu", backend="select")
    short = tune([(200, 300)], [1], out=tmp_path / "b", budget_s=0.5, device="cpu", backend="select")
    assert set(short.entries[0].timings) == set(full.entries[0].timings)


def test_cuda_backend_needs_a_gpu(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="needs a GPU"):
        tune([(200, 300)], [1], out=tmp_path, budget_s=1, device="cpu", backend="cuda")


def test_results_agree_by_mean_relative_error() -> None:
    """Two correct bf16 results of a long-K product differ elementwise near zero (rounding of
    sums that cancel) but agree in mean; a wrong one does not."""
    import torch

    from opmux.kernels.tune import runner

    gen = torch.Generator().manual_seed(0)
    exact = torch.randn(16, 512, generator=gen, dtype=torch.float64) * 300
    a, b = exact.to(torch.bfloat16).float(), (exact + 0.4).to(torch.bfloat16).float()
    assert not torch.allclose(a, b, rtol=2e-2, atol=1e-2)  # what the tuner used to demand
    assert runner._relative_error(a, b) < runner._AGREE
    assert runner._relative_error(a.roll(1, dims=1), b) > runner._AGREE


def test_a_partial_or_locally_wrong_result_is_never_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every candidate is checked against the exact product in a buffer filled with NaN before
    its run: a config that writes half the output (the rest left from an earlier candidate) or
    one wrong element (the mean still close) is refused, however fast."""
    import time

    import torch

    from opmux.kernels.ops.gemm.op import torch_w8a8
    from opmux.kernels.tune import runner

    def run(args: tuple[torch.Tensor, ...], config: dict[str, str]) -> None:
        out = args[0]
        full = torch.empty_like(out, dtype=torch.float32)
        torch_w8a8(full, *args[1:])
        if config["backend"] == "good":
            time.sleep(0.02)  # the slowest: only the checks keep the others out
            out.copy_(full)
        elif config["backend"] == "half":
            out[: out.shape[0] // 2].copy_(full[: out.shape[0] // 2])
        else:  # one element wrong by half the scale: the mean error stays below the bound
            out.copy_(full)
            out[3, 5] += full.abs().max() / 2

    cands = [{"backend": b} for b in ("good", "half", "row")]
    monkeypatch.setattr(runner, "_select", lambda op, device: runner.Tunable(lambda m, s: cands, run, True))
    monkeypatch.setattr(runner, "_write_size_classes", lambda *a: None)
    report = tune([(200, 300)], [64], out=tmp_path, budget_s=60, device="cpu", backend="select")
    assert report.entries[0].config == {"backend": "good"}
    err = capsys.readouterr().err
    assert "wrong {'backend': 'half'}: 6400 of 12800 elements not written" in err
    assert "wrong {'backend': 'row'}: max |diff|" in err


def test_a_nan_never_agrees() -> None:
    import torch

    from opmux.kernels.tune import runner

    exact = torch.ones(4, 4)
    assert runner._relative_error(torch.full((4, 4), float("nan")), exact) == float("inf")
    assert runner._disagreement(exact.clone(), exact) is None
    assert "not written" in (runner._disagreement(exact.clone().fill_(float("nan")), exact) or "")


def test_interleaved_round_alternates_and_takes_medians() -> None:
    calls: list[str] = []
    fns = {name: (lambda name=name: calls.append(name)) for name in ("a", "b", "c")}
    us = time_interleaved(None, fns, "cpu", rounds=4)
    assert set(us) == {"a", "b", "c"} and all(v >= 0 for v in us.values())
    # one warm call each, then each round every function once, the order rotated a place a round
    assert calls[:3] == ["a", "b", "c"]
    rounds = [calls[3 + 3 * r : 6 + 3 * r] for r in range(4)]
    assert rounds == [["a", "b", "c"], ["b", "c", "a"], ["c", "a", "b"], ["a", "b", "c"]]


def test_final_round_failure_keeps_the_first_pass_pick(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(*args: object, **kwargs: object) -> dict[str, float]:
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(interleaved, "time_interleaved", broken)
    tunable = runner.Tunable(lambda m, shape: [], lambda args, config: None)
    timed = [(5.0, {"config_id": 2}), (3.0, {"config_id": 0}), (4.0, {"config_id": 1})]
    log = io.StringIO()
    best, final = runner._final_round(None, "cuda", tunable, [()], timed, log)
    assert best == (3.0, {"config_id": 0}) and final == {}
    assert "final round skipped: RuntimeError" in log.getvalue()


def test_final_round_picks_the_fastest_finalist(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    seen: dict[str, int] = {}

    def fake(torch: object, fns: dict[str, Any], device: str, *, rounds: int) -> dict[str, float]:
        assert rounds % len(fns) == 0  # every finalist first in its turn equally often
        for label, fn in fns.items():  # one replay each: how many calls it makes
            calls.clear()
            fn()
            seen[label] = len(calls)
        return {"0": 8.0 * seen["0"], "1": 6.0 * seen["1"], "2": 7.0 * seen["2"]}  # us per call 8 / 6 / 7

    monkeypatch.setattr(interleaved, "time_interleaved", fake)
    tunable = runner.Tunable(lambda m, shape: [], lambda args, config: calls.append(config["config_id"]))
    timed = [
        (3.0, {"config_id": 0}),
        (3.5, {"config_id": 1}),
        (3.2, {"config_id": 2}),
        (9.0, {"config_id": 3}),
    ]
    best, final = runner._final_round(None, "cuda", tunable, [(), ()], timed, io.StringIO())
    assert sorted(seen) == ["0", "1", "2"]  # the three fastest of the first pass, not config 3
    # a replay repeats both input sets until it lasts about 200 us: 34 x 2 calls of 3 us
    assert set(seen.values()) == {68}
    assert best == (6.0, {"config_id": 1}) and final == {"0": 8.0, "1": 6.0, "2": 7.0}


def test_a_race_takes_every_backend_into_the_final_round(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[str] = []

    def fake(torch: object, fns: dict[str, Any], device: str, *, rounds: int) -> dict[str, float]:
        seen.extend(fns)
        return dict.fromkeys(fns, 1.0)

    monkeypatch.setattr(interleaved, "time_interleaved", fake)
    race = runner.Tunable(lambda m, shape: [], lambda args, config: None, exhaustive=True)
    timed = [
        (float(i), {"backend": b}) for i, b in enumerate(["jit", "triton", "scaled_mm", "skinny", "torch"])
    ]
    runner._final_round(None, "cuda", race, [()], timed, io.StringIO())
    assert sorted(seen) == sorted(["jit", "triton", "scaled_mm", "skinny", "torch"])


def test_size_classes_sum_the_final_round_where_it_ran(tmp_path: Path) -> None:
    # the first pass has scaled_mm ahead on both shapes; the interleaved round reverses one shape
    # by more than the other's margin: the class follows the final round's times
    report = runner.Report("dev", "t", str(tmp_path))
    report.entries = [
        runner.Entry(1, 1, 64, {"backend": "jit"}, 8.0, 2, timings={"jit": 10.0, "scaled_mm": 9.0},
                     final={"jit": 8.0, "scaled_mm": 9.5}),
        runner.Entry(2, 2, 64, {"backend": "scaled_mm"}, 9.0, 2, timings={"jit": 9.4, "scaled_mm": 9.2},
                     final={"jit": 9.4, "scaled_mm": 9.0}),
    ]  # fmt: skip
    runner._write_size_classes(report, tmp_path, runner.OP, "dev", io.StringIO())
    key = tuned.table_key(runner.OP, "select", "dev", (tuned.ANY_SHAPE, tuned.ANY_SHAPE))
    assert tuned.read_table(tmp_path / key.file_name(), key)[64] == {"backend": "jit"}
