"""Selection over made-up machines: every backend gets a decision with a typed reason."""

from __future__ import annotations

import dataclasses

import pytest

from opmux.kernels import registry
from opmux.kernels.facts import aot_covers
from opmux.kernels.selector import Facts, Reason, select
from opmux.kernels.spec import BackendSpec, OpSpec, Requirement

RMS = registry.get("layernorm.rmsnorm")
ALL_CPU = Facts("cpu", None, frozenset({"aot:cpu", "jit:cpu", "triton"}))
H200 = Facts("cuda", "sm_90", frozenset({"aot:cuda", "jit:cuda", "triton"}))


def test_cpu_wheel_picks_aot_and_explains_the_rest() -> None:
    sel = select(RMS, ALL_CPU, dtype="float32")
    assert sel.chosen == "aot" and not sel.fallback
    assert sel.decision("jit").reason is Reason.LOWER_PRIORITY
    assert sel.decision("triton").reason is Reason.NOT_IN_PRIORITY
    assert sel.decision("torch_npu").reason is Reason.WRONG_DEVICE
    assert {d.backend for d in sel.decisions} == {*RMS.backend_names, "reference"}


def test_tree_without_aot_uses_jit_without_a_fallback_warning() -> None:
    facts = Facts("cpu", None, frozenset({"jit:cpu"}), {"aot:cpu": (Reason.NOT_IN_WHEEL, "no lib")})
    sel = select(RMS, facts, dtype="bfloat16")
    assert sel.chosen == "jit"
    assert sel.decision("aot").reason is Reason.NOT_IN_WHEEL
    assert not sel.fallback  # same kernel source: no fallback


def test_no_compiler_is_a_fallback_to_torch() -> None:
    facts = Facts(
        "cpu",
        None,
        frozenset(),
        {"aot:cpu": (Reason.NOT_IN_WHEEL, "x"), "jit:cpu": (Reason.NO_COMPILER, "no c++")},
    )
    sel = select(RMS, facts, dtype="float32")
    assert sel.chosen == "torch"
    assert sel.fallback_from is not None and sel.fallback_from.backend == "aot"
    assert sel.decision("jit").reason is Reason.NO_COMPILER


def test_forced_backend_order_and_disabled_rest() -> None:
    sel = select(RMS, H200, dtype="bfloat16", forced=("triton", "jit"))
    assert sel.chosen == "triton"
    assert sel.decision("jit").reason is Reason.LOWER_PRIORITY
    assert sel.decision("aot").reason is Reason.DISABLED_BY_USER


def test_forced_backend_that_cannot_run_is_a_fallback() -> None:
    sel = select(RMS, H200, dtype="bfloat16", forced=("torch_npu",))
    assert sel.fallback_from is not None and sel.fallback_from.reason is Reason.WRONG_DEVICE
    assert sel.chosen == "aot"


def test_run_time_failure_and_argument_rejection() -> None:
    sel = select(
        RMS, H200, dtype="float16", failed={"aot": "load failed"}, arg_rejections={"jit": "needs stride 1"}
    )
    assert sel.decision("aot").reason is Reason.FAILED
    assert sel.decision("jit").reason is Reason.BAD_ARGUMENTS
    assert sel.chosen == "triton" and sel.fallback


def test_arch_window_and_gfx_set() -> None:
    spec = OpSpec(
        name="test.arch",
        reference="opmux.kernels.ops.layernorm.op:ref_norm",
        backends=(
            BackendSpec(
                "hopper",
                "opmux.kernels.ops.layernorm.op:torch_norm",
                Requirement(devices=("cuda",), sm_min=90),
            ),
            BackendSpec(
                "mi300",
                "opmux.kernels.ops.layernorm.op:torch_norm",
                Requirement(devices=("hip",), gfx=("gfx942",)),
            ),
            BackendSpec(
                "torch",
                "opmux.kernels.ops.layernorm.op:torch_norm",
                Requirement(devices=("cuda", "hip")),
            ),
        ),
        default_priority=("hopper", "mi300", "torch"),
    )
    assert select(spec, Facts("cuda", "sm_90"), dtype="float32").chosen == "hopper"
    a100 = select(spec, Facts("cuda", "sm_80"), dtype="float32")
    assert a100.chosen == "torch" and a100.decision("hopper").reason is Reason.WRONG_ARCH
    assert select(spec, Facts("hip", "gfx942"), dtype="float32").chosen == "mi300"
    assert select(spec, Facts("hip", "gfx90a"), dtype="float32").decision("mi300").reason is Reason.WRONG_ARCH


def test_unsupported_dtype_is_typed() -> None:
    sel = select(RMS, ALL_CPU, dtype="float64")
    assert sel.decision("aot").reason is Reason.WRONG_DTYPE
    assert sel.chosen == "reference"


@pytest.mark.parametrize(
    ("archs", "arch", "ok"),
    [
        (["sm_80", "sm_90a"], "sm_90", True),
        (["sm_80", "sm_90a"], "sm_86", True),
        (["sm_80", "sm_90a"], "sm_100", False),
        (["sm_80", "sm_90a", "compute_90"], "sm_100", True),
        (["sm_90a"], "sm_89", False),
        (["sm_86"], "sm_80", False),
        ([], "sm_90", False),
        (["sm_80"], None, False),
    ],
)
def test_aot_arch_coverage(archs: list[str], arch: str | None, ok: bool) -> None:
    assert aot_covers(archs, arch) is ok


def test_trace_renders_every_backend() -> None:
    text = select(RMS, ALL_CPU, dtype="float32").trace_str()
    for name in (*RMS.backend_names, "reference"):
        assert name in text


def test_size_priority_switches_backend_at_the_threshold() -> None:
    # no shipped op has a size class today (the CUDA kernels won at every size); the rule itself
    add = dataclasses.replace(
        registry.get("layernorm.fused_add_rmsnorm"),
        size_priority=(("cuda", 1 << 25, ("triton", "aot", "jit", "torch")),),
    )
    threshold = add.size_threshold("cuda")
    assert threshold is not None and add.size_threshold("cpu") is None
    small = select(add, H200, dtype="bfloat16", numel=threshold - 1)
    big = select(add, H200, dtype="bfloat16", numel=threshold)
    assert small.chosen == "aot" and big.chosen == "triton"
    assert select(add, H200, dtype="bfloat16").chosen == "aot"  # no size given: the base order


def test_size_priority_validation() -> None:
    b = BackendSpec("torch", "m:f", Requirement(devices=("cpu",)))
    with pytest.raises(ValueError, match="one size_priority threshold per device"):
        OpSpec(
            name="a.b",
            reference="m:f",
            backends=(b,),
            default_priority=("torch",),
            size_priority=(("cpu", 1, ("torch",)), ("cpu", 2, ("torch",))),
        )
    with pytest.raises(ValueError, match="priority names unknown backend"):
        OpSpec(
            name="a.b",
            reference="m:f",
            backends=(b,),
            default_priority=("torch",),
            size_priority=(("cpu", 1, ("jit",)),),
        )
