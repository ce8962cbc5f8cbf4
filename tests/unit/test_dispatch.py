"""The dispatch contract on this machine: explain == what runs, overrides, fallback, tracing."""

from __future__ import annotations

import json
import subprocess
import sys
import types
import warnings
from dataclasses import replace
from typing import Any

import pytest
import torch

from opmux.kernels import FallbackError, config, explain, tracing, use_backends
from opmux.kernels.__main__ import main
from opmux.kernels.ops.activation import silu_and_mul
from opmux.kernels.ops.layernorm import fused_add_rmsnorm, rmsnorm


def _x() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.randn(3, 64), torch.randn(64)


def test_explain_names_what_actually_runs() -> None:
    x, w = _x()
    sel = explain("layernorm.rmsnorm", x, w)
    with tracing.capture() as calls:
        rmsnorm(x, w)
    assert [c.backend for c in calls] == [sel.chosen]
    assert calls[0].op == "layernorm.rmsnorm" and calls[0].shapes == ((3, 64), (64,))
    assert sel.chosen == explain("layernorm.rmsnorm", device="cpu").chosen


def test_cli_explain_lists_every_backend_with_a_reason(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--json", "explain", "layernorm.rmsnorm", "--device", "cpu"]) == 0
    info = json.loads(capsys.readouterr().out)
    names = {d["backend"] for d in info["decisions"]}
    assert names == {"aot", "jit", "triton", "torch", "torch_npu", "reference"}
    for d in info["decisions"]:
        assert d["backend"] == info["chosen"] or d["reason"], d


def test_cli_in_a_subprocess_and_errors_to_stderr() -> None:
    ok = subprocess.run(
        [sys.executable, "-m", "opmux.kernels", "explain", "layernorm.rmsnorm"],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0 and "CHOSEN" in ok.stdout
    bad = subprocess.run(
        [sys.executable, "-m", "opmux.kernels", "explain", "layernorm.rmsnrm"], capture_output=True, text=True
    )
    assert (
        bad.returncode == 1
        and "unknown op 'layernorm.rmsnrm'" in bad.stderr
        and "layernorm.rmsnorm" in bad.stderr
    )
    for cmd in ("list", "env"):
        out = subprocess.run(
            [sys.executable, "-m", "opmux.kernels", "--json", cmd], capture_output=True, text=True, check=True
        )
        json.loads(out.stdout)


def test_env_var_override_is_read_and_validated() -> None:
    x, w = _x()
    with config.scope(OPMUX_KERNEL_BACKEND="layernorm.rmsnorm=torch"), tracing.capture() as calls:
        rmsnorm(x, w)
    assert calls[0].backend == "torch"
    with (
        config.scope(OPMUX_KERNEL_BACKEND="layernorm.rmsnorm=tritn"),
        pytest.raises(ValueError, match=r"tritn.*triton"),
    ):
        rmsnorm(x, w)


def test_context_manager_and_per_call_override() -> None:
    x, w = _x()
    with use_backends("layernorm.*=reference"), tracing.capture() as calls:
        rmsnorm(x, w)
        fused_add_rmsnorm(x.clone(), x.clone(), w)
        silu_and_mul(x)
    assert [c.backend for c in calls[:2]] == ["reference", "reference"] and calls[2].backend != "reference"
    with tracing.capture() as calls:
        rmsnorm(x, w, backend="torch")
        rmsnorm(x, w, backend=["triton", "torch"])
    assert [c.backend for c in calls] == ["torch", "triton"]
    with pytest.raises(
        ValueError, match=r"'cuda_graph'.*valid choices: aot, jit, reference, torch, torch_npu, triton"
    ):
        rmsnorm(x, w, backend="cuda_graph")
    with pytest.raises(ValueError, match="nosuchgroup"):
        with use_backends("nosuchgroup.*=torch"):
            pass


def test_fallback_policy_warn_once_error_and_silent() -> None:
    x, w = _x()
    ref = rmsnorm(x, w, backend="reference")
    with config.scope(OPMUX_KERNEL_BACKEND="layernorm.rmsnorm=torch_npu"):
        with pytest.warns(RuntimeWarning, match="falls back from torch_npu"):
            y = rmsnorm(x, w)
        torch.testing.assert_close(y, ref)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rmsnorm(x, w)  # once per op and reason
    with config.scope(OPMUX_KERNEL_BACKEND="layernorm.rmsnorm=torch_npu", OPMUX_FALLBACK="error"):
        with pytest.raises(FallbackError, match=r"torch_npu.*wrong-device"):
            rmsnorm(x, w)
    with config.scope(OPMUX_KERNEL_BACKEND="layernorm.rmsnorm=torch_npu", OPMUX_FALLBACK="silent"):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rmsnorm(x, w)
    assert any(k[0] == "layernorm.rmsnorm" and k[1] == "torch_npu" for k in tracing.fallbacks())


def test_jit_off_without_aot_falls_back_to_torch(tmp_path: object) -> None:
    x, w = _x()
    with config.scope(OPMUX_JIT="0", OPMUX_CACHE_DIR=str(tmp_path), OPMUX_FALLBACK="error"):
        sel = explain("layernorm.rmsnorm", x, w)
        assert sel.decision("jit").reason.value == "jit-disabled"
        # error concerns forced backends (docs/env.md): an unforced call falls back, warning once
        with pytest.warns(RuntimeWarning, match="falls back from aot to torch"):
            torch.testing.assert_close(rmsnorm(x, w), rmsnorm(x, w, backend="torch"))
        with pytest.raises(FallbackError):
            rmsnorm(x, w, backend="jit")


def test_tracing_counters_and_reset() -> None:
    x, _ = _x()
    tracing.enable()
    for _ in range(3):
        silu_and_mul(x)
    assert sum(n for (op, _), n in tracing.counters().items() if op == "activation.silu_and_mul") == 3
    tracing.reset()
    assert tracing.counters() == {} and tracing.records() == []
    tracing.disable()


def test_bad_dtype_and_type_errors_name_the_choices() -> None:
    with pytest.raises(TypeError, match="unsupported dtype int32; supported: bfloat16, float16, float32"):
        rmsnorm(torch.ones(2, 4, dtype=torch.int32), torch.ones(4, dtype=torch.int32))
    with pytest.raises(TypeError, match=r"expected a torch\.Tensor, got list"):
        rmsnorm([1.0], torch.ones(1))


def test_size_classes_are_cached_per_side() -> None:
    """An op with a CPU size rule: each side runs its own backend, also from the fast path."""
    from opmux.kernels import registry
    from opmux.kernels.fused_op import FusedOp
    from opmux.kernels.ops._decl import declare
    from opmux.kernels.ops.layernorm import op as ln

    decl = declare(
        "test.sized",
        "(Tensor x, Tensor weight, float eps=1e-06, Tensor(a!)? out=None) -> Tensor",
        doc="rmsnorm with a CPU size rule",
        check=ln.rmsnorm.check,
        reference=ln.rmsnorm.reference,
        torch=dict(ln.rmsnorm.python_backends)["torch"],
        native=False,
        size_priority=(("cpu", 1000, ("triton", "torch")),),
        samples="rmsnorm",
    )
    # the triton target follows the reference's package: layernorm.triton_kernels:sized
    decl = replace(decl, spec=_with_triton(decl.spec, ln.rmsnorm.spec))
    try:
        op = FusedOp(decl, _entrypoints_of(decl))
        small, big, w = torch.randn(2, 8), torch.randn(40, 64), torch.randn(8)
        w64 = torch.randn(64)
        with tracing.capture() as calls:
            op.public(small, w)
            op.public(big, w64)
        assert [c.backend for c in calls] == ["torch", "triton"]
        op.public(small, w), op.public(big, w64)  # now cached: both sides of the one entry
        assert op.lookup(small) is op.kernel("torch", "cpu") and op.lookup(big) is op.kernel("triton", "cpu")
        torch.testing.assert_close(op.public(big, w64), ln.rmsnorm.reference(big, w64), atol=1e-5, rtol=1e-5)
    finally:
        registry._OPS.pop("test.sized")


def _entrypoints_of(decl: Any) -> types.ModuleType:
    """The generated entry points of an op declared here (no group holds them): the generator's
    text for it, as a module of the package of its reference."""
    from opmux.kernels.ops._entry_codegen import render_group

    package = decl.spec.reference.partition(":")[0].rpartition(".")[0]
    module = types.ModuleType(f"{package}._test_entrypoints")
    module.__package__ = package
    exec(compile(render_group([decl]), f"<{decl.name} entry points>", "exec"), module.__dict__)
    return module


def _with_triton(spec: Any, like: Any) -> Any:
    """The spec with the triton backend of ``like`` (whose kernel takes the same arguments)."""
    triton = replace(like.backend("triton"), target="opmux.kernels.ops.layernorm.triton_kernels:rmsnorm")
    backends = (*tuple(b for b in spec.backends if b.name != "triton"), triton)
    return replace(spec, backends=backends)


def test_a_call_refusal_runs_the_next_backend_and_keeps_the_refusing_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """CallRefused (a backend declining this call's data, e.g. FlashInfer's planner over a table
    naming a block outside the cache) sends the call to the next backend, caches nothing for it,
    and leaves the backend selectable: the next call runs on it. A plain BackendUnavailable is
    remembered instead (the backend stays off)."""
    from opmux.kernels.errors import BackendUnavailable, CallRefused
    from opmux.kernels.explain import op_instance

    x, w = _x()
    op = op_instance("layernorm.rmsnorm")
    op.invalidate()
    first = explain("layernorm.rmsnorm", x, w).chosen
    real_bind = op.bind
    mode = {"raise": CallRefused}

    def bind(backend: str, device: str) -> Any:
        fn = real_bind(backend, device)
        if backend != first:
            return fn

        def maybe(*args: Any, **kwargs: Any) -> Any:
            if mode["raise"] is not None:
                raise mode["raise"](backend, "declined this call's data")
            return fn(*args, **kwargs)

        return maybe

    monkeypatch.setattr(op, "bind", bind)
    try:
        # (leaving config.scope refreshes the settings, which forgets failures: assert inside)
        with tracing.capture() as calls, config.scope(OPMUX_FALLBACK="silent"):
            want = rmsnorm(x, w)
            assert first not in op._failed
            mode["raise"] = None
            got = rmsnorm(x, w)
        assert calls[0].backend != first and calls[1].backend == first, calls
        torch.testing.assert_close(got, want)
        mode["raise"] = BackendUnavailable
        with tracing.capture() as calls, config.scope(OPMUX_FALLBACK="silent"):
            rmsnorm(x, w)
            mode["raise"] = None
            rmsnorm(x, w)
            assert first in op._failed
        assert all(c.backend != first for c in calls), calls
    finally:
        op._failed.pop(first, None)
        op.invalidate()
