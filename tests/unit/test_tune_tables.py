"""The attention launch sweeps' tuned tables without a GPU (benchmarks/tune/decode_tiles.py and
prefill_tiles.py, ``--tables-from JSON --table-out DIR``): per (DV, G) and M the candidate its
cases favour by more than 2%, else the default as timed; the files are named for the record's GPU,
read cleanly and are what the launch looks up; a decode record of the sweep before wave targets is
refused with a message."""

from __future__ import annotations

import importlib
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from opmux.kernels import _env, tuned

ROOT = Path(__file__).resolve().parents[2]
TUNE = ROOT / "benchmarks" / "tune"
ENV = {"device": "NVIDIA H200", "sms": 132}


@pytest.fixture
def sweeps(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ModuleType, ModuleType]]:
    monkeypatch.syspath_prepend(str(TUNE))
    names = ("decode_tiles", "prefill_tiles", "_sweep")
    for name in names:
        sys.modules.pop(name, None)
    yield importlib.import_module("decode_tiles"), importlib.import_module("prefill_tiles")
    for name in names:
        sys.modules.pop(name, None)


def _dcfg(bn: int, warps: int, stages: int, prefetch: int, waves: int) -> dict[str, int]:
    return {"BLOCK_N": bn, "num_warps": warps, "num_stages": stages, "PREFETCH": prefetch, "WAVES": waves}


DEFAULT = _dcfg(32, 4, 3, 1, 4)
WIDE = _dcfg(64, 4, 3, 0, 8)


def _decode_case(m: int, n: int, default_us: float, wide_us: float, fp8: bool = False) -> dict[str, Any]:
    cands = {
        "32x4w s3 pf waves4": {"cfg": DEFAULT, "us": default_us * 1.01},
        "64x4w s3 waves8": {"cfg": WIDE, "us": wide_us},
        "64x4w s3 waves16": {"cfg": {**WIDE, "WAVES": 16}, "us": wide_us, "same_as": "64x4w s3 waves8"},
        "16x2w s3 pf waves4": {"cfg": _dcfg(16, 2, 3, 1, 4), "status": "wrong", "err": 1.0},
    }
    return {
        "model": "m", "B": m // 8, "N": n, "fp8": fp8, "splits": 8, "shape": [128, 4], "M": m, "sms": 132,
        "default_cfg": DEFAULT, "heuristic_us": default_us, "cands": cands,
    }  # fmt: skip


def _tables_from(sweep: ModuleType, record: dict[str, Any], tmp_path: Path) -> Path:
    """``sweep.py --tables-from <record> --table-out <folder>``: the folder."""
    (tmp_path / "r.json").write_text(json.dumps(record), encoding="utf-8")
    assert (
        sweep.main(["--tables-from", str(tmp_path / "r.json"), "--table-out", str(tmp_path / "tables")]) == 0
    )
    return tmp_path / "tables"


def test_decode_tables_from_a_record(
    sweeps: tuple[ModuleType, ModuleType], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """M = 8: the wide tile at 8 waves wins over both contexts (0.9x, 0.97x: geomean < 0.98);
    M = 512: it wins at one context only (0.9x, 1.1x): the default as timed; fp8 cases (no table
    read) and a wrong candidate take no part; the duplicate wave target (same split count) loses
    the tie to the smaller one."""
    decode, _ = sweeps
    record = {
        "env": ENV, "tiles": [], "waves": [2, 3, 4, 8], "split_rule": "floor",
        "cases": [
            _decode_case(8, 512, 10.0, 9.0), _decode_case(8, 32768, 100.0, 97.0),
            _decode_case(512, 512, 10.0, 9.0), _decode_case(512, 32768, 100.0, 110.0),
            _decode_case(512, 4096, 50.0, 1.0, fp8=True),
        ],
    }  # fmt: skip
    assert decode.tables(record) == {(128, 4): {8: WIDE, 512: DEFAULT}}
    out = _tables_from(decode, record, tmp_path)
    name = "DV=128,G=4,device_name=NVIDIA_H200.json"
    assert [p.name for p in out.iterdir()] == [name] and name in capsys.readouterr().out
    key = tuned.table_key("attention.paged_decode", "triton", "NVIDIA_H200", (128, 4))
    assert key.file_name() == name and tuned.read_table(out / name, key) == {8: WIDE, 512: DEFAULT}
    with _env.scope(OPMUX_TUNED_CONFIG_DIR=str(out)):  # (the scope rereads the tables, in and out)
        assert dict(tuned.lookup("attention.paged_decode", "triton", "NVIDIA_H200", (128, 4), 16)) == WIDE


def test_decode_record_of_the_rounded_up_rule_is_refused(
    tmp_path: Path, sweeps: tuple[ModuleType, ModuleType]
) -> None:
    """A record whose WAVES meant split counts rounded up (docs/benchmarks/attention_decode_tiles_tables_h200.json):
    the same entries now give other counts, so no table is written from it."""
    decode, _ = sweeps
    old = json.loads((ROOT / "docs" / "benchmarks" / "attention_decode_tiles_tables_h200.json").read_text())
    assert "wave_factors" in old
    with pytest.raises(ValueError, match="rounded up"):
        decode.tables(old)


def test_decode_record_before_wave_targets_is_refused(
    sweeps: tuple[ModuleType, ModuleType], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    decode, _ = sweeps
    old = ROOT / "docs" / "benchmarks" / "attention_decode_tiles_h200.json"
    with pytest.raises(SystemExit):
        decode.main(["--tables-from", str(old), "--table-out", str(tmp_path)])
    assert "raw split counts, no wave targets" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(SystemExit):
        decode.main(["--tables-from", str(old)])  # no --table-out
    with pytest.raises(SystemExit):
        decode.main([])  # neither a sweep's --out nor --tables-from
    assert "--out is required" in capsys.readouterr().err


def test_prefill_tables_from_a_record(sweeps: tuple[ModuleType, ModuleType], tmp_path: Path) -> None:
    """The record's own tiles compete (one the current TILES lacks included); per query rows."""
    _, prefill = sweeps
    default = {"BLOCK_M": 128, "BLOCK_N": 64, "num_warps": 8, "num_stages": 2, "SPLIT": 0}

    def case(rows: int, mode: str, us: float) -> dict[str, Any]:
        return {
            "model": "m", "mode": mode, "N": rows, "rows": rows, "shape": [128, 4], "default_cfg": default,
            "default_us": 10.0, "cands": {"32x16 2w s1 split": {"us": us}},
        }  # fmt: skip

    record = {
        "env": ENV, "tiles": [[32, 16, 2, 1, True]],
        "cases": [case(1024, "prefill", 9.0), case(1024, "extend", 9.5), case(4096, "prefill", 9.9)],
    }  # fmt: skip
    won = {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 2, "num_stages": 1, "SPLIT": 1}
    assert prefill.tables(record) == {(128, 4): {1024: won, 4096: default}}
    out = _tables_from(prefill, record, tmp_path)
    key = tuned.table_key("attention.paged_prefill", "triton", "NVIDIA_H200", (128, 4))
    assert tuned.read_table(out / key.file_name(), key) == {1024: won, 4096: default}


def _pcase(mode: str, m: int, triton: float | None, flashinfer: float | None) -> dict[str, Any]:
    impls = {}
    for be, us in (("triton", triton), ("flashinfer", flashinfer)):
        impls[f"opmux {be}"] = {"status": "ok", "us": us} if us is not None else {"status": "error"}
    return {"model": "Llama-3-8B", "mode": mode, "N": m, "shape": [128, 4], "M": m, "impls": impls}


def test_prefill_select_tables_from_a_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench_attention_prefill.py --select-from: per (DV, G) and new tokens the backend its cases
    favour by more than 2% (geometric mean over the modes), Triton (the declared first) else or
    where FlashInfer failed a case; the files read back as the dispatcher's select entries."""
    record = {
        "env": ENV,
        "cases": [
            _pcase("prefill", 1024, 100.0, 80.0),
            _pcase("ragged", 1024, 100.0, 99.0),  # geomean 0.89: flashinfer
            _pcase("prefill", 4096, 100.0, 99.0),  # 0.99: inside the margin
            _pcase("prefill", 16384, 100.0, 50.0),
            _pcase("extend", 16384, 100.0, None),  # flashinfer failed one case of this M
            {"model": "Llama-3-8B", "mode": "prefill", "N": 32768, "skipped": "budget"},
        ],
    }
    assert _select_from("bench_attention_prefill", record, tmp_path, monkeypatch) == {
        1024: {"backend": "flashinfer"},
        4096: {"backend": "triton"},
        16384: {"backend": "triton"},
    }


def _select_from(
    bench_name: str, record: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> dict[int, dict[str, Any]]:
    """The select table (DV 128, G 4) that ``bench_name --select-from`` writes from ``record``."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    for name in (bench_name, "select_tables"):
        sys.modules.pop(name, None)
    bench = importlib.import_module(bench_name)
    src = tmp_path / "record.json"
    src.write_text(json.dumps(record), encoding="utf-8")
    out = tmp_path / "tables"
    try:
        assert bench.main(["--out", str(tmp_path), "--select-from", str(src), "--select-out", str(out)]) == 0
    finally:
        for name in (bench_name, "select_tables"):
            sys.modules.pop(name, None)
    key = tuned.table_key(bench.OP, "select", "NVIDIA_H200", (128, 4))
    return {m: dict(e) for m, e in tuned.read_table(out / key.file_name(), key).items()}


def _dcase(bsz: int, n: int, triton: float | None, cuda: float | None, fp8: bool = False) -> dict[str, Any]:
    impls = {}
    for be, us in (("triton", triton), ("cuda", cuda)):
        impls[f"opmux {be}"] = {"status": "ok", "us": us} if us is not None else {"status": "wrong"}
    return {"model": "Llama-3-8B", "B": bsz, "N": n, "fp8": fp8, "shape": [128, 4], "M": bsz, "impls": impls}


def test_decode_select_tables_from_a_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """bench_attention_decode.py --select-from: per (DV, G) and batch the backend its bf16 cases
    favour by more than 2% (geometric mean over the contexts), Triton else or where the native
    unit was wrong once; the fp8 cases are another form and decide nothing."""
    record = {
        "env": ENV,
        "cases": [
            _dcase(1, 512, 10.0, 9.0),
            _dcase(1, 32768, 50.0, 52.0),  # geomean 0.97: cuda by 3%
            _dcase(16, 512, 10.0, 9.9),  # 0.99: inside the margin
            _dcase(64, 4096, 40.0, 20.0),
            _dcase(64, 32768, 300.0, None),  # the native unit wrong at one context of this batch
            _dcase(256, 4096, 100.0, 50.0, fp8=True),  # fp8: no table entry
            {"model": "Llama-3-8B", "B": 256, "N": 512, "fp8": False, "skipped": "budget"},
        ],
    }
    assert _select_from("bench_attention_decode", record, tmp_path, monkeypatch) == {
        1: {"backend": "cuda"},
        16: {"backend": "triton"},
        64: {"backend": "triton"},
    }
