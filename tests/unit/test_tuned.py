"""Tuned-config lookup: file naming (vLLM's and SGLang's spellings), nearest M, the user dir
first, malformed files skipped with a warning naming them, the default heuristic, and every
shipped table valid."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from opmux.kernels import _env, tuned

OP = "gemm.w8a8_block_fp8_matmul"
DEV = "NVIDIA_H200"


def _entry(bm: int = 16, bn: int = 64, **extra: int) -> dict[str, int]:
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
            "num_warps": 4, "num_stages": 3, **extra}  # fmt: skip


pytestmark = pytest.mark.usefixtures("tuned_tables")


def _write(directory: Path, name: str, table: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(json.dumps(table), encoding="utf-8")
    return path


VLLM_NAME = f"N=4096,K=7040,device_name={DEV},dtype=fp8_w8a8,block_shape=[128,128].json"
SGLANG_NAME = f"N=4096,K=7040,device_name={DEV},dtype=fp8_w8a8,block_shape=[128, 128].json"


@pytest.mark.parametrize(
    ("backend", "shape", "device"),
    [("triton", (4096, 7040), DEV), ("cuda", (7, 128), "NVIDIA_H100_80GB_HBM3"), ("triton", (1, 1), "cpu")],
)
def test_key_round_trips(backend: str, shape: tuple[int, int], device: str) -> None:
    key = tuned.table_key(OP, backend, device, shape)
    assert tuned.TableKey.parse(OP, key.file_name()) == key
    assert ("backend=" in key.file_name()) == (backend != "triton")


def test_file_names_match_vllm_and_sglang() -> None:
    key = tuned.table_key(OP, "triton", DEV, (4096, 7040))
    assert key.file_name() == VLLM_NAME
    assert tuned.TableKey.parse(OP, SGLANG_NAME) == key


@pytest.mark.parametrize(
    ("name", "match"),
    [
        ("E=256,N=128,device_name=X,dtype=fp8_w8a8,block_shape=[128,128].json", "E"),  # a MoE table
        ("N=1,device_name=X,dtype=fp8_w8a8,block_shape=[128,128].json", "lacks integer N, K"),
        ("N=1,K=2,dtype=fp8_w8a8,block_shape=[128,128].json", "device_name missing"),
        ("garbage.json", "name=value"),
    ],
)
def test_parse_rejects_other_files(name: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        tuned.TableKey.parse(OP, name)


def test_parse_keeps_other_dtypes_apart() -> None:
    key = tuned.TableKey.parse(OP, VLLM_NAME.replace("fp8_w8a8", "int8_w8a8"))
    assert key != tuned.table_key(OP, "triton", DEV, (4096, 7040))


@pytest.mark.parametrize(
    ("m", "expected"),
    [(1, 1), (2, 1), (3, 4), (5, 4), (6, 4), (7, 8), (40, 32), (48, 32), (49, 64), (10_000, 64)],
)
def test_nearest_m_as_vllm(m: int, expected: int) -> None:
    keys = [1, 4, 8, 16, 32, 64]
    assert keys[tuned.nearest(keys, m)] == expected
    assert expected == min(keys, key=lambda x: abs(x - m))  # vLLM's rule, first (smaller) on a tie


def test_lookup_uses_nearest_entry(tuned_user_dir: Path) -> None:
    _write(tuned_user_dir, VLLM_NAME, {"1": _entry(16, 32), "64": _entry(64, 128), "512": _entry(128, 128)})
    assert tuned.lookup(OP, "triton", DEV, (4096, 7040), 1)["BLOCK_SIZE_N"] == 32
    assert tuned.lookup(OP, "triton", DEV, (4096, 7040), 100)["BLOCK_SIZE_M"] == 64
    assert tuned.lookup(OP, "triton", DEV, (4096, 7040), 4000)["BLOCK_SIZE_M"] == 128
    # another device or shape: the default
    assert dict(tuned.lookup(OP, "triton", "NVIDIA_H100", (4096, 7040), 1)) == tuned.default_config(
        OP, "triton", 1, (4096, 7040)
    )


def test_lookup_is_memoised(tuned_user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tuned_user_dir, SGLANG_NAME, {"1": _entry()})
    first = tuned.lookup(OP, "triton", DEV, (4096, 7040), 3)
    reads: list[Path] = []
    monkeypatch.setattr(tuned, "read_table", lambda path, key: reads.append(path))
    monkeypatch.setattr(tuned, "find_table", lambda key: reads.append(Path()))
    assert tuned.lookup(OP, "triton", DEV, (4096, 7040), 3) is first
    assert tuned.lookup(OP, "triton", DEV, (4096, 7040), 2) == first  # table cached, no reread
    assert reads == []
    with pytest.raises(TypeError):
        first["BLOCK_SIZE_M"] = 1  # type: ignore[index]


def test_a_config_stands_for_m_within_reach(tuned_user_dir: Path) -> None:
    """A table tuned at decode M only does not launch prefill: beyond SELECT_REACH of the nearest
    entry the default heuristic runs, and explain says so; vLLM's full tables read as in vLLM."""
    _write(tuned_user_dir, VLLM_NAME, {"1": _entry(bn=32), "16": _entry(bn=64)})
    assert tuned.lookup(OP, "triton", DEV, (4096, 7040), 64)["BLOCK_SIZE_N"] == 64
    assert tuned.source(OP, "triton", DEV, (4096, 7040), 64).endswith(VLLM_NAME)
    far = tuned.lookup(OP, "triton", DEV, (4096, 7040), 8192)
    assert dict(far) == tuned.default_config(OP, "triton", 8192, (4096, 7040))
    assert tuned.source(OP, "triton", DEV, (4096, 7040), 8192) == "default"
    assert tuned.source(OP, "triton", DEV, (4096, 7040)).endswith(VLLM_NAME)


def test_user_dir_first_and_op_subfolder_first(tuned_user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = tuned_user_dir / "shipped"
    monkeypatch.setattr(tuned, "shipped_dir", lambda op: shipped / op)
    _write(shipped / OP, VLLM_NAME, {"1": _entry(bn=32)})
    assert tuned.lookup(OP, "triton", DEV, (4096, 7040), 1)["BLOCK_SIZE_N"] == 32
    tuned.refresh()
    _write(tuned_user_dir, VLLM_NAME, {"1": _entry(bn=64)})
    assert tuned.lookup(OP, "triton", DEV, (4096, 7040), 1)["BLOCK_SIZE_N"] == 64
    tuned.refresh()
    _write(tuned_user_dir / OP, SGLANG_NAME, {"1": _entry(bn=128)})
    assert tuned.lookup(OP, "triton", DEV, (4096, 7040), 1)["BLOCK_SIZE_N"] == 128
    assert [d for d, _ in tuned.search_dirs(OP)] == [tuned_user_dir / OP, tuned_user_dir, shipped / OP]


def test_env_var_read_once_until_refresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(tmp_path, VLLM_NAME, {"1": _entry(bn=256)})
    default_bn = tuned.default_config(OP, "triton", 1, (4096, 7040))["BLOCK_SIZE_N"]
    assert tuned.lookup(OP, "triton", DEV, (4096, 7040), 1)["BLOCK_SIZE_N"] == default_bn
    monkeypatch.setenv("OPMUX_TUNED_CONFIG_DIR", str(tmp_path))
    assert tuned.lookup(OP, "triton", DEV, (4096, 7040), 1)["BLOCK_SIZE_N"] == default_bn  # memoised
    tuned.refresh()
    assert tuned.lookup(OP, "triton", DEV, (4096, 7040), 1)["BLOCK_SIZE_N"] == 256


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("{not json", "unreadable"),
        ("[]", "non-empty object"),
        (json.dumps({"1": {**_entry(), "kpack": 2}}), "unknown key.*kpack"),
        (json.dumps({"1": _entry(bm=48)}), "BLOCK_SIZE_M=48"),
        (json.dumps({"1": {**_entry(), "BLOCK_SIZE_K": 64}}), "BLOCK_SIZE_K=64"),
        (json.dumps({"x": _entry()}), "'x' is not a batch size"),
        (json.dumps({"1": {**_entry(), "num_warps": "4"}}), "num_warps='4' is not an integer"),
        (json.dumps({"1": {"BLOCK_SIZE_M": 16}}), "missing BLOCK_SIZE_N"),
    ],
)
def test_malformed_user_file_warns_and_falls_back(tuned_user_dir: Path, content: str, reason: str) -> None:
    path = tuned_user_dir / VLLM_NAME
    path.write_text(content, encoding="utf-8")
    with pytest.warns(tuned.TunedConfigWarning, match=reason) as record:
        config = tuned.lookup(OP, "triton", DEV, (4096, 7040), 8)
    assert str(path) in str(record[0].message)
    assert dict(config) == tuned.default_config(OP, "triton", 8, (4096, 7040))


def test_bad_user_file_gives_way_to_next(tuned_user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    shipped = tuned_user_dir / "shipped"
    monkeypatch.setattr(tuned, "shipped_dir", lambda op: shipped / op)
    _write(shipped / OP, VLLM_NAME, {"1": _entry(bn=32)})
    (tuned_user_dir / VLLM_NAME).write_text("{", encoding="utf-8")
    with pytest.warns(tuned.TunedConfigWarning):
        assert tuned.lookup(OP, "triton", DEV, (4096, 7040), 1)["BLOCK_SIZE_N"] == 32


def test_other_ops_files_in_the_user_dir_are_ignored(tuned_user_dir: Path) -> None:
    _write(
        tuned_user_dir, f"E=256,N=128,device_name={DEV},dtype=fp8_w8a8,block_shape=[128,128].json", {"1": {}}
    )
    _write(tuned_user_dir, "notes.txt", {})
    assert dict(tuned.lookup(OP, "triton", DEV, (128, 7168), 1)) == tuned.default_config(
        OP, "triton", 1, (128, 7168)
    )


def test_cuda_backend_tables(tuned_user_dir: Path) -> None:
    key = tuned.table_key(OP, "cuda", DEV, (4096, 7040))
    assert key.file_name().endswith(",backend=cuda.json")
    _write(tuned_user_dir, key.file_name(), {"1": {"config_id": 3}, "256": {"config_id": 7}})
    _write(tuned_user_dir, VLLM_NAME, {"1": _entry()})  # the triton table of the same shape is apart
    assert dict(tuned.lookup(OP, "cuda", DEV, (4096, 7040), 200)) == {"config_id": 7}
    assert "config_id" not in tuned.lookup(OP, "triton", DEV, (4096, 7040), 200)


@pytest.mark.parametrize("m", [1, 2, 16, 17, 32, 33, 64, 65, 256, 257, 4096, 100_000])
def test_default_heuristic(m: int) -> None:
    config = tuned.default_config(OP, "triton", m, (4096, 7040))
    assert tuned.validate_entry(OP, "triton", config) == []
    assert config["BLOCK_SIZE_K"] == 128
    if m <= 16:
        assert config["BLOCK_SIZE_M"] == 16
    if m > 256:
        assert (config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["num_warps"]) == (128, 128, 8)
    # tiles never grow as M shrinks
    smaller = tuned.default_config(OP, "triton", max(1, m // 2), (4096, 7040))
    assert smaller["BLOCK_SIZE_M"] <= config["BLOCK_SIZE_M"]


def test_unknown_op_or_backend_names_the_choices() -> None:
    with pytest.raises(ValueError, match=r"'gemm\.nope'.*gemm\.w8a8_block_fp8_matmul"):
        tuned.lookup("gemm.nope", "triton", DEV, (1, 1), 1)
    with pytest.raises(ValueError, match=r"'rocm'.*triton, cuda"):
        tuned.lookup(OP, "rocm", DEV, (1, 1), 1)


def test_table_error_pickles() -> None:
    err = pickle.loads(pickle.dumps(tuned.TableError("/x.json", "bad")))
    assert (err.path, err.reason, str(err)) == ("/x.json", "bad", "/x.json: bad")


def test_write_table_is_atomic_and_sorted(tmp_path: Path) -> None:
    path = tmp_path / "sub" / VLLM_NAME
    tuned.write_table(path, {64: _entry(), 1: _entry(bn=32)})
    assert list(json.loads(path.read_text())) == ["1", "64"]
    assert [p.name for p in path.parent.iterdir()] == [VLLM_NAME]  # no temp file left
    key = tuned.table_key(OP, "triton", DEV, (4096, 7040))
    assert tuned.read_table(path, key)[1]["BLOCK_SIZE_N"] == 32


def test_shipped_tables_are_valid() -> None:
    """Every file under opmux/kernels/configs/ names a table of its folder's op and reads
    cleanly (read_table raises on any problem)."""
    for path, key in tuned.shipped_tables():
        assert tuned.read_table(path, key)
        assert path.name == key.file_name() or tuned.TableKey.parse(key.op, path.name) == key


def test_import_is_torch_free() -> None:
    import subprocess
    import sys

    code = "import sys, opmux.kernels.tuned, opmux.kernels.tune; assert 'torch' not in sys.modules, 'torch'"
    python_dir = str(Path(__file__).resolve().parents[2] / "python")
    subprocess.run(
        [sys.executable, "-c", code], check=True, env={**_env.child_environ(), "PYTHONPATH": python_dir}
    )


def test_cuda_default_is_the_kernels_own_heuristic() -> None:
    assert dict(tuned.lookup(OP, "cuda", DEV, (1000, 1000), 7)) == {"config_id": tuned.KERNEL_HEURISTIC}
    assert tuned.validate_entry(OP, "cuda", {"config_id": -1})  # never in a file


def test_select_tables_and_the_any_shape_size_classes(tuned_user_dir: Path) -> None:
    GPU = "OPMUX_TEST_GPU"  # no shipped table: only what the test writes
    exact = tuned.table_key(OP, "select", GPU, (4096, 7040))
    classes = tuned.table_key(OP, "select", GPU, (tuned.ANY_SHAPE, tuned.ANY_SHAPE))
    assert exact.file_name().endswith(",backend=select.json")
    assert classes.file_name().startswith("N=0,K=0,")
    assert dict(tuned.lookup(OP, "select", GPU, (4096, 7040), 1)) == {}  # no table: no preference
    assert tuned.source(OP, "select", GPU, (4096, 7040)) == "default"
    _write(tuned_user_dir, classes.file_name(), {"1": {"backend": "triton"}, "512": {"backend": "scaled_mm"}})
    tuned.refresh()
    assert tuned.lookup(OP, "select", GPU, (4096, 7040), 300)["backend"] == "scaled_mm"
    assert tuned.source(OP, "select", GPU, (4096, 7040)).endswith(classes.file_name())
    _write(tuned_user_dir, exact.file_name(), {"1": {"backend": "jit"}})
    tuned.refresh()
    assert tuned.lookup(OP, "select", GPU, (4096, 7040), 2)["backend"] == "jit"  # its own table first
    assert tuned.lookup(OP, "select", GPU, (2048, 7168), 1)["backend"] == "triton"
    # a measurement stands for Ms within SELECT_REACH of its own: a table tuned at M=1 only does
    # not choose for M=300 (the size classes do), nor the classes' M=512 for M=8192 (no preference)
    assert tuned.lookup(OP, "select", GPU, (4096, 7040), 300)["backend"] == "scaled_mm"
    assert tuned.source(OP, "select", GPU, (4096, 7040), 300).endswith(classes.file_name())
    assert tuned.source(OP, "select", GPU, (4096, 7040), 2).endswith(exact.file_name())
    assert dict(tuned.lookup(OP, "select", GPU, (4096, 7040), 8192)) == {}
    assert tuned.source(OP, "select", GPU, (4096, 7040), 8192) == "default"
    # the entry that speaks for M is the nearest by ratio, as the reach is: M=1024 of a table
    # measured at 16 and 4096 takes 4096's (by absolute distance it was 16's, out of reach)
    gapped = tuned.table_key(OP, "select", GPU, (1024, 7040))
    _write(tuned_user_dir, gapped.file_name(), {"16": {"backend": "triton"}, "4096": {"backend": "jit"}})
    tuned.refresh()
    assert tuned.lookup(OP, "select", GPU, (1024, 7040), 1024)["backend"] == "jit"
    assert tuned.source(OP, "select", GPU, (1024, 7040), 1024).endswith(gapped.file_name())
    assert tuned.lookup(OP, "select", GPU, (1024, 7040), 64)["backend"] == "triton"
    assert tuned.lookup(OP, "select", GPU, (1024, 7040), 0)["backend"] == "triton"
    assert (
        tuned.lookup(OP, "select", GPU, (1024, 7040), 256)["backend"] == "scaled_mm"
    )  # 16x both ways: the classes


@pytest.mark.parametrize("entry", [{"backend": "Triton!"}, {"backend": 3}, {"backend": "jit", "x": 1}, {}])
def test_select_entries_are_validated(entry: dict[str, object]) -> None:
    assert tuned.validate_entry(OP, "select", entry)


def test_device_name_of_the_host() -> None:
    class Dev:
        type, index = "cpu", None

    assert tuned.device_name(Dev()) == "cpu"


def test_memo_is_emptied_by_refresh() -> None:
    memo = tuned.memo()
    memo["x"] = 1
    tuned.refresh()
    assert memo == {}
