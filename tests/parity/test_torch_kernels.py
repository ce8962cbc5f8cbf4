"""The library ops' C++ kernels (``torch_kernels``, jit/csrc/torch_bridge.cpp) against their
Python kernels.

``torch.ops.opmux.<name>`` runs a C++ kernel that calls the serving lane the default call bound,
and hands everything else to the Python kernel (the twin library op ``opmux::_py_<name>``). Both
must be one op: on every parity sample, invalid sample and contract-corpus case of every bridged
op, the C++ path and the twin give the same results (bit for bit, same strides) or the same error
class and message, and write the same tensors. Plus what the C++ kernel does itself: grad inputs,
version bumps, a kernel error's class, and that accepted cases really ran the lane.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from test_lanes import _DEVICE, _cases, _full, _same, _tensors

from opmux.kernels import torch_kernels
from opmux.kernels.explain import op_instance


@pytest.fixture(scope="module")
def bridge() -> Any:
    from opmux.kernels import _env

    try:  # both devices' keys, whatever the default: this is the run that checks them
        with _env.scope(OPMUX_TORCH_KERNELS="all"):
            torch_kernels.enable()
    except Exception as exc:  # the build needs a C++ compiler and torch's headers
        pytest.fail(f"the torch library-op kernels did not build: {exc}")
    return torch_kernels.module()


def _bridged() -> list[str]:
    from opmux.kernels import registry

    out = []
    for name, spec in registry.all_ops().items():
        if "aot" in spec.backend_names and op_instance(name).lane_form is not None:
            out.append(name)
    return out


def _library_call(op: Any, full: list[Any]) -> tuple[Any, Any, list[Any]]:
    """(C++-kernel library op, its Python twin, positional arguments) for the public arguments."""
    names = [p.name for p in op.decl.params]
    short = op.decl.short_name
    if op.decl.has_out:
        out = full[names.index("out")]
        rest = [v for n, v in zip(names, full, strict=True) if n != "out"]
        if out is not None:
            return (
                getattr(torch.ops.opmux, f"{short}_out").default,
                getattr(torch.ops.opmux, f"_py_{short}_out").default,
                [out, *rest],
            )
        return getattr(torch.ops.opmux, short).default, getattr(torch.ops.opmux, f"_py_{short}").default, rest
    return (
        getattr(torch.ops.opmux, short).default,
        getattr(torch.ops.opmux, f"_py_{short}").default,
        list(full),
    )


def _run(fn: Any, args: Any, kwargs: Any = None) -> tuple[Any, BaseException | None]:
    try:
        return fn(*args, **(kwargs or {})), None
    except Exception as exc:
        return None, exc


@pytest.mark.parametrize("op_name", _bridged())
def test_cpp_kernel_is_the_python_kernel(op_name: str, device_type: str, bridge: Any) -> None:
    dev = _DEVICE.get(device_type)
    if dev is None:
        pytest.skip(f"the C++ library-op kernels run on cpu and cuda, not {device_type}")
    op = op_instance(op_name)
    from opmux.kernels.ops._native import AOT, JIT

    if AOT.lane(op_name, dev) is None and JIT.lane(op_name, dev) is None:
        pytest.skip(f"{op_name} has no serving lane on {dev}: its library op runs the Python kernel")
    before = torch_kernels.lane_calls()
    compared = 0
    chosen: list[bool] = []  # per valid case: its default call picks a backend with a lane
    with torch.no_grad():
        for name, make in _cases(op_name, dev):
            args, kwargs = make()
            full = _full(op, args, kwargs)
            if full is None:
                continue
            # bind the lane for this dtype the way serving does: one default call first
            key = full[op.key_arg]
            if isinstance(key, torch.Tensor) and (key.is_cpu or key.is_cuda):
                warm_args, warm_kwargs = make()
                try:
                    op.public(*warm_args, **warm_kwargs)
                except Exception:
                    pass
            cpp, twin, call = _library_call(op, full)
            lane_default = _default_has_lane(op_name, args, kwargs)
            if lane_default is not None:
                chosen.append(lane_default)
            got, err = _run(cpp, call)
            args2, kwargs2 = make()
            full2 = _full(op, args2, kwargs2)
            assert full2 is not None
            _, _, call2 = _library_call(op, full2)
            want, err2 = _run(twin, call2)
            compared += 1
            if err is not None or err2 is not None:
                assert err is not None and err2 is not None, f"{op_name} {name}: {err!r} vs {err2!r}"
                # (torch's own schema errors, raised before any kernel, name the op they parse)
                twin_msg = str(err2).replace("opmux::_py_", "opmux::")
                assert (type(err), str(err)) == (type(err2), twin_msg), f"{op_name} {name}"
                continue
            for a, b in zip(_tensors(call), _tensors(call2), strict=True):
                assert _same(a, b), f"{op_name} {name}: an argument differs after the call"
            theirs, ours = _tensors(call2), _tensors(call)
            for g, w in zip(_tensors(got), _tensors(want), strict=True):
                assert _same(g, w), f"{op_name} {name}: the result differs"
                # a result that is one of the caller's tensors (a buffer, in place) is it on both paths
                at = next((i for i, t in enumerate(theirs) if t is w), None)
                assert (at is None and all(g is not t for t in ours)) or (at is not None and g is ours[at]), (
                    f"{op_name} {name}: a result is not the caller's tensor it is on the Python path"
                )
                assert g.stride() == w.stride(), f"{op_name} {name}: strides {g.stride()} != {w.stride()}"
    assert compared, f"{op_name}: no case compared"
    # Where a vendor backend is the default for some cases (FlashInfer's float32 samplers, where
    # installed) the lane's serving form may be exactly those cases: then no lane is bound and
    # the C++ kernel hands every call to the Python kernel, which the comparison above checked.
    if chosen and all(chosen):
        assert torch_kernels.lane_calls() > before, f"{op_name}: the C++ kernel never ran a lane"


def _default_has_lane(op_name: str, args: Any, kwargs: Any) -> bool | None:
    """Whether the default call of these arguments picks one of opmux's own compiled backends
    (aot / jit: the ones with serving lanes); None for an invalid call (no choice is made)."""
    from opmux.kernels import explain

    try:
        return str(explain(op_name, *args, **kwargs).chosen) in ("aot", "jit")
    except Exception:
        return None


def test_grad_inputs_and_versions(device_type: str, bridge: Any) -> None:
    """Grad inputs get the contract's error, written tensors' versions are bumped in grad mode."""
    dev = _DEVICE.get(device_type)
    if dev is None:
        pytest.skip(f"the C++ library-op kernels run on cpu and cuda, not {device_type}")
    from opmux.kernels import ops

    x = torch.randn(4, 64, device=dev)
    r = torch.randn(4, 64, device=dev)
    w = torch.randn(64, device=dev)
    ops.layernorm.fused_add_rmsnorm(x.clone(), r.clone(), w)  # binds the lane
    ops.layernorm.rmsnorm(x, w)
    before = torch_kernels.lane_calls()
    v = (x._version, r._version)
    torch.ops.opmux.fused_add_rmsnorm.default(x, r, w, 1e-6)
    assert torch_kernels.lane_calls() == before + 1
    assert (x._version, r._version) == (v[0] + 1, v[1] + 1)
    with torch.no_grad():
        torch.ops.opmux.fused_add_rmsnorm.default(x, r, w, 1e-6)
    assert (x._version, r._version) == (v[0] + 1, v[1] + 1)  # no bump without grad mode, as the default call
    wg = w.clone().requires_grad_()
    with pytest.raises(ValueError) as cpp:
        torch.ops.opmux.rmsnorm.default(x, wg, 1e-6)
    with pytest.raises(ValueError) as public:
        ops.layernorm.rmsnorm(x, wg)
    assert str(cpp.value) == str(public.value)
    with torch.no_grad():  # not a grad call: the lane runs
        y = torch.ops.opmux.rmsnorm.default(x, wg, 1e-6)
    assert not y.requires_grad and torch.equal(y, ops.layernorm.rmsnorm(x, w))
    with torch.inference_mode():  # inference tensors (a serving KV cache, ...) have no version
        xi, ri = x.clone(), r.clone()
    xp, rp = xi.clone(), ri.clone()
    before = torch_kernels.lane_calls()
    torch.ops.opmux.fused_add_rmsnorm.default(xi, ri, w, 1e-6)  # grad mode on, as above
    assert torch_kernels.lane_calls() == before + 1
    torch.ops.opmux._py_fused_add_rmsnorm.default(xp, rp, w, 1e-6)
    assert torch.equal(xi, xp) and torch.equal(ri, rp)


def test_refused_forms_and_invalidation(device_type: str, bridge: Any) -> None:
    """A form the lane refuses takes the Python kernel; forcing another backend (use_backends)
    drops the bound lanes, so the C++ kernel no longer bypasses the choice."""
    dev = _DEVICE.get(device_type)
    if dev is None:
        pytest.skip(f"the C++ library-op kernels run on cpu and cuda, not {device_type}")
    from opmux.kernels import ops, use_backends

    x = torch.randn(3, 5, 64, device=dev)  # 3-D: not the lane's [T, H] form
    w = torch.randn(64, device=dev)
    ops.layernorm.rmsnorm(x[0], w)
    before = torch_kernels.lane_calls()
    y = torch.ops.opmux.rmsnorm.default(x, w, 1e-6)
    torch.testing.assert_close(y, ops.layernorm.rmsnorm(x, w, backend="torch"), atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError) as cpp:
        torch.ops.opmux.rmsnorm.default(x, w, -1.0)
    with pytest.raises(ValueError) as public:
        ops.layernorm.rmsnorm(x, w, -1.0)
    assert str(cpp.value) == str(public.value)
    two_d = x[0].contiguous()
    torch.ops.opmux.rmsnorm.default(two_d, w, 1e-6)
    ran = torch_kernels.lane_calls()
    with use_backends("layernorm.rmsnorm=torch"):
        torch.ops.opmux.rmsnorm.default(two_d, w, 1e-6)
    assert torch_kernels.lane_calls() == ran  # the forced choice ran, not the bound lane
    assert ran > before


def test_tracing_sees_every_library_call(device_type: str, bridge: Any) -> None:
    """Tracing drops the bound lanes (the bridge's too), so each torch.ops call is recorded by the
    Python kernel with the backend it chose; after tracing, the C++ kernel takes over again."""
    dev = _DEVICE.get(device_type)
    if dev is None:
        pytest.skip(f"the C++ library-op kernels run on cpu and cuda, not {device_type}")
    from opmux.kernels import ops, tracing

    x, w = torch.randn(2, 64, device=dev), torch.randn(64, device=dev)
    ops.layernorm.rmsnorm(x, w)
    torch.ops.opmux.rmsnorm.default(x, w, 1e-6)
    ran = torch_kernels.lane_calls()
    with tracing.capture() as calls:
        for _ in range(3):
            torch.ops.opmux.rmsnorm.default(x, w, 1e-6)
    assert torch_kernels.lane_calls() == ran
    assert [c.op for c in calls].count("layernorm.rmsnorm") == 3
    ops.layernorm.rmsnorm(x, w)  # binds again
    torch.ops.opmux.rmsnorm.default(x, w, 1e-6)
    assert torch_kernels.lane_calls() == ran + 1


@pytest.mark.filterwarnings(
    "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
)  # (inductor's)
def test_compiled_graph_runs_the_cpp_kernels(device_type: str, bridge: Any) -> None:
    """What torch.compile's graph calls (the library ops) runs the C++ kernels, with the eager
    results, the in-place op's writes included."""
    dev = _DEVICE.get(device_type)
    if dev is None:
        pytest.skip(f"the C++ library-op kernels run on cpu and cuda, not {device_type}")
    from opmux.kernels import ops

    def f(x: torch.Tensor, r: torch.Tensor, w: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
        y = ops.activation.silu_and_mul(torch.cat([x, x], -1))
        ops.layernorm.fused_add_rmsnorm(y, r, w)
        tw, ti = ops.moe.topk_softmax(g, 4)
        return y, r, tw, ti

    x, r, w = torch.randn(4, 128, device=dev), torch.randn(4, 128, device=dev), torch.randn(128, device=dev)
    g = torch.randn(4, 16, device=dev)
    with torch.no_grad():
        want = f(x.clone(), r.clone(), w, g)  # (binds the lanes)
        compiled = torch.compile(f, fullgraph=True)
        compiled(x.clone(), r.clone(), w, g)
        before, entered = torch_kernels.lane_calls(), torch_kernels.op_calls()
        got = compiled(x.clone(), r.clone(), w, g)
    assert torch_kernels.lane_calls() == before + 3
    assert torch_kernels.op_calls() == entered + 3  # (the graph's calls take the bridge's entry)
    for a, b in zip(got, want, strict=True):
        assert torch.equal(a, b)


def _torch_entry(name: str) -> tuple[Any, Any]:
    """(``torch.ops.opmux.<name>.default``, torch's own entry into it, which the bridge's wraps)."""
    overload = getattr(torch.ops.opmux, name).default
    assert type(overload._op).__name__ == "OpCall", f"{name}: torch.ops has no bridge entry"
    return overload, overload._op.__wrapped__


def _same_outcome(got: tuple[Any, BaseException | None], want: tuple[Any, BaseException | None]) -> bool:
    """Two ``_run`` outcomes: the same results, or the same error class and message."""
    (a, err), (b, err2) = got, want
    if err is not None or err2 is not None:
        return err is not None and err2 is not None and (type(err), str(err)) == (type(err2), str(err2))
    ta, tb = _tensors(a), _tensors(b)
    return len(ta) == len(tb) and all(_same(x, y) for x, y in zip(ta, tb, strict=True))


def test_torch_ops_entry_is_torchs_entry(device_type: str, bridge: Any) -> None:
    """``torch.ops.opmux.<name>`` and its default overload call through the bridge's entry
    (OpCall): same results, same errors, same hash as torch's entry for every way of passing the
    arguments; what it does not take (wrong types, unknown keywords, a torch-function mode, a tensor
    subclass) is torch's own entry's."""
    dev = _DEVICE.get(device_type)
    if dev is None:
        pytest.skip(f"the C++ library-op kernels run on cpu and cuda, not {device_type}")
    from opmux.kernels import ops

    g = torch.randn(3, 16, device=dev)
    ops.moe.topk_softmax(g, 4)  # (defines the library op and binds the lane)
    overload, torchs = _torch_entry("topk_softmax")
    packet = torch.ops.opmux.topk_softmax
    assert type(packet._op).__name__ == "OpCall"
    # OpOverload / OpOverloadPacket hash as their _op: the entry keeps torch's hash
    assert hash(overload) == hash(torchs) and hash(packet) == hash(packet._op.__wrapped__)
    assert torch.jit._builtins._find_builtin(packet.op) == "opmux::topk_softmax"
    assert overload.op.__name__ == torchs.__name__
    bias = torch.randn(16, device=dev)
    calls: list[tuple[tuple[Any, ...], dict[str, Any], bool]] = [
        # (args, kwargs, whether the bridge's entry takes the call itself)
        ((g, 4), {}, True),
        ((g, 4, True), {}, True),
        ((g, 4), {"renormalize": True, "correction_bias": bias}, True),
        ((g,), {"topk": 2, "moe_softcapping": 30.0}, True),
        ((g, 4, False, None, 0.0, False, None, None, None), {}, True),
        ((g, 4), {"topk_weights": torch.empty(3, 4, device=dev)}, True),
        ((g, 0), {}, True),  # (the contract's error, raised by the Python kernel behind the C++ one)
        ((g, 4), {"moe_softcapping": 1}, False),  # an int for a float: torch converts it
        ((g, 4.0), {}, False),  # torch's schema error
        ((g, True), {}, False),
        ((g, "4"), {}, False),
        ((None, 4), {}, False),
        ((g,), {}, False),  # topk missing
        ((g, 4), {"top_k": 4}, False),
        ((g, 4), {"topk": 4}, False),  # given twice
        ((g, 4, False, None, 0.0, False, None, None, None, None), {}, False),  # too many
        ((g.double(), 4), {}, True),
        ((g.t(), 4), {}, True),
    ]
    with torch.no_grad():
        for args, kwargs, taken in calls:
            before = torch_kernels.op_calls()
            got = _run(overload, args, kwargs)
            assert (torch_kernels.op_calls() > before) == taken, f"{args[1:]} {kwargs}"
            assert _same_outcome(got, _run(torchs, args, kwargs)), f"{args[1:]} {kwargs}: {got}"
            assert _same_outcome(_run(packet, args, kwargs), got), f"{args[1:]} {kwargs}"

        class Seen(torch.Tensor):
            seen = 0

            @classmethod
            def __torch_function__(cls, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                cls.seen += 1
                return super().__torch_function__(func, types, args, kwargs or {})

        class Mode(torch.overrides.TorchFunctionMode):
            funcs: ClassVar[list[Any]] = []

            def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                self.funcs.append(func)
                return func(*args, **(kwargs or {}))

        before = torch_kernels.op_calls()
        overload(g.as_subclass(Seen), 4)
        assert Seen.seen >= 1 and torch_kernels.op_calls() == before  # torch's entry ran its protocol
        with Mode():  # (the mode's own call of the op, made with the mode off, takes the entry)
            overload(g, 4)
        assert Mode.funcs == [overload] and torch_kernels.op_calls() == before + 1

        from torch.utils._python_dispatch import TorchDispatchMode

        class Dispatched(TorchDispatchMode):
            funcs: ClassVar[list[Any]] = []

            def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
                self.funcs.append(func)
                return func(*args, **(kwargs or {}))

        with Dispatched():  # the entry calls the dispatcher: a dispatch mode sees the call
            overload(g, 4)
        assert overload in Dispatched.funcs and torch_kernels.op_calls() == before + 3  # (+ its own call)


def test_torch_ops_entry_as_an_object(device_type: str, bridge: Any) -> None:
    """The entry swapped onto a library op that did not have it keeps the op objects' hashes (sets
    and dicts made before still find them), copies as itself, takes weak references, cannot be
    made from Python, and leaves torch.overrides.redispatch_function (torch 2.13 on) to torch's
    entry."""
    import copy
    import weakref

    dev = _DEVICE.get(device_type)
    if dev is None:
        pytest.skip(f"the C++ library-op kernels run on cpu and cuda, not {device_type}")
    entry = torch_kernels._entry
    assert entry is not None, "the bridge has no Python entry (no interpreter headers?)"
    lib = torch.library.Library("opmux_entry_test", "DEF")  # (a fresh op: nothing attached yet)
    try:
        lib.define("scale(Tensor x, float a=2.0, bool neg=False) -> Tensor")
        lib.impl("scale", lambda x, a=2.0, neg=False: x * (-a if neg else a), "CompositeExplicitAutograd")
        packet = torch.ops.opmux_entry_test.scale
        overload = packet.default
        keys, table = {overload, packet}, {overload: 1, packet: 2}
        for holder in (overload, packet):
            holder._op = entry.op_call("opmux_entry_test::scale", holder._op)
        call = overload._op
        assert type(call).__name__ == "OpCall"
        assert overload in keys and packet in keys and table[overload] == 1 and table[packet] == 2
        assert copy.copy(call) is call and copy.deepcopy(call) is call and copy.deepcopy(overload) is overload
        assert weakref.ref(call)() is call
        with pytest.raises(TypeError):
            type(call)()
        x = torch.randn(4, device=dev)
        before = torch_kernels.op_calls()
        assert torch.equal(overload(x, 3.0, neg=True), -3.0 * x) and torch.equal(packet(x), 2.0 * x)
        assert torch_kernels.op_calls() == before + 2
        redispatch = getattr(torch.overrides, "redispatch_function", None)  # (torch 2.13 on)
        if redispatch is not None:  # its skip-one-hop flag is consumed by torch's entry
            assert torch.equal(redispatch(overload, (), (x,), {"a": 0.5}), 0.5 * x)
    finally:
        lib._destroy()


def _entry_ops() -> list[str]:
    from opmux.kernels.fused_op import FusedOp

    out = []
    for name in _bridged():
        op: FusedOp[Any] = op_instance(name)
        if op.entry_form:
            out.append(name)
    return out


def _default(op: Any, make: Any, *, entries: bool) -> tuple[Any, BaseException | None, list[Any], int]:
    """A default call of ``make()``'s arguments after one binding call, with the bridge's entries
    or the plain tvm-ffi lanes: (result, error, its tensor arguments, what was bound: 0 nothing,
    1 a lane, 2 an entry)."""
    from opmux.kernels import _env
    from opmux.kernels.fused_op import _ENTRY_TYPE

    op.invalidate()
    # (all inside the scope: leaving it drops every op's bound choices, config._notify)
    with _env.scope(OPMUX_TORCH_KERNELS="all" if entries else "off"):
        try:
            op.public(*make()[0], **make()[1])  # binds the lane (an entry where the scope allows)
        except Exception:
            pass
        args, kwargs = make()
        key = _full(op, args, kwargs)
        bound = 0
        if key is not None and isinstance(key[op.key_arg], torch.Tensor):
            x = key[op.key_arg]
            lane = (op._lane_cpu if x.is_cpu else op._lane_cuda).get(x.dtype)
            bound = 0 if lane is None else 2 if type(lane[0]) is _ENTRY_TYPE else 1
        try:
            got, err = op.public(*args, **kwargs), None
        except Exception as exc:
            got, err = None, exc
    return got, err, [*args, *kwargs.values()], bound


@pytest.mark.parametrize("op_name", _entry_ops())
def test_default_entry_is_the_lane_call(op_name: str, device_type: str, bridge: Any) -> None:
    """The default call's entry into its lane (torch_kernels.lane_entry; FusedOp.entry_form: in
    place, one fresh result, several results) is the tvm-ffi lane call (with Python-allocated
    outputs for several results): on every parity, invalid and corpus
    case, the same results bit for bit (dtypes, shapes, strides, fresh tensors) or the same error
    class and message, and the entry really ran."""
    dev = _DEVICE.get(device_type)
    if dev is None:
        pytest.skip(f"the bridge's entries run on cpu and cuda, not {device_type}")
    op = op_instance(op_name)
    before = torch_kernels.entry_calls()
    compared = lanes = 0
    try:
        with torch.no_grad():
            for name, make in _cases(op_name, dev):
                want, err2, theirs, plain = _default(op, make, entries=False)
                got, err, ours, entry = _default(op, make, entries=True)
                # wherever a default call binds a lane, the entry is bound instead
                assert entry == (2 if plain else 0), f"{op_name} {name}: bound {entry} vs {plain}"
                lanes += plain > 0
                compared += 1
                if err is not None or err2 is not None:
                    assert err is not None and err2 is not None, f"{op_name} {name}: {err!r} vs {err2!r}"
                    assert (type(err), str(err)) == (type(err2), str(err2)), f"{op_name} {name}"
                    continue
                for a, b in zip(_tensors(ours), _tensors(theirs), strict=True):
                    assert _same(a, b), f"{op_name} {name}: an argument differs after the call"
                for g, w in zip(_tensors(got), _tensors(want), strict=True):
                    assert _same(g, w), f"{op_name} {name}: the result differs"
                    assert g.stride() == w.stride(), f"{op_name} {name}: strides {g.stride()} != {w.stride()}"
                    in_theirs = any(w is t for t in _tensors(theirs))
                    assert in_theirs == any(g is t for t in _tensors(ours)), (
                        f"{op_name} {name}: buffer identity"
                    )
    finally:
        op.invalidate()
    assert compared, f"{op_name}: no case compared"
    if not lanes:
        pytest.skip(f"{op_name}: its default backend on {dev} has no serving lane")
    assert torch_kernels.entry_calls() > before, f"{op_name}: the entry never ran a lane"


def _topk_softmax_entry_case(device_type: str) -> tuple[str, Any, torch.Tensor]:
    """(device, topk_softmax's op with no bound choices, gating [3, 16]) for the entry tests."""
    dev = _DEVICE.get(device_type)
    if dev is None:
        pytest.skip(f"the bridge's entries run on cpu and cuda, not {device_type}")
    op = op_instance("moe.topk_softmax")
    op.invalidate()
    return dev, op, torch.randn(3, 16, device=dev)


def test_entry_grad_and_refusals(device_type: str, bridge: Any) -> None:
    """Through the entry: a grad input gets the contract's error, a form the lane refuses (caller
    buffers, a 3-D gating) the contract's path, torch's errors and values as before."""
    dev, op, g = _topk_softmax_entry_case(device_type)
    from opmux.kernels import _env, ops
    from opmux.kernels.fused_op import _ENTRY_TYPE

    with _env.scope(OPMUX_TORCH_KERNELS="all"):  # (leaving it drops the bound choices)
        ops.moe.topk_softmax(g, 4)
        lanes = op._lane_cpu if g.is_cpu else op._lane_cuda
        assert type(lanes[g.dtype][0]) is _ENTRY_TYPE
        before = torch_kernels.entry_calls()
        w, ids = ops.moe.topk_softmax(g, 4, renormalize=True)
        assert torch_kernels.entry_calls() == before + 1
        ref_w, ref_ids = ops.moe.topk_softmax(g, 4, renormalize=True, backend="torch")
        torch.testing.assert_close(w, ref_w)
        assert (
            torch.equal(ids, ref_ids.to(ids.dtype)) and ids.dtype == torch.int32 and w.dtype == torch.float32
        )
        with pytest.raises(ValueError) as err:  # topk > experts: the lane refuses, the contract names it
            ops.moe.topk_softmax(g, 20)
        assert "topk" in str(err.value)
        gg = g.clone().requires_grad_()
        with pytest.raises(ValueError, match="grad"):
            ops.moe.topk_softmax(gg, 4)
        bw, bids = torch.empty(3, 4, device=dev), torch.empty(3, 4, device=dev, dtype=torch.int32)
        rw, rids = ops.moe.topk_softmax(g, 4, renormalize=True, topk_weights=bw, topk_ids=bids)
        assert rw is bw and rids is bids and torch.equal(bids, ids)  # caller buffers: not the entry
        assert torch_kernels.entry_calls() == before + 1
    op.invalidate()


def test_forced_calls_take_their_own_entry(device_type: str, bridge: Any) -> None:
    """A forced call (``backend=`` the default's native backend) binds an entry of its own (its own
    bridge id: the default's id is also its torch.ops kernel's), runs through it with the default
    call's results, and leaves the default's entry running its lane."""
    _, op, g = _topk_softmax_entry_case(device_type)
    from opmux.kernels import _env, ops
    from opmux.kernels.fused_op import _ENTRY_TYPE

    with _env.scope(OPMUX_TORCH_KERNELS="all"), torch.no_grad():
        want = ops.moe.topk_softmax(g, 4)
        native = [b for (b, d) in op._kernels if d == ("cpu" if g.is_cpu else "cuda")]
        assert native, "the default call bound no native kernel"
        for backend in native:
            ops.moe.topk_softmax(g, 4, backend=backend)
            lane = op._lane_forced[(backend, g.is_cpu, g.dtype)]
            assert type(lane[0]) is _ENTRY_TYPE, backend
            before = torch_kernels.entry_calls()
            got = ops.moe.topk_softmax(g, 4, backend=backend)
            assert torch_kernels.entry_calls() == before + 1, backend
            assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True)), backend
        before = torch_kernels.entry_calls()
        again = ops.moe.topk_softmax(g, 4)
        assert torch_kernels.entry_calls() == before + 1
        assert all(torch.equal(a, b) for a, b in zip(again, want, strict=True))
    op.invalidate()
