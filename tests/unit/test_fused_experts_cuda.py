"""moe.fused_experts' native CUDA decode backend (``cuda``, ops/moe/fused_experts_cuda.py) on a
machine without a GPU: its predicate's reasons, its shared-memory sizes, its declaration after
Triton and CUTLASS, the parity harness's cells for it, and the unit compiled for sm_90a and sm_80
with its host checks refusing bad arguments (OPMUX_TEST_NVCC=1). Its numbers are checked on a
GPU: tests/parity/test_moe_grid.py (the serving grid's decode sizes, every columns-per-warp
choice, bad ids under compute-sanitizer)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from opmux.kernels import registry
from opmux.kernels.errors import BackendUnavailable
from opmux.kernels.ops.moe import fused_experts_cuda as fc
from opmux.kernels.selector import Facts, select

OP = "moe.fused_experts"
_OK: dict[str, Any] = {
    "device": "cuda",
    "capability": (9, 0),
    "w1_dtype": "float8_e4m3fn",
    "hidden_dtype": "bfloat16",
    "tokens": 1,
    "topk": 8,
    "n": 2048,
    "k": 7168,
    "aligned": True,
    "smem_optin": 227 * 1024,
}


def test_refusal_reasons() -> None:
    assert fc.refusal(**_OK) is None  # DeepSeek-V3 fp8 at one token
    assert fc.refusal(**{**_OK, "w1_dtype": "bfloat16", "n": 768, "k": 2048}) is None  # Qwen3-30B-A3B
    assert fc.refusal(**{**_OK, "tokens": fc.MAX_TOKENS}) is None
    for change, words in (
        ({"device": "cpu"}, "not cpu"),
        ({"capability": (7, 5)}, "sm_75"),
        ({"capability": None}, "unknown"),
        ({"hidden_dtype": "float64", "w1_dtype": "float64"}, "not float64"),
        ({"hidden_dtype": "float32", "w1_dtype": "float32"}, "Triton backend runs float32"),
        ({"w1_dtype": "float16"}, "not float16"),
        ({"tokens": fc.MAX_TOKENS + 1}, f"at most {fc.MAX_TOKENS} tokens"),
        ({"topk": fc.MAX_TOPK + 1}, f"topk up to {fc.MAX_TOPK}"),
        ({"k": 7160}, "multiples of 16"),
        ({"n": 2040}, "multiples of 16"),
        ({"w1_dtype": "bfloat16", "k": 7164}, "multiples of 8"),
        ({"aligned": False}, "16-byte aligned"),
        ({"topk": 32}, "shared memory"),
    ):
        why = fc.refusal(**{**_OK, **change})
        assert why is not None and words in why, (change, why)


def test_shared_memory_sizes() -> None:
    # the unit's: up stages K floats + a scale per 128 (fp8), down the token's topk rows
    assert fc.smem_bytes(fp8=True, elem=1, k=7168, n=2048, topk=8) == (
        7168 * 4 + 56 * 4,
        8 * (2048 * 4 + 64),
    )
    assert fc.smem_bytes(fp8=False, elem=2, k=2048, n=768, topk=8) == (4096, 8 * 768 * 2)
    # Mixtral bf16 (topk 2 x 14336) fits an H100 / H200's 227 KB
    assert fc.refusal(**{**_OK, "w1_dtype": "bfloat16", "n": 14336, "k": 4096, "topk": 2}) is None


def _call(m: int = 2, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, ...]:
    hidden = torch.randn(m, 64).to(dtype)
    w1 = torch.randn(4, 64, 64).to(dtype)
    w2 = torch.randn(4, 64, 32).to(dtype)
    tw = torch.rand(m, 2)
    ids = torch.randint(0, 4, (m, 2), dtype=torch.int32)
    return hidden, w1, w2, tw, ids


def test_supports_facts_on_cpu_tensors() -> None:
    why = fc.supports(*_call())
    assert why is not None and "not cpu" in why
    assert fc.supports(None, None, None) is None  # not tensors: the contract speaks
    w = torch.randn(4, 64, 68, dtype=torch.bfloat16)
    assert fc._aligned(w[..., :64]) is False  # 136-byte rows: strides not of whole 16-byte units
    assert fc._aligned(torch.randn(4, 64, 72, dtype=torch.bfloat16)[..., 8:]) is True  # 144-byte rows, +16 B
    assert fc._aligned(torch.randn(4, 64, 64, dtype=torch.bfloat16))


def test_forced_kernel_call_refuses_with_the_reason() -> None:
    hidden, w1, w2, tw, ids = _call()
    empty = torch.empty(0)
    with pytest.raises(BackendUnavailable, match="not cpu"):
        fc.fused_experts(
            torch.empty_like(hidden), hidden, w1, w2, tw, ids, empty, empty,
            torch.empty(0, dtype=torch.int32), "silu", False, False,
        )  # fmt: skip


def test_declared_after_triton_and_cutlass_on_cuda_only() -> None:
    spec = registry.get(OP)
    backend = spec.backend(fc.BACKEND)
    assert backend.requires.devices == ("cuda",) and backend.requires.sm_min == 80
    assert backend.requires.dtypes == ("float16", "bfloat16")
    assert backend.requires.predicate == "opmux.kernels.ops.moe.fused_experts_cuda:supports"
    order = dict(spec.priority)
    assert order["cuda"] == ("triton", "cutlass", "cuda", "torch")  # first only where a select table says
    assert "cuda" not in order["cpu"]


def test_default_on_an_h200_stays_triton_unless_forced() -> None:
    spec = registry.get(OP)
    h200 = Facts("cuda", "sm_90a", frozenset({"cuda", "triton", "cuda_jit", "aot_cuda", "nvcc"}))
    assert select(spec, h200, dtype="bfloat16").chosen == "triton"
    assert select(spec, h200, dtype="bfloat16", preferred=(fc.BACKEND, "forced")).chosen == fc.BACKEND
    refused = select(
        spec, h200, dtype="bfloat16", arg_rejections={fc.BACKEND: "tokens"}, preferred=(fc.BACKEND, "forced")
    )
    assert refused.chosen != fc.BACKEND


def test_parity_harness_has_its_cuda_cells() -> None:
    """tests/parity/test_parity.py's cells: the backend on every float dtype, run on CUDA only
    (float32 reported as not supported)."""
    path = Path(__file__).resolve().parents[1] / "parity" / "test_parity.py"
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location("_parity_cells_moe", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(path.parent))
    cells = {(o, b, d) for o, b, d in mod.CELLS if o == OP and b == fc.BACKEND}
    assert cells == {(OP, fc.BACKEND, d) for d in ("float32", "float16", "bfloat16")}


@pytest.mark.slow
def test_unit_compiles_and_checks_its_arguments(nvcc_unit: Any) -> None:
    """The unit builds for sm_90a and sm_80 and exports both kernels' entries; its host checks
    refuse arguments that would read out of bounds (they run before any CUDA call, so CPU tensors
    exercise them without a GPU)."""
    mod = nvcc_unit("moe_decode_cuda")
    up, down = mod["moe_decode_up_cuda"], mod["moe_decode_down_cuda"]
    hidden, w1, w2, tw, ids = _call()
    act = torch.empty(4, 32, dtype=torch.bfloat16)
    out = torch.empty(2, 64, dtype=torch.bfloat16)
    none = torch.empty(0)
    emap = torch.empty(0, dtype=torch.int32)
    up_names = ("act", "x", "xs", "w1", "w1_scale", "topk_weights", "topk_ids", "expert_map", "activation")
    up_names += ("mul_weight", "vllm_rounding", "alpha", "limit", "rows_per_warp", "enable_pdl")
    up_base = [act, hidden, none, w1, none, tw, ids, emap, 0, False, False, 1.702, 7.0, 0, False]
    down_names = ("out", "a", "as", "w2", "w2_scale", "topk_weights", "topk_ids", "expert_map", "mul_weight")
    down_names += ("rows_per_warp", "enable_pdl")
    down_base = [out, act, none, w2, none, tw, ids, emap, True, 0, False]

    def call(fn: Any, names: tuple[str, ...], base: list[Any], **change: Any) -> None:
        args = list(base)
        for k, v in change.items():
            args[names.index(k)] = v
        fn(*args)

    def call_up(**change: Any) -> None:
        call(up, up_names, up_base, **change)

    def call_down(**change: Any) -> None:
        call(down, down_names, down_base, **change)

    for fn in (call_up, call_down):
        with pytest.raises(ValueError, match="cuda tensors"):
            fn()
    # every check below comes before the device check, or names the argument first
    with pytest.raises(ValueError, match="act must be 2-D"):
        call_up(act=act[0])
    with pytest.raises(ValueError, match="w1 must be 3-D"):
        call_up(w1=w1[0])
    with pytest.raises(ValueError, match="w2 must be 3-D"):
        call_down(w2=w2[0])
    with pytest.raises(ValueError, match="out must be 2-D"):
        call_down(out=out[0])
    with pytest.raises(ValueError, match="act is float32; the decode kernels take float16 or bfloat16"):
        call_up(act=act.float())


def test_the_h100_tables_take_it_at_decode_sizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped H100 select tables (bench_moe.py, docs/benchmarks/moe_decode_cuda_h100.md) put
    the native decode backend first where it beat Triton: DeepSeek-V3 fp8 at 1 to 8 tokens, the
    bf16 shapes at 4 to 8, Mixtral-8x7B at 1 and 4; Triton elsewhere (Qwen3-30B-A3B's 16 held
    back: its entry also serves 17 to 32); other GPUs keep the declared order (Triton first)."""
    from types import SimpleNamespace

    from opmux.kernels import measured, tuned

    def t(*shape: int, dtype: str = "torch.bfloat16") -> Any:
        return SimpleNamespace(shape=shape, dtype=dtype)

    monkeypatch.setattr(tuned, "device_name", lambda device: "NVIDIA_H100_80GB_HBM3")
    fp8_w1, w2 = t(256, 4096, 7168, dtype="torch.float8_e4m3fn"), t(256, 7168, 2048)
    for m, want in ((1, "cuda"), (8, "cuda"), (16, "triton"), (64, "triton")):
        pref = measured.preferred(OP, None, (t(m, 7168), fp8_w1, w2), {})
        assert pref is not None and pref[0] == want, (m, pref)
    qwen = (t(128, 1536, 2048), t(128, 2048, 768))  # Qwen3-30B-A3B: E=128, N=768
    assert measured.preferred(OP, None, (t(1, 2048), *qwen), {})[0] == "triton"  # type: ignore[index]
    assert measured.preferred(OP, None, (t(8, 2048), *qwen), {})[0] == "cuda"  # type: ignore[index]
    assert measured.preferred(OP, None, (t(24, 2048), *qwen), {})[0] == "triton"  # type: ignore[index]
    monkeypatch.setattr(tuned, "device_name", lambda device: "NVIDIA_A100-SXM4-80GB")
    assert measured.preferred(OP, None, (t(1, 7168), fp8_w1, w2), {}) is None


def test_the_h100_split_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shipped H100 ``backend=cuda`` tables (the tuner's, docs/benchmarks/moe_decode_cuda_h100.md)
    give the native kernels their measured columns per warp, per form: DeepSeek-V3 fp8 at two
    tokens 4 x 8 (the unit's own choice there ran 1.41x its time); a GPU without tables gets the
    default rule."""
    from opmux.kernels import tuned

    meta = {"device": "meta"}
    w1 = torch.empty(256, 4096, 7168, dtype=torch.float8_e4m3fn, **meta)
    w2 = torch.empty(256, 7168, 2048, dtype=torch.float8_e4m3fn, **meta)
    x = {m: torch.empty(m, 7168, dtype=torch.bfloat16, **meta) for m in (1, 2, 64)}
    monkeypatch.setattr(tuned, "device_name", lambda device: "NVIDIA_H100_80GB_HBM3")
    assert fc.tuned_split(x[2], w1, w2) == (4, 8)
    assert fc.tuned_split(x[2], w1.bfloat16(), w2.bfloat16()) == (1, 8)  # the bf16 form's own table
    monkeypatch.setattr(tuned, "device_name", lambda device: "NVIDIA_A100-SXM4-80GB")
    assert fc.tuned_split(x[1], w1, w2) == (0, 0) and fc.tuned_split(x[64], w1, w2) == (4, 4)
