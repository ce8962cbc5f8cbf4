"""Every public op under torch.compile(fullgraph=True) matches eager; opcheck passes.

Generic over the registry: a new op is covered by registering it (its first CPU
samples are compiled with the aot_eager backend to keep CPU CI fast; one inductor case
proves the real compiler path).
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from opmux.kernels import registry

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "parity"))  # the parity cases
from parity_samples import samples as op_samples

OPS = sorted(registry.all_ops())


def _public(op: str) -> Any:
    group, name = op.split(".")
    return getattr(importlib.import_module(f"opmux.kernels.ops.{group}"), name)


def _outputs(result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
    res = list(result) if isinstance(result, tuple) else [result]
    return (
        res
        + [a for a in args if isinstance(a, torch.Tensor)]
        + [v for v in kwargs.values() if isinstance(v, torch.Tensor)]
    )


@pytest.mark.parametrize("op", OPS)
def test_fullgraph_matches_eager(op: str) -> None:
    spec = registry.get(op)
    fn = _public(op)
    samples = op_samples(spec)
    for i in range(2):
        eager_s, comp_s = samples("cpu", torch.float32)[i], samples("cpu", torch.float32)[i]
        torch._dynamo.reset()
        compiled = torch.compile(lambda *a, **k: fn(*a, **k), fullgraph=True, backend="aot_eager")
        want = _outputs(fn(*eager_s.args, **eager_s.kwargs), eager_s.args, eager_s.kwargs)
        got = _outputs(compiled(*comp_s.args, **comp_s.kwargs), comp_s.args, comp_s.kwargs)
        for g, w in zip(got, want, strict=True):
            if isinstance(w, torch.Tensor):
                torch.testing.assert_close(g, w)


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_inductor_fullgraph_block() -> None:
    from opmux.kernels.ops.activation import silu_and_mul
    from opmux.kernels.ops.layernorm import fused_add_rmsnorm, rmsnorm

    def block(h: torch.Tensor, res: torch.Tensor, w: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        fused_add_rmsnorm(h, res, w)
        y = rmsnorm(h * 2, w)
        return silu_and_mul(y @ up)

    args = [torch.randn(4, 32), torch.randn(4, 32), torch.randn(32), torch.randn(32, 64)]
    eager_args = [a.clone() for a in args]
    torch._dynamo.reset()
    got = torch.compile(block, fullgraph=True)(*args)
    want = block(*eager_args)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(args[1], eager_args[1])


def test_opcheck_layernorm_and_activation() -> None:
    x, w = torch.randn(3, 16), torch.randn(16)
    # building each op's public function registers its torch library ops (per op, on first use)
    for name in ("layernorm.rmsnorm", "layernorm.fused_add_rmsnorm", "activation.silu_and_mul"):
        _public(name)
    torch.library.opcheck(torch.ops.opmux.rmsnorm.default, (x, w, 1e-6))
    torch.library.opcheck(torch.ops.opmux.rmsnorm_out.default, (torch.empty_like(x), x, w, 1e-6))
    torch.library.opcheck(torch.ops.opmux.fused_add_rmsnorm.default, (x.clone(), x.clone(), w, 1e-6))
    torch.library.opcheck(torch.ops.opmux.silu_and_mul.default, (x, False))
    torch.library.opcheck(torch.ops.opmux.silu_and_mul.default, (x, True))  # the vllm_rounding mode
    torch.library.opcheck(torch.ops.opmux.silu_and_mul_out.default, (torch.empty(3, 8), x, False))


def test_fake_impl_rejects_bad_shapes_while_tracing() -> None:
    from opmux.kernels.ops.layernorm import rmsnorm

    torch._dynamo.reset()
    with pytest.raises(Exception, match="weight has shape"):
        torch.compile(lambda a, b: rmsnorm(a, b), fullgraph=True, backend="aot_eager")(
            torch.randn(2, 8), torch.randn(7)
        )


class _RecordOpmuxOps(TorchDispatchMode):
    """Records every ``torch.ops.opmux.*`` call (with cloned arguments) a public function makes."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Any, tuple[Any, ...], dict[str, Any]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if func.namespace == "opmux":
            clone = lambda v: v.clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
            self.calls.append((func, tuple(clone(a) for a in args), {k: clone(v) for k, v in kwargs.items()}))
        return func(*args, **kwargs)


@pytest.mark.parametrize("op", OPS)
def test_opcheck_every_op(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.library.opcheck on the library op(s) each public function uses while compiling."""
    spec = registry.get(op)
    samples = op_samples(spec)("cpu", torch.float32)
    fn = _public(op)
    # take the torch.compile path, eagerly (the public function's module, its group's generated
    # _entrypoints.py, holds the check it makes)
    monkeypatch.setitem(fn.__globals__, "DYNAMO", lambda: True)
    monkeypatch.setitem(fn.__globals__, "DYNAMO_ON", [True])
    recorder = _RecordOpmuxOps()
    with recorder:
        for sample in samples[:2]:
            fn(*sample.args, **sample.kwargs)
    assert recorder.calls, f"{op}: the compile path called no torch.ops.opmux op"
    for func, args, kwargs in recorder.calls:
        utils = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
        fp8 = any(
            isinstance(t, torch.Tensor) and t.dtype == torch.float8_e4m3fn for t in (*args, *kwargs.values())
        )
        if fp8:  # SchemaCheckMode compares inputs with arithmetic torch lacks for fp8 (mul on the CPU)
            utils = utils[1:]
        torch.library.opcheck(func, args, kwargs, test_utils=utils)


def test_public_functions_are_their_generated_source_and_compile_to_the_library_op(tmp_path: Path) -> None:
    """The public functions are the functions of their group's generated ``_entrypoints.py`` (a
    traceback points there; nothing swaps their code). They skip the is_dynamo_compiling call
    until torch._dynamo is imported (nothing can trace them before), and torch.compile, imported
    after they ran, sees the library op (the same function objects, ops made before or after)."""
    import os
    import subprocess

    code = (
        "import sys, torch\n"
        "from opmux.kernels.ops.layernorm import rmsnorm\n"
        "x, w = torch.randn(2, 8), torch.ones(8)\n"
        "rmsnorm(x, w)\n"
        "assert 'torch._dynamo' not in sys.modules and rmsnorm.__globals__['DYNAMO_ON'] == [False]\n"
        "assert rmsnorm.__code__.co_filename.endswith('layernorm/_entrypoints.py'), rmsnorm.__code__\n"
        "before = rmsnorm.__code__\n"
        "graphs = []\n"
        "def seen(gm, inputs):\n"
        "    graphs.append(str(gm.graph))\n"
        "    return gm.forward\n"
        "f = torch.compile(lambda a, b: rmsnorm(a, b) * 2, fullgraph=True, backend=seen)\n"
        "torch.testing.assert_close(f(x, w), rmsnorm(x, w) * 2)\n"
        "assert rmsnorm.__code__ is before and 'opmux.rmsnorm' in graphs[0], graphs\n"
        "assert rmsnorm.__globals__['DYNAMO_ON'] == [True]\n"
        "from opmux.kernels.ops.activation import silu_and_mul\n"
        "g = torch.compile(lambda a: silu_and_mul(a), fullgraph=True, backend='aot_eager')\n"
        "a = torch.randn(2, 16)\n"
        "torch.testing.assert_close(g(a), silu_and_mul(a))\n"
        "assert rmsnorm(x, w, backend='torch').shape == x.shape\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2] / "python")}
    env["OPMUX_CACHE_DIR"] = str(tmp_path / "c")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0 and "ok" in run.stdout, run.stdout + run.stderr


def test_library_ops_take_the_signature_defaults() -> None:
    x, w = torch.randn(3, 16), torch.randn(16)
    for name in ("layernorm.rmsnorm", "activation.silu_and_mul", "moe.topk_softmax"):
        _public(name)
    schema = str(torch.ops.opmux.silu_and_mul.default._schema)
    assert "bool vllm_rounding=False" in schema, schema
    torch.testing.assert_close(torch.ops.opmux.rmsnorm(x, w), _public("layernorm.rmsnorm")(x, w))
    torch.testing.assert_close(torch.ops.opmux.silu_and_mul(x), _public("activation.silu_and_mul")(x))
    w8, ids = torch.ops.opmux.topk_softmax(x, 2)
    assert w8.shape == ids.shape == (3, 2)
