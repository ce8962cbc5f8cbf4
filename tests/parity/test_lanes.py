"""The serving lanes (``<name>_<device>_lane``, opmux/lane.h) against the Python contract.

A lane is the native kernel's C++ check of the op's contract for its serving form: it runs the
kernel, or does nothing and returns None (the public function then runs the Python contract).
So it may refuse anything, but what it accepts the Python contract must accept, with the same
result. Checked here on every parity sample, invalid sample and contract-corpus case of every op
with a lane: a refused call wrote nothing; an accepted one equals the bound backend's call (the
Python contract, then the same kernel) bit for bit, or raised the same error inside the kernel.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from typing import Any

import pytest
import torch
from parity_samples import invalid as invalid_samples
from parity_samples import samples as op_samples
from test_contract import _corpus

from opmux.kernels import registry
from opmux.kernels.errors import BackendUnavailable
from opmux.kernels.explain import op_instance

Args = tuple[tuple[Any, ...], dict[str, Any]]
_DEVICE = {"cpu": "cpu", "cuda": "cuda"}
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _lane_ops(device: str) -> list[str]:
    return [name for name, spec in registry.all_ops().items() if "aot" in spec.backend_names]


def _lane(op: Any, device: str, allow_tree: bool) -> tuple[str, Callable[..., Any]] | None:
    for backend in ("aot", "jit"):
        try:
            op.entry(backend, device)  # loads it (bind would defer a load failure to the call)
        except BackendUnavailable:
            continue
        op.bind(backend, device)
        entry = op._lanes.get((backend, device))
        if entry is None:
            return None
        lane, flag = entry
        return backend, (lane if flag is None else lambda *a, _l=lane, _f=flag: _l(*a, _f))
    if not allow_tree:
        raise AssertionError(f"{op.op_name}: no native backend loads on {device}")
    return None


def _full(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any] | None:
    """The public arguments in signature order, defaults filled (None: not a valid call form)."""
    params = op.decl.params
    if len(args) > len(params) or set(kwargs) - {p.name for p in params}:
        return None
    values = {p.name: ast.literal_eval(p.default) for p in params if p.default is not None}
    values |= dict(zip((p.name for p in params), args, strict=False)) | kwargs
    if any(p.name not in values for p in params):
        return None
    # the public function calls a lane only with torch tensors there (ops/_entry_codegen._lane_lines)
    for p in params:
        v = values[p.name]
        if p.is_tensor and not (isinstance(v, torch.Tensor) or (v is None and p.type == "Tensor?")):
            return None
    return [values[p.name] for p in params]


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for o in obj for t in _tensors(o)]
    if isinstance(obj, dict):
        return [t for o in obj.values() for t in _tensors(o)]
    return []


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.dtype.is_floating_point:
        return bool(((a == b) | (a.isnan() & b.isnan())).all())
    return torch.equal(a, b)


def _cases(op_name: str, dev: str) -> list[tuple[str, Callable[[], Args]]]:
    spec = registry.get(op_name)
    out: list[tuple[str, Callable[[], Args]]] = []
    for dtype in _DTYPES:
        try:
            n = len(op_samples(spec)(dev, dtype))
        except (TypeError, ValueError):  # an op without this dtype
            continue
        for i in range(n):

            def make(dtype: torch.dtype = dtype, i: int = i) -> Args:
                s = op_samples(spec)(dev, dtype)[i]
                return s.args, dict(s.kwargs)

            out.append((f"sample-{dtype}-{i}", make))
    n_invalid = len(invalid_samples(spec)(dev))
    for i in range(n_invalid):

        def make_invalid(i: int = i) -> Args:
            torch.manual_seed(1234 + i)  # the invalid cases draw unseeded tensors
            _, args, kwargs, _, _ = invalid_samples(spec)(dev)[i]
            return args, dict(kwargs)

        out.append((f"invalid-{i}", make_invalid))
    for i, (name, corpus_op, _) in enumerate(_corpus(dev)):
        if corpus_op == op_name:
            out.append((f"corpus-{name}", lambda i=i: _corpus(dev)[i][2]()))
    return out


@pytest.mark.parametrize("op_name", _lane_ops("cpu"))
def test_lane_accepts_only_what_the_contract_accepts(
    op_name: str, device_type: str, request: pytest.FixtureRequest
) -> None:
    dev = _DEVICE.get(device_type)
    if dev is None:
        pytest.skip(f"native lanes run on cpu and cuda, not {device_type}")
    op = op_instance(op_name)
    found = _lane(op, dev, request.config.getoption("--allow-tree"))
    if found is None:
        pytest.skip(f"{op_name} has no serving lane on {dev}")
    backend, lane = found
    bound = op.bind(backend, dev)
    accepted = 0
    with torch.no_grad():
        for name, make in _cases(op_name, dev):
            args, kwargs = make()
            full = _full(op, args, kwargs)
            if full is None:
                continue
            before = [(t, t.clone()) for t in _tensors(full)]
            allocated: Any = None
            outs = [i for i, p in enumerate(op.decl.params) if p.written and p.type == "Tensor?"]
            if op.decl.outputs is not None and all(full[i] is None for i in outs):
                # what the public function does for a call that passes no output buffers
                try:
                    fresh, allocated = op.decl.outputs(*full)
                except Exception:
                    continue  # the public function then takes the Python path
                for i, t in zip(outs, fresh, strict=True):
                    full[i] = t
            try:
                got: Any = lane(*full)
                lane_error: BaseException | None = None
            except Exception as exc:  # raised inside the kernel after the lane accepted
                got, lane_error = True, exc
            if got is None:
                for t, snap in before:
                    assert _same(t, snap), f"{op_name} {name}: the lane refused but wrote an argument"
                continue
            accepted += 1
            args2, kwargs2 = make()
            full2 = _full(op, args2, kwargs2)
            assert full2 is not None
            for p, a, b in zip(op.decl.params, full, full2, strict=True):
                if p.type == "Tensor?" and p.written:
                    continue  # an output buffer (torch.empty: its old contents are not inputs)
                for ta, tb in zip(_tensors(a), _tensors(b), strict=True):
                    snap = next(s for t, s in before if t is ta)
                    assert _same(snap, tb), f"{op_name} {name}: the case is not made deterministically"
            try:
                want = bound(*args2, **kwargs2)
                py_error: BaseException | None = None
            except Exception as exc:
                want, py_error = None, exc
            if lane_error is not None or py_error is not None:
                assert lane_error is not None and py_error is not None, (
                    f"{op_name} {name}: the lane {'raised ' + repr(lane_error) if lane_error else 'ran'}, "
                    f"the contract {'raised ' + repr(py_error) if py_error else 'accepted'}"
                )
                assert (type(lane_error), str(lane_error)) == (type(py_error), str(py_error)), name
                continue
            written = [p.name for p in op.decl.params if p.written]
            for p_name in written:
                i = [p.name for p in op.decl.params].index(p_name)
                a, b = full[i], full2[i]
                if a is not None and b is not None:
                    assert _same(a, b), f"{op_name} {name}: {p_name} differs from the contract's call"
            results = [got] if isinstance(got, torch.Tensor) else _tensors(allocated)
            wanted = _tensors(want)
            if allocated is not None:
                assert len(results) == len(wanted), f"{op_name} {name}: {len(results)} results, {len(wanted)}"
            for g, w in zip(results, wanted, strict=False):
                assert _same(g, w), f"{op_name} {name}: the result differs from the contract's call"
                assert g.stride() == w.stride(), (
                    f"{op_name} {name}: result strides {g.stride()} != {w.stride()}"
                )
    assert accepted, f"{op_name}: its lane accepted none of the cases (dead code)"


def test_default_call_takes_the_lane(device_type: str, request: pytest.FixtureRequest) -> None:
    """A default call binds the chosen native backend's lane and its result is the kernel's."""
    dev = _DEVICE.get(device_type)
    if dev is None:
        pytest.skip(f"native lanes run on cpu and cuda, not {device_type}")
    from opmux.kernels import ops

    op = op_instance("layernorm.rmsnorm")
    if _lane(op, dev, request.config.getoption("--allow-tree")) is None:
        pytest.skip("no native rmsnorm lane here")
    x = torch.randn(3, 64, device=dev)
    w = torch.randn(64, device=dev)
    ops.layernorm.rmsnorm(x, w)  # the first call selects and binds
    y = ops.layernorm.rmsnorm(x, w)
    assert x.dtype in (op._lane_cpu if dev == "cpu" else op._lane_cuda)
    torch.testing.assert_close(y, ops.layernorm.rmsnorm(x, w, backend="torch"), atol=1e-5, rtol=1e-5)
    _, lane = _lane(op, dev, True) or (None, None)
    assert lane is not None
    out = torch.empty_like(x)
    assert lane(x, w, 1e-6, out) is True  # a caller's out: the lane writes it
    torch.testing.assert_close(out, y, atol=0, rtol=0)
    assert lane(x, w, 1e-6, x) is True  # in place (out=x: the very same view of a read tensor)
    torch.testing.assert_close(x, y, atol=0, rtol=0)


def test_interleaved_views_of_one_buffer(device_type: str, request: pytest.FixtureRequest) -> None:
    """q and k as views of one qkv buffer (the serving layout): the lane proves them apart as the
    Python guard does and runs; views that share elements are refused (the contract raises)."""
    dev = _DEVICE.get(device_type)
    if dev is None:
        pytest.skip(f"native lanes run on cpu and cuda, not {device_type}")
    op = op_instance("layernorm.qk_norm")
    found = _lane(op, dev, request.config.getoption("--allow-tree"))
    if found is None:
        pytest.skip("no native qk_norm lane here")
    backend, lane = found
    w = torch.randn(16, device=dev)

    def views(k_start: int) -> tuple[torch.Tensor, torch.Tensor]:
        qkv = torch.randn(4, 12 * 16, generator=torch.Generator().manual_seed(0)).to(dev)
        return qkv[:, :128].view(4, 8, 16), qkv[:, k_start : k_start + 32].view(4, 2, 16)

    with torch.no_grad():
        q, k = views(128)
        assert lane(q, k, w, w, 1e-6) is not None
        q2, k2 = views(128)
        op.bind(backend, dev)(q2, k2, w, w, 1e-6)
        assert torch.equal(q, q2) and torch.equal(k, k2)
        q, k = views(120)  # k's first head is the last half of q's last head
        snap = (q.clone(), k.clone())
        assert lane(q, k, w, w, 1e-6) is None
        assert torch.equal(q, snap[0]) and torch.equal(k, snap[1])
        with pytest.raises(ValueError, match="overlap in memory"):
            op.bind(backend, dev)(q, k, w, w, 1e-6)


def test_numpy_scalars_take_the_contract(device_type: str, request: pytest.FixtureRequest) -> None:
    """tvm-ffi passes a numpy scalar as a number: the public function keeps it from the lane, so the
    contract refuses it on every path as on the torch backend (review of the lanes)."""
    np = pytest.importorskip("numpy")
    dev = _DEVICE.get(device_type)
    if dev is None:
        pytest.skip(f"native lanes run on cpu and cuda, not {device_type}")
    from opmux.kernels import ops

    if _lane(op_instance("layernorm.rmsnorm"), dev, request.config.getoption("--allow-tree")) is None:
        pytest.skip("no native rmsnorm lane here")
    x, w = torch.randn(2, 64, device=dev), torch.randn(64, device=dev)
    ops.layernorm.rmsnorm(x, w, 1e-6), ops.layernorm.rmsnorm(x, w, 1e-6)  # the lane is bound
    for backend in (None, "torch"):
        with pytest.raises(ValueError, match="eps must be a finite number > 0"):
            ops.layernorm.rmsnorm(x, w, np.float32(1e-6), backend=backend)
    g = torch.randn(3, 16, device=dev)
    ops.moe.topk_softmax(g, 2), ops.moe.topk_softmax(g, 2)
    with pytest.raises((TypeError, ValueError)):
        ops.moe.topk_softmax(g, 2, moe_softcapping=np.float32(0.0))


@pytest.mark.parametrize(
    "shape, strides", [((1, 64), (96, 1)), ((0, 8), (4, 1)), ((2, 0), (16, 16)), ((3, 64), (64, 1))]
)
def test_norm_output_layout_is_empty_like(
    shape: tuple[int, int], strides: tuple[int, int], device_type: str, request: pytest.FixtureRequest
) -> None:
    """rmsnorm returns torch.empty_like(x) (x's strides for a dense x, e.g. a [1, H] slice of a
    wider row): the lane allocates only where that is the dense [T, H] (review of the lanes)."""
    dev = _DEVICE.get(device_type)
    if dev is None:
        pytest.skip(f"native lanes run on cpu and cuda, not {device_type}")
    from opmux.kernels import ops

    if _lane(op_instance("layernorm.rmsnorm"), dev, request.config.getoption("--allow-tree")) is None:
        pytest.skip("no native rmsnorm lane here")
    x = torch.randn(256, device=dev).as_strided(shape, strides)
    w = torch.randn(shape[1], device=dev)
    ops.layernorm.rmsnorm(x, w), ops.layernorm.rmsnorm(x, w)
    assert ops.layernorm.rmsnorm(x, w).stride() == torch.empty_like(x).stride()
