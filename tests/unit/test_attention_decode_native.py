"""attention.paged_decode's native CUDA backend (``cuda``, ops/attention/paged_decode_cuda.py) on a
machine without a GPU: its predicate's reasons, its split rule (the Python mirror; against the
unit's own with OPMUX_TEST_NVCC=1), its declaration after Triton, the parity harness's cells for
it, and the unit compiled for sm_90a and sm_80 with its native-ABI checks refusing bad arguments.
Its numbers are checked on a GPU: tests/parity/test_attention_decode_grid.py."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from opmux.kernels import registry
from opmux.kernels.errors import BackendUnavailable
from opmux.kernels.ops.attention import paged_decode_cuda as pc
from opmux.kernels.selector import Facts, select

OP = "attention.paged_decode"
_OK: dict[str, Any] = {
    "device": "cuda",
    "capability": (9, 0),
    "query_dtype": "bfloat16",
    "cache_dtype": "bfloat16",
    "head_dim": 128,
    "aligned": True,
}


def _call(d: int = 64, dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, ...]:
    q = torch.randn(2, 4, d).to(dtype)
    kc = torch.randn(5, 16, 2, d).to(dtype)
    vc = torch.randn(5, 16, 2, d).to(dtype)
    table = torch.arange(4, dtype=torch.int32).reshape(2, 2)
    return q, kc, vc, table, torch.tensor([20, 7], dtype=torch.int32)


def test_refusal_reasons() -> None:
    assert pc.refusal(**_OK) is None
    assert pc.refusal(**{**_OK, "cache_dtype": "float8_e4m3fn"}) is None
    for change, words in (
        ({"device": "cpu"}, "not cpu"),
        ({"capability": (7, 5)}, "sm_75"),
        ({"capability": None}, "unknown"),
        ({"head_dim": 72}, "head dims 64, 80, 96, 128, 256"),
        ({"cache_dtype": "float16"}, "not float16"),
        ({"query_dtype": "float64", "cache_dtype": "float64"}, "not float64"),
        ({"aligned": False}, "16-byte aligned"),
        ({"head_dim": 576, "value_head_dim": 512}, "key head dim 576 and value head dim 512 (MLA)"),
        ({"value_head_dim": 64}, "value head dim 64"),
    ):
        why = pc.refusal(**{**_OK, **change})
        assert why is not None and words in why, (change, why)


def test_supports_reads_the_value_head_dim() -> None:
    """An MLA call (value_cache = key_cache[..., :512] of a 576-dim cache) is refused with its
    reason (the predicate's facts carry the value head dim)."""
    assert pc.refusal(**{**_OK, "value_head_dim": 128}) is None
    why = pc._verdict("cuda", (9, 0), torch.bfloat16, torch.bfloat16, 576, True, 512)
    assert why is not None and "value head dim 512 (MLA)" in why


def test_supports_on_cpu_tensors_names_the_device() -> None:
    why = pc.supports(*_call())
    assert why is not None and "not cpu" in why
    assert pc.supports(None, None, None) is None  # not tensors: the contract speaks


def test_alignment_fact() -> None:
    kc = _call(d=64)[1]
    assert pc._aligned(kc) and pc._aligned(kc.permute(0, 2, 1, 3))  # NHD, and an HND view
    big = torch.randn(5, 16, 2, 72, dtype=torch.bfloat16)
    assert not pc._aligned(big[..., 4:68])  # rows 8 bytes past a 16-byte boundary
    assert not pc._aligned(torch.randn(5, 16, 2, 65, dtype=torch.bfloat16)[..., :64])  # 130-byte rows


def test_forced_kernel_call_refuses_with_the_reason() -> None:
    q, kc, vc, table, lens = _call()
    out = torch.empty_like(q)
    none = torch.empty(0)
    with pytest.raises(BackendUnavailable, match="not cpu"):
        pc.paged_decode(
            out, none, False, q, kc, vc, table, lens, none, False, lens, lens, False, 0.125, 0.0, -1
        )


def test_split_rule() -> None:
    # Llama-3-8B decode (32 / 8 heads, groups of 4: one chunk), 132 SMs
    assert pc.num_splits(1, 32, 8, 4096, 132) == 32  # two waves want 33, 4096 / 128 allows 32
    assert pc.num_splits(1, 32, 8, 1 << 20, 132) == 33
    assert pc.num_splits(64, 32, 8, 4096, 132) == 1  # 512 CTAs already
    assert pc.num_splits(1, 32, 8, 100, 132) == 1  # one split's worth of positions
    assert pc.num_splits(1, 64, 1, 1 << 20, 132) == 33  # MQA: 8 chunks of 8 heads, 8 CTAs a split
    assert pc.num_splits(1, 8, 1, 1 << 20, 132) == 64  # one CTA a split: capped
    assert pc.num_splits(0, 8, 8, 0, 132) == 1
    assert pc.heads_per_cta(1) == 1 and pc.heads_per_cta(3) == 4 and pc.heads_per_cta(12) == 8
    for args in ((1, 8, 8, 10**6, 132), (3, 40, 8, 777, 108), (1000, 64, 4, 10**5, 132)):
        s = pc.num_splits(*args)
        assert 1 <= s <= pc.MAX_SPLITS <= pc.KERNEL_MAX_SPLITS
    # the bound: the table's capacity, or the window's length
    assert pc.context_bound(10, 16, -1) == 160
    assert pc.context_bound(10, 16, 31) == 32
    assert pc.context_bound(10, 16, 1000) == 160


def test_declared_after_triton_on_cuda_only() -> None:
    spec = registry.get(OP)
    backend = spec.backend(pc.BACKEND)
    assert backend.requires.devices == ("cuda",) and backend.requires.sm_min == 80
    assert backend.requires.predicate == "opmux.kernels.ops.attention.paged_decode_cuda:supports"
    order = dict(spec.priority)
    assert order["cuda"][:2] == ("triton", "cuda")  # Triton first until an H200 measures both
    assert "cuda" not in order["cpu"]


def test_default_on_an_h200_stays_triton() -> None:
    spec = registry.get(OP)
    h200 = Facts("cuda", "sm_90a", frozenset({"cuda", "triton", "cuda_jit", "aot_cuda", "nvcc"}))
    assert select(spec, h200, dtype="bfloat16").chosen == "triton"
    forced = select(spec, h200, dtype="bfloat16", preferred=(pc.BACKEND, "forced"))
    assert forced.chosen == pc.BACKEND
    refused = select(
        spec,
        h200,
        dtype="bfloat16",
        arg_rejections={pc.BACKEND: "head dims"},
        preferred=(pc.BACKEND, "forced"),
    )
    assert refused.chosen != pc.BACKEND


def test_parity_harness_has_its_cuda_cells() -> None:
    """tests/parity/test_parity.py's cells: the backend on every float dtype, run on CUDA only
    (the CPU harness reports them n/a)."""
    path = Path(__file__).resolve().parents[1] / "parity" / "test_parity.py"
    sys.path.insert(0, str(path.parent))
    try:
        spec = importlib.util.spec_from_file_location("_parity_cells", path)
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
    finally:
        sys.path.remove(str(path.parent))
    cells = {(o, b, d) for o, b, d in mod.CELLS if o == OP and b == pc.BACKEND}
    assert cells == {(OP, pc.BACKEND, d) for d in ("float32", "float16", "bfloat16")}
    assert registry.get(OP).backend(pc.BACKEND).requires.devices == ("cuda",)


@pytest.mark.slow
def test_unit_compiles_and_checks_its_arguments(nvcc_unit: Any) -> None:
    """The unit builds for sm_90a and sm_80 and exports its functions; its split rule is the
    Python mirror's; its host checks refuse arguments that would read out of bounds (they run
    before any CUDA call, so CPU tensors exercise them without a GPU)."""
    mod = nvcc_unit("attention_decode_cuda")
    split, rule = mod["attention_decode_split_cuda"], mod["attention_decode_num_splits"]
    for args in (
        (1, 32, 8, 4096, 132),
        (1, 32, 8, 1 << 20, 132),
        (64, 32, 8, 4096, 132),
        (1, 64, 1, 1 << 20, 132),
        (3, 40, 8, 777, 108),
        (0, 8, 8, 0, 132),
        (7, 12, 1, 50_000, 78),
    ):
        assert rule(*args) == pc.num_splits(*args), args
    q, kc, vc, table, lens = _call()
    out = torch.empty_like(q)
    none = torch.empty(0)
    base = [
        out,
        none,
        False,
        q,
        kc,
        vc,
        table,
        lens,
        none,
        False,
        lens,
        lens,
        False,
        0.125,
        0.0,
        -1,
        none,
        1,
        False,
    ]

    def call(**change: Any) -> None:
        names = ("out", "lse", "has_lse", "query", "key_cache", "value_cache", "block_tables", "seq_lens")
        names += ("sinks", "has_sinks", "k_scale", "v_scale", "fp8", "scale", "softcap", "window_left")
        names += ("workspace", "num_splits", "enable_pdl")
        args = list(base)
        for k, v in change.items():
            args[names.index(k)] = v
        split(*args)

    with pytest.raises(ValueError, match="cuda tensors"):
        call()
    with pytest.raises(ValueError, match="query must be 3-D"):
        call(query=q[0])
    with pytest.raises(ValueError, match="block_tables must be 2-D"):
        call(block_tables=table[0])
