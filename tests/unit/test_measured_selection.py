"""Measured selection: a select table puts the backend measured fastest for the call's shape
first (with its other delivery, aot <-> jit), explain says which file decided, and the native
CUDA kernel takes its config id from the cuda table."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from opmux.kernels import _env, measured, registry, tuned
from opmux.kernels.ops import _native
from opmux.kernels.selector import Facts, select

OP = "gemm.w8a8_block_fp8_matmul"
DEV = "OPMUX_TEST_GPU"  # no shipped table: only what a test writes


@pytest.fixture(autouse=True)
def fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    monkeypatch.setattr(tuned, "device_name", lambda device: DEV)
    with _env.scope(OPMUX_TUNED_CONFIG_DIR=str(tmp_path)):
        tuned.refresh()
        yield tmp_path
    tuned.refresh()


def _write(directory: Path, backend: str, shape: tuple[int, int], table: dict[str, Any]) -> None:
    name = tuned.table_key(OP, backend, DEV, shape).file_name()
    (directory / name).write_text(json.dumps(table), encoding="utf-8")
    tuned.refresh()


def _t(*shape: int) -> Any:
    numel = 1
    for d in shape:
        numel *= d
    return SimpleNamespace(shape=shape, numel=lambda: numel)


H200 = Facts("cuda", "sm_90a", frozenset({"cuda", "triton", "cuda_jit", "aot_cuda", "nvcc"}))


def test_no_table_keeps_the_declared_priority() -> None:
    assert measured.measured_op(OP)
    assert measured.preferred(OP, None, (_t(16, 7168), _t(4096, 7168)), {}) is None


def test_the_measured_backend_goes_first(fresh: Path) -> None:
    _write(fresh, "select", (4096, 7168), {"16": {"backend": "triton"}, "2048": {"backend": "jit"}})
    pref = measured.preferred(OP, None, (_t(2, 8, 7168), _t(4096, 7168)), {})  # M = 16 rows
    assert pref is not None and pref[0] == "triton"
    assert "M=16, N=4096, K=7168" in pref[1] and "backend=select.json" in pref[1]
    spec = registry.get(OP)
    sel = select(spec, H200, dtype="float8_e4m3fn", preferred=pref)
    assert sel.decisions[0].backend == "triton"
    assert "triton first: measured fastest" in sel.trace_str() and sel.as_dict()["basis"]

    jit = measured.preferred(OP, None, (_t(4000, 7168), _t(4096, 7168)), {})
    assert jit is not None and jit[0] == "jit"
    order = [d.backend for d in select(spec, H200, dtype="float8_e4m3fn", preferred=jit).decisions]
    assert order[:2] == ["aot", "jit"]  # the same kernel's deliveries lead, in priority order


def test_bad_arguments_leave_it_to_the_contract() -> None:
    assert measured.preferred(OP, None, (3, None), {}) is None


def test_native_kernel_takes_the_tuned_config_id(fresh: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[tuple[Any, ...]] = []

    def fake_load(self: Any, group: str, device: str, name: str) -> Any:
        assert name == "w8a8_block_fp8_matmul_cuda_cfg"
        return lambda *args: calls.append(args)

    monkeypatch.setattr(_native.NativeLoader, "_load", fake_load)
    kernel = _native.JIT.kernel(OP, "cuda")
    dev = SimpleNamespace(type="cuda", index=0)
    out, a, b = SimpleNamespace(device=dev), SimpleNamespace(shape=(16, 7168), device=dev), _t(4096, 7168)
    kernel(out, a, b, "sa", "sb", True)
    assert calls[-1][-2:] == (tuned.KERNEL_HEURISTIC, True)  # no table: the kernel's heuristic
    _write(fresh, "cuda", (4096, 7168), {"8": {"config_id": 4}, "4096": {"config_id": 0}})
    kernel(out, a, b, "sa", "sb", False)
    assert calls[-1][-2:] == (4, False)
    _write(fresh, "cuda", (4096, 7168), {"1": {"config_id": 4}, "4096": {"config_id": 0}})
    kernel(out, a, b, "sa", "sb", False)  # M=16 is 16x the nearest entry's M: out of reach
    assert calls[-1][-2:] == (tuned.KERNEL_HEURISTIC, False)


def test_paged_prefill_takes_flashinfer_where_its_table_says(fresh: Path) -> None:
    """attention.paged_prefill's select tables (bench_attention_prefill.py --select-out) key on
    (padded value head dim, GQA group) and the new tokens: FlashInfer goes first where measured
    faster, the declared order (Triton first) elsewhere."""
    op = "attention.paged_prefill"
    name = tuned.table_key(op, "select", DEV, (128, 4)).file_name()
    (fresh / name).write_text(json.dumps({"1024": {"backend": "flashinfer"}}), encoding="utf-8")
    tuned.refresh()
    assert measured.measured_op(op)
    q, kc = _t(1000, 32, 128), _t(64, 16, 8, 128)
    pref = measured.preferred(op, None, (q, kc, kc, _t(2, 4), _t(2), _t(3)), {})
    assert pref is not None and pref[0] == "flashinfer"
    assert "M=1000, DV=128, G=4" in pref[1]
    facts = Facts("cuda", "sm_90a", frozenset({"cuda", "triton", "flashinfer"}))
    assert (
        select(registry.get(op), facts, dtype="bfloat16", preferred=pref).decisions[0].backend == "flashinfer"
    )
    order = [d.backend for d in select(registry.get(op), facts, dtype="bfloat16").decisions]
    assert order[0] == "triton"  # no measurement: the declared priority
    # a head dim of 96 pads to 128; another group has no table
    assert (
        measured.preferred(op, None, (_t(900, 32, 96), _t(64, 16, 8, 96), _t(64, 16, 8, 96)), {})[0]
        == "flashinfer"
    )
    assert measured.preferred(op, None, (q, _t(64, 16, 4, 128), _t(64, 16, 4, 128)), {}) is None


def test_paged_decode_takes_the_native_unit_where_its_table_says(fresh: Path) -> None:
    """attention.paged_decode's select tables (bench_attention_decode.py --select-out) key on
    (padded value head dim, GQA group) and the batch (the contexts are on the GPU: not a key):
    the native unit goes first at the nearest measured batch, Triton elsewhere."""
    op = "attention.paged_decode"
    name = tuned.table_key(op, "select", DEV, (128, 4)).file_name()
    table = {"1": {"backend": "triton"}, "64": {"backend": "cuda"}}
    (fresh / name).write_text(json.dumps(table), encoding="utf-8")
    tuned.refresh()
    assert measured.measured_op(op)
    kc = _t(4096, 16, 8, 128)
    args = (_t(64, 32, 128), kc, kc, _t(64, 256), _t(64))
    pref = measured.preferred(op, None, args, {"scale": 0.1})
    assert pref is not None and pref[0] == "cuda" and "M=64, DV=128, G=4" in pref[1]
    facts = Facts("cuda", "sm_90a", frozenset({"cuda", "triton", "flashinfer"}))
    assert select(registry.get(op), facts, dtype="bfloat16", preferred=pref).decisions[0].backend == "cuda"
    assert select(registry.get(op), facts, dtype="bfloat16").decisions[0].backend == "triton"
    one = measured.preferred(op, None, (_t(1, 32, 128), kc, kc, _t(1, 256), _t(1)), {})
    assert one is not None and one[0] == "triton"
    # MQA-like group 8 has no table: the declared priority
    assert measured.preferred(op, None, (_t(64, 32, 128), _t(64, 16, 4, 128), _t(64, 16, 4, 128)), {}) is None


def test_no_select_table_for_the_device_skips_the_call_problem(
    fresh: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Where no select table of the op exists for the device (paged decode ships none), the
    lookup ends before the call's problem is built (the per-call cost of an op without tables);
    a table written for the device is seen after refresh."""
    import dataclasses

    op = "attention.paged_decode"
    calls = []
    schema = tuned.SCHEMAS[op]
    assert schema.call_problem is not None

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return schema.call_problem(*args, **kwargs)

    monkeypatch.setitem(tuned.SCHEMAS, op, dataclasses.replace(schema, call_problem=counted))
    kc = _t(64, 16, 8, 128)
    args = (_t(4, 32, 128), kc, kc, _t(4, 8), _t(4))
    assert not tuned.has_tables(op, "select", DEV)
    assert measured.preferred(op, None, args, {}) is None and calls == []
    name = tuned.table_key(op, "select", DEV, (128, 4)).file_name()
    (fresh / name).write_text(json.dumps({"4": {"backend": "cuda"}}), encoding="utf-8")
    tuned.refresh()
    assert tuned.has_tables(op, "select", DEV)
    assert measured.preferred(op, None, args, {})[0] == "cuda" and calls == [1]


def test_sampling_takes_the_native_unit_where_the_h100_tables_say(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sampling ops' shipped select tables (bench_sampling.py --select-out, an H100 run) key on
    the vocabulary and the batch: the native unit where it beat FlashInfer's samplers, FlashInfer
    (declared first) elsewhere; other GPUs and vocabularies keep the declared order."""
    h100 = "NVIDIA_H100_80GB_HBM3"
    monkeypatch.setattr(tuned, "device_name", lambda device: h100)
    op = "sampling.top_p_renorm_probs"
    assert measured.measured_op(op) and tuned.has_tables(op, "select", h100)
    pref = measured.preferred(op, None, (_t(16, 151936),), {"top_p": 0.9})
    assert pref is not None and pref[0] == "jit" and "M=16, V=151936" in pref[1]
    wide = measured.preferred(op, None, (_t(256, 151936),), {})
    assert wide is not None and wide[0] == "flashinfer"
    assert measured.preferred(op, None, (_t(16, 50000),), {}) is None  # no table for this vocabulary
    facts = Facts("cuda", "sm_90a", frozenset({"cuda", "triton", "cuda_jit", "flashinfer"}))
    spec = registry.get(op)
    order = [d.backend for d in select(spec, facts, dtype="float32", preferred=pref).decisions]
    assert order[:2] == ["aot", "jit"]  # the native unit's deliveries lead
    assert select(spec, facts, dtype="float32").decisions[0].backend == "flashinfer"
    draw = "sampling.top_k_top_p_sampling_from_probs"  # the native unit at every batch there
    pref = measured.preferred(draw, None, (_t(256, 32000),), {})
    assert pref is not None and pref[0] == "jit"
    assert not tuned.has_tables(op, "select", "NVIDIA_H200")


def test_a_refresh_drops_the_dispatch_choices_cached_without_a_table() -> None:
    """Ops with select tables are cached per dtype on a device with none (their serving lanes);
    tables read after tuned.refresh() must be able to speak: the refresh drops those choices."""
    from opmux.kernels import _dispatch_state, fused_op  # noqa: F401  (fused_op registers the listener)

    before = _dispatch_state.generation()
    tuned.refresh()
    assert _dispatch_state.generation() > before
