"""Registry contract: idempotent registration, conflicts, nested targets, verification."""

from __future__ import annotations

import subprocess
import sys

import pytest

from opmux.kernels import registry
from opmux.kernels.spec import BackendSpec, OpSpec, Requirement, Target


def _spec(target: str = "opmux.kernels.ops.layernorm.op:torch_norm") -> OpSpec:
    return OpSpec(
        name="test.dummy",
        reference="opmux.kernels.ops.layernorm.op:ref_norm",
        backends=(BackendSpec("torch", target, Requirement(devices=("cpu",))),),
        default_priority=("torch",),
    )


def test_same_spec_twice_is_harmless_conflict_is_an_error() -> None:
    registry.register(_spec())
    registry.register(_spec())
    with pytest.raises(ValueError, match="already registered with a different spec"):
        registry.register(_spec("opmux.kernels.ops.layernorm.triton_kernels:rmsnorm"))
    registry._OPS.pop("test.dummy")


def test_nested_targets_resolve() -> None:
    fn = registry.resolve_target("opmux.kernels.ops._native:AOT.kernel")
    assert callable(fn)
    assert Target.parse("a.b:C.d.e").attrs == ("C", "d", "e")
    with pytest.raises(AttributeError, match="has no attribute 'nope'"):
        registry.resolve_target("opmux.kernels.ops._native:AOT.nope")


@pytest.mark.parametrize("bad", ["nocolon", "a:", ":b", "a:b..c", "a b:c", "a:1x"])
def test_bad_targets_are_rejected(bad: str) -> None:
    with pytest.raises(ValueError, match="invalid import target"):
        Target.parse(bad)


def test_every_registered_target_resolves() -> None:
    assert registry.verify_targets() == []


def test_verify_reports_missing_modules() -> None:
    registry.register(_spec("opmux.kernels.ops.nothere:X.y"))
    try:
        problems = registry.verify_targets()
        assert [p.target for p in problems] == ["opmux.kernels.ops.nothere:X.y"]
        assert "not found" in problems[0].problem
    finally:
        registry._OPS.pop("test.dummy")


def test_unknown_op_lists_valid_ones() -> None:
    with pytest.raises(ValueError, match=r"unknown op 'rmsnorm' \(did you mean layernorm.rmsnorm\?\)"):
        registry.get("rmsnorm")


def test_spec_validation() -> None:
    with pytest.raises(ValueError, match="priority names unknown backend"):
        OpSpec(name="a.b", reference="m:f", backends=(), default_priority=("x",))
    with pytest.raises(ValueError, match="unknown device type"):
        Requirement(devices=("gpu",))
    with pytest.raises(ValueError, match="duplicate backend"):
        b = BackendSpec("torch", "m:f", Requirement(devices=("cpu",)))
        OpSpec(name="a.b", reference="m:f", backends=(b, b), default_priority=())


def test_metadata_layer_imports_no_torch() -> None:
    code = "import sys, opmux.kernels as k; k.all_ops(); k.explain('layernorm.rmsnorm', device='cpu'); assert 'torch' not in sys.modules, 'torch'"
    subprocess.run([sys.executable, "-c", code], check=True)
