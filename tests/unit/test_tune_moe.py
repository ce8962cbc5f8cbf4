"""The fused-MoE tuner (``python -m opmux.kernels.tune moe.fused_experts``) on the CPU, in the
Triton interpreter: vLLM-named tables per form, resumable, every entry valid, usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from opmux.kernels import tuned
from opmux.kernels.tune.__main__ import main
from opmux.kernels.tune.models import moe_shapes
from opmux.kernels.tune.moe import cuda_candidates, moe_candidates

OP = "moe.fused_experts"


def test_tables_resume_and_forms(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        OP,
        "--shapes",
        "4,64,128,2;4,64,256,2,fp8",
        "--m",
        "1,8",
        "--budget-s",
        "3600",  # --max-configs bounds the work; a budget that runs out (a loaded CI box) fails the test
        "--out",
        str(tmp_path),
    ]
    capsys.readouterr()
    assert main([*argv, "--max-configs", "2", "--device", "cpu", "--json"]) == 0
    for e in json.loads(capsys.readouterr().out)["entries"]:
        # two candidates timed: the pick is the faster of the interleaved final round
        assert len(e["timings"]) == 2 and set(e["final"]) == set(e["timings"])
        assert e["us"] == min(e["final"].values()) == e["final"][",".join(map(str, e["config"].values()))]
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == [
        "E=4,N=64,device_name=cpu,dtype=fp8_w8a8,block_shape=[128,128].json",
        "E=4,N=64,device_name=cpu.json",
    ]
    for name in names:
        key = tuned.TableKey.parse(OP, name)
        table = tuned.read_table(tmp_path / name, key)  # validated against the form's rules
        assert sorted(table) == [1, 8]
        if "fp8" in name:
            assert all(c["BLOCK_SIZE_K"] == 128 for c in table.values())
    before = {n: (tmp_path / n).read_text() for n in names}
    capsys.readouterr()
    assert main([*argv, "--device", "cpu", "--json"]) == 0  # resumed: every entry kept, none timed
    report = json.loads(capsys.readouterr().out)
    assert all(e["skipped"] for e in report["entries"]) and len(report["entries"]) == 4
    assert {n: (tmp_path / n).read_text() for n in names} == before


def test_candidates_and_presets() -> None:
    cands = moe_candidates(1, (8, 14336, 4096, 2), "bf16")
    assert cands[0] == tuned.default_config(OP, "triton", 1, (8, 14336))
    # M tiles past the rows one expert gets: out (the decode path's rows are not M tiles)
    assert all(c["BLOCK_SIZE_M"] <= 32 for c in cands if not c.get("DECODE"))
    fp8 = moe_candidates(4096, (256, 2048, 7168, 8), "fp8")
    assert {c["BLOCK_SIZE_K"] for c in fp8} == {128} and len(fp8) == len({json.dumps(c) for c in fp8})
    assert moe_shapes("DeepSeek-V3") == (256, 2048, 7168, 8, "fp8")
    assert moe_shapes("Qwen3-235B-A22B", tp=4) == (128, 384, 4096, 8, "bf16")
    with pytest.raises(ValueError, match="presets"):
        moe_shapes("GPT-5")


def test_native_decode_candidates() -> None:
    """The native decode kernels' candidates: the default for M first, every instantiated
    (up, down) pair and the unit's own choice once each, all valid table entries."""
    for m in (1, 4, 64):
        cands = cuda_candidates(m)
        assert cands[0] == dict(tuned.default_config(OP, "cuda", m, (8, 14336)))
        assert len(cands) == 1 + 3 * 4 and len({json.dumps(c) for c in cands}) == len(cands)
        assert all(tuned.validate_entry(OP, "cuda", c, ()) == [] for c in cands)
        assert {"UP_ROWS": 0, "DOWN_ROWS": 0} in cands and {"UP_ROWS": 4, "DOWN_ROWS": 8} in cands


def test_native_decode_refusal_without_a_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """The tuner asks the backend's rule before making weights; a GPU that cannot be read is a
    reason, and on a GPU's facts the rule refuses by shape (too many tokens, a dtype)."""
    from opmux.kernels.ops.moe import fused_experts_cuda as fc
    from opmux.kernels.tune.moe import cuda_refusal

    def unreadable(index: int) -> None:
        raise RuntimeError("no GPU")

    monkeypatch.setattr(fc, "_device_facts", unreadable)
    assert "cannot be read" in (cuda_refusal(256, 2048, 7168, 8, "fp8", 1) or "")
    monkeypatch.setattr(fc, "_device_facts", lambda index: ((9, 0), 227 * 1024))
    monkeypatch.setattr("torch.cuda.current_device", lambda: 0)
    assert cuda_refusal(256, 2048, 7168, 8, "fp8", 1) is None
    assert "tokens" in (cuda_refusal(256, 2048, 7168, 8, "fp8", fc.MAX_TOKENS + 1) or "")


def test_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main([OP, "--shapes", "4,64,128", "--budget-s", "5", "--out", str(tmp_path)])
    assert info.value.code == 2 and "E,N,K,topk" in capsys.readouterr().err
    assert main([OP, "--budget-s", "5", "--out", str(tmp_path)]) == 1
    assert "nothing to tune" in capsys.readouterr().err
    assert main([OP, "--models", "Mixtral-8x7B", "--backend", "select", "--budget-s", "5", "--out", "x"]) == 1
    assert "tunes triton and cuda launches" in capsys.readouterr().err
    cpu = ["--device", "cpu", "--budget-s", "5", "--out", str(tmp_path)]
    assert main([OP, "--models", "Mixtral-8x7B", "--backend", "cuda", *cpu]) == 1
    assert "native decode kernels: it needs a CUDA GPU" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


def test_unfinished_keeps_the_entries_no_config_ran(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An entry whose every candidate failed stays in the report's unfinished list when the
    budget then runs out (it was replaced by the entries left)."""
    import time

    import opmux.kernels.ops.moe.fused_experts_triton as fe
    from opmux.kernels.tune.moe import tune_moe

    now = [0.0]
    monkeypatch.setattr(time, "monotonic", lambda: now[0])

    def failing(*args: object, **kwargs: object) -> None:
        now[0] += 1e6  # and the budget is spent
        raise RuntimeError("out of resources")

    monkeypatch.setattr(fe, "launch_fused_experts", failing)
    report = tune_moe(
        [(4, 64, 128, 2, "bf16")], [1, 8], out=tmp_path, budget_s=60, device="cpu", max_configs=2
    )
    assert sorted(report.unfinished) == [(4, 64, 128, 2, "bf16", 1), (4, 64, 128, 2, "bf16", 8)]


def test_retune_times_the_readable_tables_first(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A retune times the entry of every table the op reads (here a vLLM file in the user's
    directory, SPLIT_K and all) before its own space: it never keeps a configuration slower than
    one the op could have read. The written entry carries only the kernel's keys."""
    from opmux.kernels import _env

    user, out = tmp_path / "user", tmp_path / "out"
    user.mkdir()
    theirs = {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 32, "BLOCK_SIZE_K": 64, "GROUP_SIZE_M": 1,
              "num_warps": 2, "num_stages": 2, "SPLIT_K": 1}  # fmt: skip
    (user / "E=4,N=64,device_name=cpu.json").write_text(json.dumps({"8": theirs}), encoding="utf-8")
    key = tuned.table_key(OP, "triton", "cpu", (4, 64), ())
    with _env.scope(OPMUX_TUNED_CONFIG_DIR=str(user)):
        assert [dict(c) for c in tuned.table_entries(key, 8)] == [theirs]
        argv = [OP, "--shapes", "4,64,128,2", "--m", "8", "--budget-s", "3600", "--out", str(out)]
        assert main([*argv, "--max-configs", "1", "--device", "cpu", "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    (entry,) = report["entries"]
    theirs.pop("SPLIT_K")
    assert entry["config"] == theirs
    assert tuned.read_table(out / key.file_name(), key)[8] == theirs
