"""gemm.w8a8_block_fp8_matmul's skinny-M CUDA backend (``skinny``, ops/gemm/skinny_cuda.py) on a
machine without a GPU: its predicate's reasons, its declaration after Triton, its tuned-table
entries and tuner limits, and the unit compiled for sm_90a and sm_80 with its host checks refusing
bad arguments (OPMUX_TEST_NVCC=1). Its numbers are checked on a GPU: tests/parity/test_gemm_grid.py
(vLLM's grid at M <= 16, every launch choice against the reference)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from opmux.kernels import registry, tuned
from opmux.kernels.errors import CallRefused
from opmux.kernels.ops.gemm import _skinny_launch as launch
from opmux.kernels.ops.gemm import skinny_cuda as sk
from opmux.kernels.selector import Facts, select
from opmux.kernels.tune import __main__ as tune_cli

OP = "gemm.w8a8_block_fp8_matmul"
_OK: dict[str, Any] = {"device": "cuda", "capability": (9, 0), "m": 1, "k": 7168, "aligned": True}


def test_refusal_reasons() -> None:
    assert sk.refusal(**_OK) is None
    assert sk.refusal(**{**_OK, "m": launch.MAX_ROWS, "capability": (8, 9)}) is None
    for change, words in (
        ({"device": "cpu"}, "not cpu"),
        ({"capability": (8, 6)}, "sm_86"),
        ({"capability": None}, "unknown"),
        ({"m": launch.MAX_ROWS + 1}, f"at most {launch.MAX_ROWS} rows"),
        ({"k": 3884}, "multiple of 16"),
        ({"aligned": False}, "16-byte aligned"),
    ):
        why = sk.refusal(**{**_OK, **change})
        assert why is not None and words in why, (change, why)


def _args(m: int = 2, n: int = 256, k: int = 256) -> tuple[torch.Tensor, ...]:
    fp8 = torch.float8_e4m3fn
    a = torch.randn(m, k).to(fp8)
    b = torch.randn(n, k).to(fp8)
    return a, b, torch.ones(m, -(-k // 128)), torch.ones(-(-n // 128), -(-k // 128))


def test_supports_facts_on_cpu_tensors() -> None:
    why = sk.supports(*_args())
    assert why is not None and "not cpu" in why
    assert sk.supports(None, None) is None  # not tensors: the contract speaks
    _, b, _, _ = _args(k=272)
    assert sk._aligned(b) and not sk._aligned(b[:, 8:])  # a start 8 bytes off
    assert not sk._aligned(torch.empty(4, 264).to(torch.float8_e4m3fn)[:, :256])  # 264-byte rows


def test_forced_kernel_call_refuses_with_the_reason() -> None:
    a, b, sa, sb = _args()
    with pytest.raises(CallRefused, match="not cpu"):
        sk.matmul(torch.empty(2, 256, dtype=torch.bfloat16), a, b, sa, sb)


def test_declared_after_triton_on_cuda_only() -> None:
    spec = registry.get(OP)
    backend = spec.backend(sk.BACKEND)
    assert backend.requires.devices == ("cuda",) and backend.requires.sm_min == 89
    assert backend.requires.predicate == "opmux.kernels.ops.gemm.skinny_cuda:supports"
    order = dict(spec.priority)
    assert order["cuda"] == ("scaled_mm", "aot", "jit", "triton", "skinny", "torch")
    h200 = Facts("cuda", "sm_90a", frozenset({"cuda", "triton", "cuda_jit", "aot_cuda", "nvcc"}))
    assert select(spec, h200, dtype="float8_e4m3fn").chosen != sk.BACKEND  # first only by a select table
    forced = select(spec, h200, dtype="float8_e4m3fn", preferred=(sk.BACKEND, "forced"))
    assert forced.chosen == sk.BACKEND


def test_table_entries_and_default() -> None:
    ok = {"TILES": 2, "K_WARPS": 8}
    assert tuned.validate_entry(OP, sk.BACKEND, ok) == []
    assert tuned.validate_entry(OP, sk.BACKEND, {"TILES": 0, "K_WARPS": 0}) == []
    for bad, words in (
        ({"TILES": 3, "K_WARPS": 8}, "TILES=3"),
        ({"TILES": 2.0, "K_WARPS": 8}, "TILES=2.0"),
        ({"TILES": True, "K_WARPS": 8}, "TILES=True"),
        ({"TILES": 2}, "missing K_WARPS"),
        ({**ok, "SPLIT_K": 2}, "unknown key"),
        ({"TILES": 2, "K_WARPS": 16}, "K_WARPS=16"),
    ):
        found = tuned.validate_entry(OP, sk.BACKEND, bad)
        assert any(words in p for p in found), (bad, found)
    assert dict(tuned.lookup(OP, sk.BACKEND, "no_such_gpu", (4096, 7168), 1)) == {"TILES": 0, "K_WARPS": 0}


def test_tuned_table_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    key = tuned.table_key(OP, sk.BACKEND, "Test_GPU", (4096, 7168))
    (tmp_path / key.file_name()).write_text(
        json.dumps({"1": {"TILES": 4, "K_WARPS": 2}, "16": {"TILES": 1, "K_WARPS": 8}})
    )
    monkeypatch.setenv("OPMUX_TUNED_CONFIG_DIR", str(tmp_path))
    tuned.refresh()
    try:
        assert dict(tuned.lookup(OP, sk.BACKEND, "Test_GPU", (4096, 7168), 2)) == {"TILES": 4, "K_WARPS": 2}
        assert dict(tuned.lookup(OP, sk.BACKEND, "Test_GPU", (4096, 7168), 12)) == {"TILES": 1, "K_WARPS": 8}
    finally:
        monkeypatch.delenv("OPMUX_TUNED_CONFIG_DIR")
        tuned.refresh()


def test_tuner_limits(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    common = [OP, "--backend", "skinny", "--shapes", "4096,7168", "--budget-s", "5", "--out", str(tmp_path)]
    assert tune_cli.main([*common, "--m", "32,64"]) == 1
    assert "M up to 16" in capsys.readouterr().err
    assert tune_cli.main([*common, "--m", "1,32", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert "M 32 left out" in err and "needs a GPU" in err
    assert not list(tmp_path.iterdir())


def test_tuned_entries_reach() -> None:
    """A table's entry speaks for M within 4x of its own (vLLM's nearest M): M = 5-8 between
    entries at 1 and 16 has none, and runs the unit's choice."""
    table = ([1, 16], [{"TILES": 4, "K_WARPS": 2}, {"TILES": 1, "K_WARPS": 8}])
    assert tuned._config_entry(table, 4) == {"TILES": 4, "K_WARPS": 2}
    assert tuned._config_entry(table, 6) is None
    assert tuned._config_entry(table, 9) == {"TILES": 1, "K_WARPS": 8}


@pytest.mark.slow
def test_unit_compiles_and_checks_its_arguments(nvcc_unit: Any) -> None:
    """The unit builds for sm_90a and sm_80 and exports its entries; its host checks refuse
    arguments that would read out of bounds (before any CUDA call: CPU tensors exercise them)."""
    mod = nvcc_unit("gemm_skinny_cuda")
    fn = mod["w8a8_block_fp8_matmul_skinny_cuda"]
    a, b, sa, sb = _args()
    out = torch.empty(2, 256, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="cuda"):
        fn(out, a, b, sa, sb, 0, 0, False)
    with pytest.raises(ValueError, match="out must be 2-D"):
        fn(out[0], a, b, sa, sb, 0, 0, False)
    with pytest.raises(ValueError, match="b must be 2-D"):
        fn(out, a, b[0], sa, sb, 0, 0, False)
