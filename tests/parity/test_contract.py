"""One argument contract for every backend: a corpus of hidden, awkward inputs (strided weights
and positions, partial overlap, written tensors whose elements share memory, NaN and Inf rows, bad scalars, requires-grad inputs, a wrong
``out`` dtype, ``topk`` out of range, ``fused_add_rmsnorm(x, x, w)``) gives the same outcome on
every backend of the op that runs on this device, the reference included: the same error class
and message, or the same values (NaN where the reference has NaN) within the op's tolerance.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from opmux.kernels import registry
from opmux.kernels.errors import BackendUnavailable, CallRefused
from opmux.kernels.explain import op_instance

Args = tuple[tuple[Any, ...], dict[str, Any]]
_TORCH_DEVICE = {"cpu": "cpu", "cuda": "cuda", "hip": "cuda", "xpu": "xpu", "npu": "npu"}


def _g(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _r(*shape: int, seed: int = 0, dev: str = "cpu", dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(shape, generator=_g(seed)).to(dtype=dtype, device=dev)


def _nan_rows(t: torch.Tensor, value: float = float("nan")) -> torch.Tensor:
    t[1] = value
    return t


def _nan_bias(dev: str) -> torch.Tensor:
    b = torch.rand(16, generator=_g(7)).to(dev) * 0.1
    b[[4, 11]] = float("nan")
    return b


def _overlapping(dev: str) -> tuple[torch.Tensor, torch.Tensor]:
    buf = _r(6 * 16, dev=dev)
    return buf[:64].view(4, 16), buf[8:72].view(4, 16)  # the second starts half a row in


def _rope(dev: str, **over: Any) -> Args:
    q, k = _r(4, 2, 16, seed=1, dev=dev), _r(4, 1, 16, seed=2, dev=dev)
    args = {"positions": torch.arange(4, device=dev), "query": q, "key": k, "head_size": 16}
    args["cos_sin_cache"] = _r(8, 16, seed=3, dev=dev)
    args.update(over)
    return (), args


def _pd_lse_in_out(args: Args) -> Args:
    """paged_decode's lse a view into its out's memory: a written tensor overlapping another."""
    out = torch.zeros(2, 4, 16, device=args[1]["query"].device)
    args[1].update(out=out, lse=out[:, :, 0])
    return args


def _corpus(dev: str) -> list[tuple[str, str, Callable[[], Args]]]:
    x, w = (lambda: _r(4, 16, dev=dev)), (lambda: _r(16, seed=1, dev=dev))
    ln, add, act = "layernorm.rmsnorm", "layernorm.fused_add_rmsnorm", "activation.silu_and_mul"
    pt, pg, tk = (
        "quantization.per_token_quant_fp8",
        "quantization.per_token_group_quant_fp8",
        "moe.topk_softmax",
    )
    ptt, pgi = "quantization.per_tensor_quant_fp8", "quantization.per_token_group_quant_int8"
    sg = "quantization.silu_and_mul_per_token_group_quant_fp8"
    kv = "kvcache.reshape_and_cache"
    nq, aq = "layernorm.rmsnorm_static_quant_fp8", "layernorm.fused_add_rmsnorm_static_quant_fp8"

    def sc(v: float) -> torch.Tensor:
        return torch.tensor([v], device=dev)

    pd = "attention.paged_decode"

    def pd_args(**over: Any) -> Args:
        a = {"query": _r(2, 4, 16, seed=1, dev=dev), "key_cache": _r(5, 4, 2, 16, seed=2, dev=dev)}
        a |= {
            "value_cache": _r(5, 4, 2, 16, seed=3, dev=dev),
            "block_tables": torch.tensor([[3, 0], [4, -1]], dtype=torch.int32, device=dev),
            "seq_lens": torch.tensor([7, 2], dtype=torch.int32, device=dev),
        }
        a.update(over)
        return (), a

    pf = "attention.paged_prefill"

    def pf_args(**over: Any) -> Args:
        a = {"query": _r(5, 4, 16, seed=1, dev=dev), "key_cache": _r(5, 4, 2, 16, seed=2, dev=dev)}
        a |= {
            "value_cache": _r(5, 4, 2, 16, seed=3, dev=dev),
            "block_tables": torch.tensor([[3, 0], [4, -1]], dtype=torch.int32, device=dev),
            "seq_lens": torch.tensor([7, 2], dtype=torch.int32, device=dev),
            "cu_seqlens_q": torch.tensor([0, 3, 5], dtype=torch.int32, device=dev),
        }
        a.update(over)
        return (), a

    def kv_args(**over: Any) -> Args:
        k = _r(3, 2, 8, dev=dev)
        a = {"key": k, "value": k.clone(), "key_cache": torch.zeros(2, 4, 2, 8, device=dev)}
        a |= {
            "value_cache": torch.zeros(2, 4, 2, 8, device=dev),
            "slot_mapping": torch.tensor([0, 5, -1], device=dev),
        }
        a.update(over)
        return (), a

    return [
        ("weight-stride-2", ln, lambda: ((x(), _r(32, dev=dev)[::2]), {})),
        ("weight-stride-0", ln, lambda: ((x(), torch.ones(1, device=dev).expand(16)), {})),
        ("eps-zero", ln, lambda: ((x(), w(), 0.0), {})),
        ("eps-negative", ln, lambda: ((x(), w(), -1.0), {})),
        ("eps-nan", ln, lambda: ((x(), w(), float("nan")), {})),
        ("out-int32", ln, lambda: ((x(), w()), {"out": torch.empty(4, 16, dtype=torch.int32, device=dev)})),
        ("out-partial-overlap", ln, lambda: (lambda a, b: ((a, w()), {"out": b}))(*_overlapping(dev))),
        ("out-is-x", ln, lambda: (lambda t: ((t, w()), {"out": t}))(x())),
        ("nan-row", ln, lambda: ((_nan_rows(x()), w()), {})),
        ("inf-row", ln, lambda: ((_nan_rows(x(), float("inf")), w()), {})),
        ("x-requires-grad", ln, lambda: ((x().requires_grad_(), w()), {})),
        ("weight-requires-grad", ln, lambda: ((x(), w().requires_grad_()), {})),
        ("x-is-residual", add, lambda: (lambda t: ((t, t, w()), {}))(x())),
        ("residual-partial-overlap", add, lambda: (lambda a, b: ((a, b, w()), {}))(*_overlapping(dev))),
        ("add-weight-strided", add, lambda: ((x(), _r(4, 16, seed=5, dev=dev), _r(32, dev=dev)[::2]), {})),
        ("add-nan-row", add, lambda: ((_nan_rows(x()), _r(4, 16, seed=5, dev=dev), w()), {})),
        ("q-is-k", "layernorm.qk_norm", lambda: (lambda q: ((q, q, w(), w()), {}))(_r(2, 2, 16, dev=dev))),
        ("out-inside-x", act, lambda: (lambda t: ((t,), {"out": t[:, :8]}))(x())),
        # a written tensor whose own elements share memory: every backend refuses it
        ("out-expanded", act, lambda: ((x(),), {"out": torch.empty(1, 8, device=dev).expand(4, 8)})),
        (
            "out-row-windows",
            ln,
            lambda: ((x(), w()), {"out": torch.empty(64, device=dev).as_strided((4, 16), (8, 1))}),
        ),
        ("residual-expanded", add, lambda: ((x(), _r(1, 16, seed=5, dev=dev).expand(4, 16), w()), {})),
        ("out-strided-rows", act, lambda: ((x(),), {"out": torch.empty(4, 16, device=dev)[:, :8]})),
        ("out-float16", act, lambda: ((x(),), {"out": torch.empty(4, 8, dtype=torch.float16, device=dev)})),
        ("act-requires-grad", act, lambda: ((x().requires_grad_(),), {})),
        ("act-nan-row", act, lambda: ((_nan_rows(x()),), {})),
        (
            "positions-strided",
            "rope.rotary_embedding",
            lambda: _rope(dev, positions=torch.arange(8, device=dev)[::2]),
        ),
        (
            "cache-last-dim-strided",
            "rope.rotary_embedding",
            lambda: _rope(dev, cos_sin_cache=_r(8, 32, dev=dev)[:, ::2]),
        ),
        (
            "cache-row-strided",
            "rope.rotary_embedding",
            lambda: _rope(dev, cos_sin_cache=_r(8, 24, dev=dev)[:, :16]),
        ),
        (
            "query-is-key",
            "rope.rotary_embedding",
            lambda: (lambda q: _rope(dev, query=q, key=q))(_r(4, 2, 16, dev=dev)),
        ),
        ("head-size-zero", "rope.rotary_embedding", lambda: _rope(dev, head_size=0)),
        (
            "rope-nan-query",
            "rope.rotary_embedding",
            lambda: _rope(dev, query=_nan_rows(_r(4, 2, 16, dev=dev))),
        ),
        ("quant-nan-row", pt, lambda: ((_nan_rows(x()),), {})),
        ("group-quant-nan-row", pg, lambda: ((_nan_rows(_r(4, 256, dev=dev)),), {})),
        ("group-quant-eps-zero", pg, lambda: ((_r(4, 256, dev=dev),), {"eps": 0.0})),
        ("silu-group-nan-row", sg, lambda: ((_nan_rows(_r(4, 512, dev=dev)),), {})),
        ("silu-group-eps-zero", sg, lambda: ((_r(4, 512, dev=dev),), {"eps": 0.0})),
        ("silu-group-odd-width", sg, lambda: ((_r(4, 257, dev=dev),), {})),
        ("group-size-not-dividing", pg, lambda: ((_r(4, 200, dev=dev),), {"group_size": 128})),
        (
            "quant-out-q-strided-rows",
            pt,
            lambda: ((x(),), {"out_q": torch.zeros(4, 32, dtype=torch.float8_e4m3fn, device=dev)[:, :16]}),
        ),
        (
            "quant-out-scale-strided",
            pt,
            lambda: ((x(),), {"out_scale": torch.zeros(8, device=dev)[::2]}),
        ),
        ("per-tensor-nan-row", ptt, lambda: ((_nan_rows(x()),), {})),
        ("per-tensor-zero", ptt, lambda: ((torch.zeros(4, 16, device=dev),), {})),
        ("per-tensor-static-nan", ptt, lambda: ((x(), torch.tensor([float("nan")], device=dev)), {})),
        (
            "per-tensor-static-is-out",
            ptt,
            lambda: (lambda s: ((x(), s), {"out_scale": s}))(torch.tensor([0.01], device=dev)),
        ),
        ("int8-group-nan-row", pgi, lambda: ((_nan_rows(_r(4, 64, dev=dev)), 32), {})),
        ("int8-group-inf-row", pgi, lambda: ((_nan_rows(_r(4, 64, dev=dev), float("inf")), 32), {})),
        (
            "ue8m0-packed-nan-row",
            pg,
            lambda: (
                (_nan_rows(_r(4, 96, dev=dev)), 16),
                {"scale_ue8m0": True, "out_scale": torch.zeros(4, 2, dtype=torch.int32, device=dev)},
            ),
        ),
        (
            "group-out-scale-overlap",
            pg,
            lambda: ((_r(4, 256, dev=dev),), {"out_scale": torch.zeros(1, device=dev).expand(4, 2)}),
        ),
        (
            "group-out-q-overlaps-scale",
            pgi,
            lambda: (
                lambda b: (
                    (_r(4, 64, dev=dev), 32),
                    {"out_q": b[:256].view(4, 64), "out_scale": b[240:272].view(torch.float32).view(4, 2)},
                )
            )(torch.zeros(512, dtype=torch.int8, device=dev)),
        ),
        ("topk-above-experts", tk, lambda: ((x(), 20), {})),
        ("topk-nan-row", tk, lambda: ((_nan_rows(x()), 3), {})),
        ("topk-nan-renormalize", tk, lambda: ((_nan_rows(x()), 3, True), {})),
        ("topk-one-nan", tk, lambda: (lambda t: (t.__setitem__((2, 5), float("nan")), ((t, 3), {}))[1])(x())),
        # a NaN correction_bias: its key ranks first (as torch.sort has it), the weights stay finite
        ("topk-nan-bias", tk, lambda: ((x(), 3), {"correction_bias": _nan_bias(dev), "renormalize": True})),
        (
            "topk-sigmoid-nan-bias",
            "moe.topk_sigmoid",
            lambda: ((x(), 3), {"correction_bias": _nan_bias(dev)}),
        ),
        ("topk-zero", tk, lambda: ((x(), 0), {})),
        ("topk-requires-grad", tk, lambda: ((x().requires_grad_(), 2), {})),
        (
            "block-size-zero",
            "moe.moe_align_block_size",
            lambda: ((torch.zeros(2, 2, dtype=torch.int32, device=dev), 0, 4), {}),
        ),
        (
            "caches-are-one-tensor",
            kv,
            lambda: (lambda c: kv_args(key_cache=c, value_cache=c))(torch.zeros(2, 4, 2, 8, device=dev)),
        ),
        ("kv-requires-grad", kv, lambda: kv_args(key=_r(3, 2, 8, dev=dev).requires_grad_())),
        ("norm-quant-nan-row", nq, lambda: ((_nan_rows(x()), w(), sc(0.05)), {})),
        ("norm-quant-inf-row", nq, lambda: ((_nan_rows(x(), float("inf")), w(), sc(0.05)), {})),
        ("norm-quant-scale-nan", nq, lambda: ((x(), w(), sc(float("nan"))), {})),
        ("norm-quant-scale-zero", nq, lambda: ((x(), w(), sc(0.0)), {})),
        ("norm-quant-weight-stride-2", nq, lambda: ((x(), _r(32, dev=dev)[::2], sc(0.05)), {})),
        ("add-quant-nan-row", aq, lambda: ((_nan_rows(x()), _r(4, 16, seed=5, dev=dev), w(), sc(0.05)), {})),
        ("add-quant-residual-is-x", aq, lambda: (lambda t: ((t, t, w(), sc(0.05)), {}))(x())),
        (
            "add-quant-x-overlaps-residual",
            aq,
            lambda: (lambda p: ((p[0], p[1], w(), sc(0.05)), {}))(_overlapping(dev)),
        ),
        ("paged_decode-out-is-query", pd, lambda: (lambda a: a[1].update(out=a[1]["query"]) or a)(pd_args())),
        (
            "paged_decode-one-cache-tensor",
            pd,
            lambda: (lambda a: a[1].update(value_cache=a[1]["key_cache"]) or a)(pd_args()),
        ),
        (
            "paged_decode-query-requires-grad",
            pd,
            lambda: pd_args(query=_r(2, 4, 16, seed=4, dev=dev).requires_grad_()),
        ),
        (
            "paged_decode-lse-overlaps-out",
            pd,
            lambda: _pd_lse_in_out(pd_args()),
        ),
        ("paged_decode-window-bool", pd, lambda: pd_args(window_left=True)),
        (
            "paged_prefill-out-is-query",
            pf,
            lambda: (lambda a: a[1].update(out=a[1]["query"]) or a)(pf_args()),
        ),
        (
            "paged_prefill-one-cache-tensor",
            pf,
            lambda: (lambda a: a[1].update(value_cache=a[1]["key_cache"]) or a)(pf_args()),
        ),
        ("paged_prefill-nan-query-row", pf, lambda: pf_args(query=_nan_rows(_r(5, 4, 16, seed=1, dev=dev)))),
        ("paged_prefill-window-bool", pf, lambda: pf_args(window_left=True)),
        (
            "paged_prefill-cu-seqlens-float",
            pf,
            lambda: pf_args(cu_seqlens_q=torch.tensor([0.0, 3.0, 5.0], device=dev)),
        ),
    ]


CASES = _corpus("cpu")  # ids only: each test builds its case on the device under test


def _outcome(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, ...]:
    try:
        result = fn(*args, **kwargs)
    except (TypeError, ValueError) as exc:
        return ("raises", type(exc).__name__, str(exc))
    results = result if isinstance(result, tuple) else (result,)
    out = [r for r in results if isinstance(r, torch.Tensor)]
    out += [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    return ("returns", [t.detach().float().cpu() for t in out])


# Triton's CPU interpreter computes with numpy, which warns about NaN and Inf arithmetic
@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:All-NaN slice encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")
@pytest.mark.filterwarnings("ignore:divide by zero encountered:RuntimeWarning")
@pytest.mark.parametrize("index", range(len(CASES)), ids=[c[0] for c in CASES])
def test_every_backend_has_the_same_outcome(
    index: int, device_type: str, request: pytest.FixtureRequest
) -> None:
    name, op_name, make = _corpus(_TORCH_DEVICE[device_type])[index]
    spec = registry.get(op_name)
    op = op_instance(op_name)
    outcomes: dict[str, tuple[Any, ...]] = {}
    for backend in ("reference", *spec.backend_names):
        if backend != "reference" and device_type not in spec.backend(backend).requires.devices:
            continue
        args, kwargs = make()
        try:
            outcomes[backend] = _outcome(op.impl(backend), args, kwargs)
        except CallRefused:
            # after the contract let the call through, the backend declined it (FlashInfer's
            # head dims, say): the dispatch runs such a call elsewhere, so it has no outcome here
            continue
        except BackendUnavailable:
            if not request.config.getoption("--allow-tree"):
                raise
    want = outcomes.pop("reference")
    assert len(outcomes) >= 2, f"{name}: fewer than two backends ran: {sorted(outcomes)}"
    for backend, got in outcomes.items():
        assert got[0] == want[0], (
            f"{name}: {backend} {got[0]} {got[1:] if got[0] == 'raises' else ''}, reference {want}"
        )
        if want[0] == "raises":
            assert got[1:] == want[1:], f"{name}: {backend} raised {got[1:]}, the reference {want[1:]}"
            continue
        # the loosest tolerance the op declares: this is a contract test, parity is test_parity's
        atol = max(a for _, (a, _) in spec.tolerances)
        rtol = max(r for _, (_, r) in spec.tolerances)
        for j, (g, w) in enumerate(zip(got[1], want[1], strict=True)):
            torch.testing.assert_close(
                g,
                w,
                atol=atol,
                rtol=rtol,
                equal_nan=True,
                msg=lambda m, j=j, b=backend: f"{name}: {b} output {j}: {m}",
            )
