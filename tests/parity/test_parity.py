"""Every backend of every op against the reference, driven by the op specs.

A new backend is tested by registering it: cells come from the registry, cases from
the op's ``samples``, tolerances from its spec. Each cell also checks against the
reference computed in float64 on the CPU, and that inputs not meant to change did not.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from parity_samples import invalid as invalid_samples
from parity_samples import samples as op_samples

from opmux.kernels import registry
from opmux.kernels.errors import CallRefused
from opmux.kernels.explain import op_instance
from opmux.kernels.selector import Reason

DTYPES = ("float32", "float16", "bfloat16")


def _cell_dtypes(spec: Any) -> tuple[str, ...]:
    """The float dtypes for every op, plus any other dtype a backend declares (e.g. int32 ids)."""
    extra = sorted({d for b in spec.backends for d in b.requires.dtypes} - set(DTYPES))
    return (*DTYPES, *extra)


CELLS = [
    (op, b.name, d)
    for op, spec in registry.all_ops().items()
    for b in spec.backends
    for d in _cell_dtypes(spec)
]
_TORCH_DEVICE = {"cpu": "cpu", "cuda": "cuda", "hip": "cuda", "xpu": "xpu", "npu": "npu"}
#: the capabilities of opmux's own kernels; a backend needing any other is a vendor library's
_OWN_CAPABILITIES = ("triton", "jit:", "aot:")


def _is_vendor(spec: Any, backend: str) -> bool:
    """A vendor library's backend (FlashInfer, torch_npu): what it declines is its predicate's
    statement of the library's limits (head dims, dtypes, layouts) or a CallRefused, so such a
    sample is not a case for it. opmux's own backends state their exceptions in the samples."""
    caps = spec.backend(backend).requires.capabilities
    return any(not c.startswith(_OWN_CAPABILITIES) for c in caps)


def _tensors(result: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[torch.Tensor]:
    results = result if isinstance(result, (tuple, list)) else (result,)
    out = [r for r in results if isinstance(r, torch.Tensor)]
    out += [a for a in args if isinstance(a, torch.Tensor)]
    out += [v for _, v in sorted(kwargs.items()) if isinstance(v, torch.Tensor)]
    return out


def _tolerance(spec: Any, cell_dtype: str, t: torch.Tensor) -> tuple[float, float]:
    """An output whose dtype differs from the cell's (fp32 scales, fp8 or int32 outputs) uses the
    spec's tolerance for that dtype when declared; other non-float outputs must match exactly."""
    name = str(t.dtype).removeprefix("torch.")
    tols = dict(spec.tolerances)
    if name != cell_dtype and name in tols:
        return tols[name]
    if not t.is_floating_point():
        return (0.0, 0.0)
    return spec.tolerance(cell_dtype)


def _comparable(t: torch.Tensor) -> torch.Tensor:
    """fp8 has no arithmetic in torch: compare its values as float32."""
    return t.float() if t.is_floating_point() and t.element_size() == 1 else t


def _to64(v: Any) -> Any:
    """The oracle runs on the CPU: every tensor moves there, floats become float64."""
    if isinstance(v, torch.Tensor):
        v = v.detach().to("cpu")
        return v.to(torch.float64) if v.is_floating_point() else v
    return v


@pytest.mark.parametrize(("op_name", "backend", "dtype"), CELLS, ids=["-".join(c) for c in CELLS])
def test_parity(
    op_name: str, backend: str, dtype: str, matrix: Any, device_type: str, request: pytest.FixtureRequest
) -> None:
    spec = registry.get(op_name)
    req = spec.backend(backend).requires
    if device_type not in req.devices:
        matrix.add(op_name, backend, dtype, "n/a", f"runs on {'/'.join(req.devices)}")
        pytest.skip(f"{backend} runs on {'/'.join(req.devices)}, not {device_type}")
    if dtype not in req.dtypes:
        matrix.add(op_name, backend, dtype, "n/a", "dtype not supported")
        pytest.skip(f"{backend} does not support {dtype}")
    op = op_instance(op_name)
    samples = op_samples(spec)
    tdev, tdtype = _TORCH_DEVICE[device_type], getattr(torch, dtype)
    cases = 0
    declined: list[str] = []  # a vendor backend's refusals, by sample
    vendor = _is_vendor(spec, backend)
    try:
        for i, sample in enumerate(samples(tdev, tdtype)):
            if backend in dict(sample.skip):
                continue
            sel = op.select_for(sample.args, sample.kwargs, backend)
            why = sel.decision(backend)
            if vendor and why.reason == Reason.BAD_ARGUMENTS:
                declined.append(f"{sample.name}: {why.detail}")
                continue
            if (
                sel.chosen != backend
                and request.config.getoption("--allow-tree")
                and why.reason
                and why.reason.is_environmental
            ):
                matrix.add(op_name, backend, dtype, "skipped", f"{why.reason.value}: {why.detail}")
                pytest.skip(f"source tree: {why.reason.value}: {why.detail}")
            assert sel.chosen == backend, f"{backend} was not selectable:\n{sel.trace_str()}"
            kwargs = dict(sample.kwargs)
            for k, v in kwargs.items():
                if k == "out" and isinstance(v, torch.Tensor):
                    v.fill_(float("nan"))  # every element must be written
            try:
                result = op.impl(backend)(*sample.args, **kwargs)
            except CallRefused as exc:
                if not vendor:
                    raise
                declined.append(f"{sample.name}: {exc}")
                continue
            got = _tensors(result, sample.args, kwargs)
            ref_sample = samples(tdev, tdtype)[i]
            want = _tensors(
                op.forward_native(*ref_sample.args, **ref_sample.kwargs), ref_sample.args, ref_sample.kwargs
            )
            o_sample = samples(tdev, tdtype)[i]
            a64 = tuple(_to64(a) for a in o_sample.args)
            k64 = {k: _to64(v) for k, v in o_sample.kwargs.items()}
            oracle = _tensors(op.forward_native(*a64, **k64), a64, k64)
            assert len(got) == len(want) == len(oracle), "backend and reference returned different outputs"
            for j, (g, w, o) in enumerate(zip(got, want, oracle, strict=True)):
                msg = f"case {sample.name!r}, output {j}"
                atol, rtol = _tolerance(spec, dtype, g)
                torch.testing.assert_close(
                    _comparable(g),
                    _comparable(w),
                    atol=atol,
                    rtol=rtol,
                    msg=lambda m, msg=msg: f"{msg} vs reference: {m}",
                )
                torch.testing.assert_close(
                    _comparable(g).cpu().double(),
                    _comparable(o).cpu().double(),
                    atol=2 * atol,
                    rtol=2 * rtol,
                    msg=lambda m, msg=msg: f"{msg} vs float64 oracle: {m}",
                )
            cases += 1
    except Exception as exc:
        matrix.add(
            op_name,
            backend,
            dtype,
            "failed",
            f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}",
            cases,
        )
        raise
    assert cases > 0, f"{op_name}: no sample applies to {backend}; it declined {declined}"
    detail = f"declined {len(declined)} samples (its predicate / CallRefused)" if declined else ""
    matrix.add(op_name, backend, dtype, "passed", detail, cases)


INVALID = [
    (op, b)
    for op, spec in registry.all_ops().items()
    for b in ("default", *[x.name for x in spec.backends if x.name in ("aot", "jit", "triton")])
]


@pytest.mark.parametrize(("op_name", "backend"), INVALID, ids=["-".join(c) for c in INVALID])
def test_bad_input_is_rejected(op_name: str, backend: str, device_type: str) -> None:
    """Wrong dtype, shape, device or layout: a clear error, never a crash or a silent result."""
    spec = registry.get(op_name)
    if backend != "default" and device_type not in spec.backend(backend).requires.devices:
        pytest.skip(f"{backend} does not run on {device_type}")
    op = op_instance(op_name)
    cases = invalid_samples(spec)(_TORCH_DEVICE[device_type])
    assert len(cases) >= 3
    for name, args, kwargs, exc_type, pattern in cases:
        with pytest.raises(exc_type, match=pattern):
            if backend == "default":
                op(*args, **kwargs)
            else:
                op.impl(backend)(*args, **kwargs)
        del name


def test_mixed_devices_rejected(device_type: str, request: pytest.FixtureRequest) -> None:
    if device_type == "cpu":
        pytest.skip("needs a second device type")
    from opmux.kernels.ops.layernorm import rmsnorm

    x = torch.randn(2, 8, device=_TORCH_DEVICE[device_type])
    op = op_instance("layernorm.rmsnorm")
    checked = 0
    for backend in ("triton", "jit", "aot"):
        why = op.select_for((x, torch.ones(8, device=x.device)), {}, backend).decision(backend)
        if request.config.getoption("--allow-tree") and why.reason and why.reason.is_environmental:
            continue  # a source tree has no AOT library: that backend cannot be forced here
        with pytest.raises(ValueError, match="is on"):
            rmsnorm(x, torch.ones(8), backend=backend)
        checked += 1
    assert checked >= 2
