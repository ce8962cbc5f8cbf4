"""The CUTLASS backend of moe.fused_experts without a GPU: its chunk plan and config choice, the
reasons it refuses a call (CPU, bf16 weights, shapes), its place in the CUDA priority and the
measured selection per form; the sm_90a compile of its unit when OPMUX_TEST_NVCC=1 (minutes)."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from opmux.kernels import _env, measured, registry, tuned
from opmux.kernels.errors import BackendUnavailable, CallRefused
from opmux.kernels.ops.moe import fused_experts_cutlass as fc
from opmux.kernels.selector import Facts, select

OP = "moe.fused_experts"
FP8_TAGS = tuned.FP8_BLOCK_TAGS


@pytest.mark.parametrize(
    ("k", "n2", "plan"),
    [
        (7168, 4096, ((0, 3584), (3584, 3584))),  # DeepSeek-V3: two chunks of 3584 <= 2N
        (4096, 4096, ((0, 4096),)),
        (2048, 1536, ((0, 1024), (1024, 1024))),  # Qwen3-235B-like
        (128, 256, ((0, 128),)),
        (640, 256, ((0, 256), (256, 256), (512, 128))),
    ],
)
def test_chunk_plan(k: int, n2: int, plan: tuple[tuple[int, int], ...]) -> None:
    got = fc.chunk_plan(k, n2)
    assert got == plan
    assert sum(w for _, w in got) == k and all(w <= n2 and c0 % 128 == 0 for c0, w in got)
    assert [c0 for c0, _ in got] == [sum(w for _, w in got[:i]) for i in range(len(got))]


@pytest.mark.parametrize(("k", "n2"), [(7168, 4096), (3072, 1024), (128, 128), (12288, 256), (1280, 768)])
def test_chunk_plan_fits_the_first_buffer(k: int, n2: int) -> None:
    plan = fc.chunk_plan(k, n2)
    assert len(plan) == -(-k // n2)  # as few chunks as fit
    assert max(w for _, w in plan) - min(w for _, w in plan) <= 128  # near-equal widths


def test_chunk_plan_refuses_partial_blocks() -> None:
    with pytest.raises(ValueError, match="multiples of 128"):
        fc.chunk_plan(7000, 4096)


def test_default_config_by_rows_per_expert() -> None:
    assert fc.default_config(1 * 8, 256) == fc.SWAP_AB  # decode
    assert fc.default_config(1024 * 8, 256) == fc.SWAP_AB  # 32 rows per expert
    assert fc.default_config(4096 * 8, 256) == fc.COOPERATIVE  # 128 rows per expert
    assert fc.default_config(16384 * 8, 256) == fc.COOPERATIVE


_OK = {
    "device": "cuda",
    "capability": (9, 0),
    "w1_dtype": "float8_e4m3fn",
    "hidden_dtype": "bfloat16",
    "experts": 256,
    "n": 2048,
    "k": 7168,
    "contiguous": True,
}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({}, None),
        ({"hidden_dtype": "float16"}, None),
        ({"device": "cpu"}, "runs on CUDA tensors, not cpu"),
        ({"capability": (10, 0)}, r"sm_90a \(Hopper\) only; this GPU is sm_100"),
        ({"capability": (8, 0)}, "this GPU is sm_80"),
        ({"w1_dtype": "bfloat16"}, "fp8 block-scaled form only .* w1 has dtype bfloat16: the next backend"),
        ({"hidden_dtype": "float32"}, "writes bfloat16 or float16; hidden has dtype float32"),
        ({"n": 2880}, r"K and N multiples of 128 \(K=7168, N=2880\)"),
        ({"k": 7000}, "multiples of 128"),
        ({"n": 1024}, r"K=7168 > 4N=4096"),
        ({"experts": 5000}, "at most 4096 local experts"),
        ({"contiguous": False}, "contiguous w1, w2"),
    ],
)
def test_refusal_reasons(change: dict[str, Any], reason: str | None) -> None:
    got = fc.refusal(**{**_OK, **change})
    if reason is None:
        assert got is None
    else:
        assert got is not None
        assert re.search(reason, got), got


def _fp8_call(m: int = 3, e: int = 4, n: int = 128, k: int = 256, topk: int = 2) -> tuple[Any, ...]:
    hidden = torch.randn(m, k, dtype=torch.bfloat16)
    w1 = torch.randn(e, 2 * n, k).to(torch.float8_e4m3fn)
    w2 = torch.randn(e, k, n).to(torch.float8_e4m3fn)
    tw = torch.rand(m, topk)
    ids = torch.randint(0, e, (m, topk), dtype=torch.int32)
    s1 = torch.rand(e, 2 * n // 128, k // 128)
    s2 = torch.rand(e, k // 128, n // 128)
    return hidden, w1, w2, tw, ids, s1, s2


def test_supports_on_cpu_tensors_names_the_device() -> None:
    hidden, w1, w2, tw, ids, s1, s2 = _fp8_call()
    why = fc.supports(hidden, w1, w2, tw, ids, w1_scale=s1, w2_scale=s2)
    assert why is not None and "not cpu" in why
    # not tensors: the contract speaks, not the predicate
    assert fc.supports(None, None, None) is None


def test_forced_kernel_call_refuses_with_the_reason() -> None:
    hidden, w1, w2, tw, ids, s1, s2 = _fp8_call()
    out = torch.empty_like(hidden)
    empty = torch.empty(0, dtype=torch.int32)
    with pytest.raises(CallRefused, match="not cpu"):
        fc.fused_experts(out, hidden, w1, w2, tw, ids, s1, s2, empty, "silu", False, False)
    bf16 = torch.randn(4, 256, 256, dtype=torch.bfloat16)
    assert fc.refusal(**{**_OK, "w1_dtype": str(bf16.dtype).removeprefix("torch.")}) is not None


def test_declared_after_triton_on_cuda_only() -> None:
    spec = registry.get(OP)
    backend = spec.backend("cutlass")
    assert backend.requires.devices == ("cuda",) and (backend.requires.sm_min, backend.requires.sm_max) == (
        90,
        90,
    )
    assert backend.requires.predicate == "opmux.kernels.ops.moe.fused_experts_cutlass:supports"
    order = dict(spec.priority)
    assert (
        order["cuda"][:2] == ("triton", "cutlass") and order["cuda"][-1] == "torch"
    )  # Triton first until measured
    assert "cutlass" not in order["cpu"]


H200 = Facts("cuda", "sm_90a", frozenset({"cuda", "triton", "cuda_jit", "aot_cuda", "nvcc"}))


def test_refused_call_falls_to_triton() -> None:
    spec = registry.get(OP)
    why = fc.refusal(**{**_OK, "w1_dtype": "bfloat16"})
    assert why is not None
    sel = select(
        spec, H200, dtype="bfloat16", arg_rejections={"cutlass": why}, preferred=("cutlass", "measured")
    )
    assert sel.chosen == "triton"
    assert any(
        d.backend == "cutlass" and not d.accepted and "fp8 block-scaled" in d.detail for d in sel.decisions
    )


DEV = "OPMUX_TEST_GPU"


@pytest.fixture
def tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(tuned, "device_name", lambda device: DEV)
    with _env.scope(OPMUX_TUNED_CONFIG_DIR=str(tmp_path)):
        tuned.refresh()
        yield tmp_path
    tuned.refresh()


def _t(*shape: int, dtype: str = "torch.bfloat16") -> Any:
    return SimpleNamespace(shape=shape, dtype=dtype)


def test_select_tables_are_per_form(tables: Path) -> None:
    name = tuned.table_key(OP, "select", DEV, (256, 2048), FP8_TAGS).file_name()
    assert name.endswith("dtype=fp8_w8a8,block_shape=[128,128],backend=select.json")
    (tables / name).write_text(json.dumps({"16": {"backend": "triton"}, "4096": {"backend": "cutlass"}}))
    tuned.refresh()
    assert measured.measured_op(OP)
    hidden = _t(4096, 7168)
    w2 = _t(256, 7168, 2048)
    fp8 = measured.preferred(OP, None, (hidden, _t(256, 4096, 7168, dtype="torch.float8_e4m3fn"), w2), {})
    assert fp8 is not None and fp8[0] == "cutlass" and "M=4096, E=256, N=2048" in fp8[1]
    small = measured.preferred(
        OP, None, (_t(16, 7168), _t(256, 4096, 7168, dtype="torch.float8_e4m3fn"), w2), {}
    )
    assert small is not None and small[0] == "triton"
    # the bf16 form has no table: the declared priority decides
    assert measured.preferred(OP, None, (hidden, _t(256, 4096, 7168), w2), {}) is None


def test_no_table_no_preference(tables: Path) -> None:
    args = (_t(4096, 7168), _t(256, 4096, 7168, dtype="torch.float8_e4m3fn"), _t(256, 7168, 2048))
    assert measured.preferred(OP, None, args, {}) is None


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("OPMUX_TEST_NVCC") != "1", reason="set OPMUX_TEST_NVCC=1: a minute or more of nvcc"
)
def test_unit_compiles_for_sm90a(tmp_path: Path) -> None:
    """The unit builds clean for sm_90a (76 s on a 2-core machine) and exports its functions."""
    from opmux.kernels.jit import KERNEL_PATH
    from opmux.kernels.jit.compile import build, toolchain

    try:
        toolchain.find_nvcc()
        toolchain.find_cutlass()
    except toolchain.ToolchainNotFound as exc:
        pytest.skip(str(exc))
    src = Path(KERNEL_PATH) / "csrc" / "moe_grouped_cuda.cu"
    out = tmp_path / "moe_grouped_cuda.so"
    start = time.monotonic()
    build.build_shared_library(
        out,
        sources=[src],
        device="cuda",
        archs=["sm_90a"],
        include_dirs=[Path(KERNEL_PATH) / "include", src.parent],
    )
    assert out.is_file(), f"no library after {time.monotonic() - start:.0f} s"
    import tvm_ffi

    mod = tvm_ffi.load_module(str(out))
    assert mod["moe_grouped_configs"]() == 2
    for name in fc._FUNCTIONS:
        assert mod[f"moe_grouped_{name}_cuda"] is not None


def test_a_library_without_sm90a_code_is_unavailable_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # the unit's refusal (an image without sm_90a) becomes BackendUnavailable, so the dispatch
    # runs the next backend; any other runtime error still propagates
    hidden, w1, w2, tw, ids, s1, s2 = _fp8_call()
    out = torch.empty_like(hidden)
    empty = torch.empty(0, dtype=torch.int32)
    monkeypatch.setattr(fc, "supports", lambda *a, **k: None)

    def no_image(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError(
            "opmux.moe.fused_experts: the CUTLASS grouped GEMM needs sm_90a (Hopper) code, but this "
            "library was built without an sm_90a image (compile with arch sm_90a)"
        )

    monkeypatch.setattr(fc, "launch_fused_experts", no_image)
    with pytest.raises(BackendUnavailable, match="without an sm_90a image"):
        fc.fused_experts(out, hidden, w1, w2, tw, ids, s1, s2, empty, "silu", False, False)

    def other(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("an illegal memory access")

    monkeypatch.setattr(fc, "launch_fused_experts", other)
    with pytest.raises(RuntimeError, match="illegal memory access"):
        fc.fused_experts(out, hidden, w1, w2, tw, ids, s1, s2, empty, "silu", False, False)
