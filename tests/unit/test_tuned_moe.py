"""Tuned configs of moe.fused_experts: vLLM's / SGLang's fused-MoE file names (bf16 without a dtype
component, fp32, block fp8), read from a vLLM folder as is (GEMM and other MoE forms beside
them), nearest M, bad user files warned and skipped, the harmless vLLM extras ignored, the
default heuristic, and the Triton launcher taking the tuned entry."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from opmux.kernels import tuned

OP = "moe.fused_experts"
DEV = "NVIDIA_TEST_GPU"  # no shipped table: what a test writes is all there is
FP8 = tuned.FP8_BLOCK_TAGS
F32 = (("dtype", "float32"),)
BF16_NAME = f"E=8,N=14336,device_name={DEV}.json"
FP8_NAME = f"E=256,N=2048,device_name={DEV},dtype=fp8_w8a8,block_shape=[128,128].json"


def _entry(bm: int = 16, bn: int = 64, bk: int = 64, **extra: Any) -> dict[str, Any]:
    return {"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 1,
            "num_warps": 4, "num_stages": 3, **extra}  # fmt: skip


pytestmark = pytest.mark.usefixtures("tuned_tables")


def _write(directory: Path, name: str, table: object) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(json.dumps(table), encoding="utf-8")
    return path


def test_file_names_are_vllms() -> None:
    assert tuned.table_key(OP, "triton", DEV, (8, 14336), ()).file_name() == BF16_NAME
    fp8 = tuned.table_key(OP, "triton", DEV, (256, 2048), FP8)
    assert fp8.file_name() == FP8_NAME
    assert tuned.table_key(OP, "triton", DEV, (8, 7168), F32).file_name().endswith(",dtype=float32.json")
    for key in (fp8, tuned.table_key(OP, "triton", DEV, (8, 14336), ())):
        assert tuned.TableKey.parse(OP, key.file_name()) == key
    assert tuned.TableKey.parse(OP, FP8_NAME.replace("[128,128]", "[128, 128]")) == fp8  # SGLang's
    assert tuned.table_key(OP, "triton", DEV, (8, 14336)) == tuned.table_key(
        OP, "triton", DEV, (8, 14336), ()
    )


@pytest.mark.parametrize(
    "name",
    [
        f"N=4096,K=7168,device_name={DEV},dtype=fp8_w8a8,block_shape=[128,128].json",  # a GEMM table
        f"E=8,N=14336,device_name={DEV},dtype=int8_w8a16,per_channel_quant=True.json",
        "E=8,N=14336.json",
    ],
)
def test_other_files_are_not_moe_tables(name: str) -> None:
    with pytest.raises(ValueError):
        tuned.TableKey.parse(OP, name)


def test_a_gemm_reads_no_moe_table() -> None:
    with pytest.raises(ValueError, match="lacks integer N, K"):
        tuned.TableKey.parse("gemm.w8a8_block_fp8_matmul", FP8_NAME)


def test_each_form_reads_its_own_file_from_a_vllm_folder(tuned_user_dir: Path) -> None:
    _write(
        tuned_user_dir,
        BF16_NAME,
        {"1": _entry(bn=32), "64": _entry(bm=64, bn=128), "1024": _entry(bm=128, bn=256)},
    )
    _write(
        tuned_user_dir, BF16_NAME.replace(".json", ",dtype=fp8_w8a8.json"), {"1": _entry(bn=16)}
    )  # per tensor
    _write(tuned_user_dir, BF16_NAME.replace(".json", ",dtype=int8_w8a16.json"), {"1": _entry(bn=16)})
    _write(tuned_user_dir, BF16_NAME.replace(".json", ",dtype=float32.json"), {"1": _entry(bk=32, bn=128)})
    _write(tuned_user_dir, FP8_NAME, {"1": _entry(bk=128, bn=256), "256": _entry(bm=64, bk=128)})
    _write(
        tuned_user_dir,
        f"N=4096,K=7168,device_name={DEV},dtype=fp8_w8a8,block_shape=[128,128].json",
        {"1": {}},
    )
    # nearest M, as vLLM
    assert tuned.lookup(OP, "triton", DEV, (8, 14336), 1, ())["BLOCK_SIZE_N"] == 32
    assert tuned.lookup(OP, "triton", DEV, (8, 14336), 40, ())["BLOCK_SIZE_N"] == 128
    assert tuned.lookup(OP, "triton", DEV, (8, 14336), 900, ())["BLOCK_SIZE_N"] == 256
    assert tuned.lookup(OP, "triton", DEV, (8, 14336), 3, F32)["BLOCK_SIZE_K"] == 32
    assert tuned.lookup(OP, "triton", DEV, (256, 2048), 2, FP8)["BLOCK_SIZE_N"] == 256
    assert tuned.lookup(OP, "triton", DEV, (256, 2048), 200, FP8)["BLOCK_SIZE_M"] == 64
    assert tuned.source(OP, "triton", DEV, (256, 2048), 200, FP8).endswith(FP8_NAME)
    # another form, shape or device: the default
    for shape, tags in (((8, 14336), FP8), ((256, 2048), ()), ((8, 4096), ())):
        expected = tuned.default_config(OP, "triton", 1, shape, tags)
        assert dict(tuned.lookup(OP, "triton", DEV, shape, 1, tags)) == expected
    assert tuned.source(OP, "triton", "NVIDIA_H100", (8, 14336), 1, ()) == "default"


def test_the_op_subfolder_comes_first(tuned_user_dir: Path) -> None:
    _write(tuned_user_dir, FP8_NAME, {"1": _entry(bk=128, bn=32)})
    _write(tuned_user_dir / OP, FP8_NAME, {"1": _entry(bk=128, bn=128)})
    assert tuned.lookup(OP, "triton", DEV, (256, 2048), 1, FP8)["BLOCK_SIZE_N"] == 128


def test_known_extras_are_read_and_ignored(tuned_user_dir: Path) -> None:
    extras = {"SPLIT_K": 1, "kpack": 2, "matrix_instr_nonkdim": 16, "waves_per_eu": 0, "USE_TMA": False}
    _write(tuned_user_dir, BF16_NAME, {"1": _entry(bn=32, **extras)})
    assert tuned.lookup(OP, "triton", DEV, (8, 14336), 1, ())["BLOCK_SIZE_N"] == 32


@pytest.mark.parametrize(
    ("name", "entry", "reason"),
    [
        (FP8_NAME, _entry(bk=64), "BLOCK_SIZE_K=64 .must be 128"),
        (BF16_NAME, _entry(bk=512), "BLOCK_SIZE_K=512 .a power of two"),
        (BF16_NAME, _entry(bk=48), "BLOCK_SIZE_K=48"),
        (BF16_NAME, _entry(bm=8), "BLOCK_SIZE_M=8"),
        (BF16_NAME, _entry(EVEN_K=1), "unknown key.*EVEN_K"),
        (BF16_NAME, _entry(USE_TMA=1), "USE_TMA=1 is not a bool"),
        (BF16_NAME, _entry(kpack="2"), "kpack='2' is not an integer"),
        (BF16_NAME, {"BLOCK_SIZE_M": 16}, "missing BLOCK_SIZE_N"),
    ],
)
def test_bad_user_file_warns_and_is_skipped(
    tuned_user_dir: Path, name: str, entry: dict[str, Any], reason: str
) -> None:
    tags = FP8 if "fp8" in name else ()
    shape = (256, 2048) if tags else (8, 14336)
    path = _write(tuned_user_dir, name, {"1": entry})
    with pytest.warns(tuned.TunedConfigWarning, match=reason) as record:
        config = tuned.lookup(OP, "triton", DEV, shape, 4, tags)
    assert str(path) in str(record[0].message)
    assert dict(config) == tuned.default_config(OP, "triton", 4, shape, tags)


def test_bf16_takes_any_power_of_two_k_step(tuned_user_dir: Path) -> None:
    _write(tuned_user_dir, BF16_NAME, {"1": _entry(bk=256), "64": _entry(bk=16)})
    assert tuned.lookup(OP, "triton", DEV, (8, 14336), 1, ())["BLOCK_SIZE_K"] == 256
    assert tuned.lookup(OP, "triton", DEV, (8, 14336), 64, ())["BLOCK_SIZE_K"] == 16


@pytest.mark.parametrize("tags", [(), F32, FP8], ids=["bf16", "fp32", "fp8"])
@pytest.mark.parametrize("m", [1, 16, 32, 33, 128, 129, 1024, 1025, 100_000])
def test_default_heuristic(tags: tuple[tuple[str, str], ...], m: int) -> None:
    config = tuned.default_config(OP, "triton", m, (8, 14336), tags)
    assert tuned.validate_entry(OP, "triton", config, tags) == []
    if m == 1:  # one token: the decode path (a GEMV per slot), its own K step
        assert config["DECODE"] == 1
        assert config["BLOCK_SIZE_K"] == {(): 256, F32: 128, FP8: 128}[tags]
        return
    assert "DECODE" not in config
    assert config["BLOCK_SIZE_K"] == {(): 64, F32: 32, FP8: 128}[tags]
    if m <= 32:
        assert (config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"]) == (16, 64)
    if m > 1024:
        assert (config["BLOCK_SIZE_M"], config["BLOCK_SIZE_N"], config["num_warps"]) == (128, 128, 8)
    smaller = tuned.default_config(OP, "triton", max(1, m // 2), (8, 14336), tags)
    assert smaller["BLOCK_SIZE_M"] <= config["BLOCK_SIZE_M"]  # tiles never grow as M shrinks


def test_kernel_problem_and_tags() -> None:
    torch = pytest.importorskip("torch")
    schema = tuned.SCHEMAS[OP]
    meta = {"device": "meta"}
    hidden = torch.empty(5, 7168, dtype=torch.bfloat16, **meta)
    w1 = torch.empty(8, 4096, 7168, dtype=torch.bfloat16, **meta)
    w2 = torch.empty(8, 7168, 2048, dtype=torch.bfloat16, **meta)
    assert schema.kernel_problem is not None and schema.kernel_tags is not None
    assert schema.kernel_problem(hidden, hidden, w1, w2) == ((8, 2048), 5)
    assert schema.kernel_tags(hidden, hidden, w1, w2) == ()
    assert schema.kernel_tags(hidden, hidden, w1.to(torch.float8_e4m3fn), w2) == FP8
    assert schema.kernel_tags(hidden.float(), hidden.float(), w1.float(), w2.float()) == F32


def test_the_triton_launcher_takes_the_tuned_entry(
    tuned_user_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch = pytest.importorskip("torch")
    from opmux.kernels.ops.moe import fused_experts_triton as fe

    seen: list[Any] = []
    monkeypatch.setattr(fe, "launch_fused_experts", lambda *args, **kw: seen.append(args[-1]))
    _write(tuned_user_dir, "E=3,N=16,device_name=cpu.json", {"4": _entry(bm=32, bn=16, bk=32)})
    hidden = torch.zeros(4, 32, dtype=torch.bfloat16)
    w1 = torch.zeros(3, 32, 32, dtype=torch.bfloat16)
    w2 = torch.zeros(3, 32, 16, dtype=torch.bfloat16)
    ids = torch.zeros(4, 2, dtype=torch.int32)
    empty = torch.empty(0)
    fe.fused_experts(
        hidden, hidden, w1, w2, ids.float(), ids, empty, empty, empty.int(), "silu", False, False
    )
    assert seen and seen[0]["BLOCK_SIZE_M"] == 32
    h32 = hidden.float()
    fe.fused_experts(
        h32, h32, w1.float(), w2.float(), ids.float(), ids, empty, empty, empty, "silu", False, False
    )
    assert dict(seen[1]) == tuned.default_config(OP, "triton", 4, (3, 16), F32)  # the bf16 file is not fp32's


def test_the_shipped_h200_tables() -> None:
    """The wheel's tables for the four models' experts: valid, one per (E, N, form), found by lookup."""
    shipped = {
        ((8, 14336), ()),
        ((128, 768), ()),
        ((128, 1536), ()),
        ((256, 2048), FP8),
    }
    for shape, tags in shipped:
        key = tuned.table_key(OP, "triton", "NVIDIA_H200", shape, tags)
        path = tuned.shipped_dir(OP) / key.file_name()
        table = tuned.read_table(path, key)
        assert {1, 8, 64, 256, 1024, 4096, 16384} <= set(table)
        assert dict(tuned.lookup(OP, "triton", "NVIDIA_H200", shape, 100, tags)) == dict(table[64])
        assert tuned.source(OP, "triton", "NVIDIA_H200", shape, tags=tags) == str(path)


@pytest.mark.parametrize("m", [1, 2])
def test_deepseek_fp8_decode_takes_the_tensor_core_decode_entry(
    m: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the default call does on the H200 at decode sizes with the shipped tables: the fp8
    select table (its first entry M = 64) does not reach M = 1 or 2 (SELECT_REACH), so the declared
    CUDA order puts Triton first, and Triton's table gives its M = 1 entry: the two-launch decode
    path (``DECODE``). Shape and M as the op's own problem function reads them (meta tensors)."""
    import torch

    from opmux.kernels import measured
    from opmux.kernels.ops.moe import fused_experts_triton as fe

    monkeypatch.setattr(tuned, "device_name", lambda device: "NVIDIA_H200")
    e, n, k, topk = 256, 2048, 7168, 8
    meta = dict(device="meta")
    hidden = torch.empty(m, k, dtype=torch.bfloat16, **meta)
    w1 = torch.empty(e, 2 * n, k, dtype=torch.float8_e4m3fn, **meta)
    w2 = torch.empty(e, k, n, dtype=torch.float8_e4m3fn, **meta)
    s1, s2 = torch.empty(e, 2 * n // 128, k // 128, **meta), torch.empty(e, k // 128, n // 128, **meta)
    tw, ti = torch.empty(m, topk, **meta), torch.empty(m, topk, dtype=torch.int32, **meta)
    assert measured.preferred(OP, "cuda", (hidden, w1, w2, tw, ti), {"w1_scale": s1, "w2_scale": s2}) is None
    out, no_map = torch.empty_like(hidden), torch.empty(0, dtype=torch.int32, **meta)
    args = (out, hidden, w1, w2, tw, ti, s1, s2, no_map)
    shape, rows = fe._PROBLEM(*args)
    config = tuned.lookup(OP, "triton", "NVIDIA_H200", shape, rows, fe._TAGS(*args))
    assert (shape, rows) == ((e, n), m) and config.get("DECODE") == 1, dict(config)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ({"UP_ROWS": 4, "DOWN_ROWS": 8}, None),
        ({"UP_ROWS": 0, "DOWN_ROWS": 0}, None),
        ({"UP_ROWS": 8, "DOWN_ROWS": 4}, "UP_ROWS=8 (one of 0, 1, 2, 4"),
        ({"UP_ROWS": 2, "DOWN_ROWS": 3}, "DOWN_ROWS=3 (one of 0, 1, 2, 4, 8"),
        ({"UP_ROWS": True, "DOWN_ROWS": 1}, "UP_ROWS=True"),
        ({"UP_ROWS": 4.0, "DOWN_ROWS": 8}, "UP_ROWS=4.0"),
        ({"UP_ROWS": 1}, "missing DOWN_ROWS"),
        ({"UP_ROWS": 1, "DOWN_ROWS": 1, "num_warps": 4}, "unknown key(s) num_warps"),
    ],
)
def test_the_native_decode_entries(entry: dict[str, Any], problem: str | None) -> None:
    """``backend=cuda`` tables hold the native decode kernels' columns per warp (up, down): the
    unit's instantiations or 0 (its own choice); anything else is named."""
    found = tuned.validate_entry(OP, "cuda", entry, FP8)
    assert found == [] if problem is None else any(problem in p for p in found), found


@pytest.mark.parametrize(("m", "split"), [(1, (0, 0)), (3, (0, 0)), (4, (4, 4)), (64, (4, 4))])
def test_the_native_decode_default(m: int, split: tuple[int, int]) -> None:
    config = tuned.default_config(OP, "cuda", m, (256, 2048), FP8)
    assert (config["UP_ROWS"], config["DOWN_ROWS"]) == split
    assert tuned.validate_entry(OP, "cuda", config, FP8) == []


def test_the_native_decode_backend_takes_its_table(
    tuned_user_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The backend's launch reads its form's ``backend=cuda`` table of the device (nearest M) and
    the default where none speaks."""
    torch = pytest.importorskip("torch")
    from opmux.kernels.ops.moe import fused_experts_cuda as fc

    monkeypatch.setattr(tuned, "device_name", lambda device: DEV)
    name = f"E=256,N=2048,device_name={DEV},dtype=fp8_w8a8,block_shape=[128,128],backend=cuda.json"
    _write(tuned_user_dir, name, {"1": {"UP_ROWS": 2, "DOWN_ROWS": 8}, "8": {"UP_ROWS": 1, "DOWN_ROWS": 2}})
    meta = {"device": "meta"}
    w1 = torch.empty(256, 4096, 7168, dtype=torch.float8_e4m3fn, **meta)
    w2 = torch.empty(256, 7168, 2048, dtype=torch.float8_e4m3fn, **meta)
    for m, want in ((1, (2, 8)), (2, (2, 8)), (6, (1, 2)), (32, (1, 2)), (64, (4, 4))):
        hidden = torch.empty(m, 7168, dtype=torch.bfloat16, **meta)
        assert fc.tuned_split(hidden, w1, w2) == want, m
    hidden = torch.empty(1, 7168, dtype=torch.bfloat16, **meta)  # the bf16 form has no table here
    assert fc.tuned_split(hidden, w1.bfloat16(), w2.bfloat16()) == (0, 0)
