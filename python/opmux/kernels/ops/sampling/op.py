"""Sampling ops, the last op of a decode step: one declaration each (``ops/_decl.py``).

Rows are ``[B, V]``: probabilities (float32, rows meant to sum to 1; that is not checked, it would
cost a synchronisation on the device) or logits (float32 / float16 / bfloat16).

**Per-row parameters** come as a pair: a tensor (``top_k_arr`` int32 / int64 ``[B]``,
``top_p_arr`` / ``min_p_arr`` float32 ``[B]``) or a scalar (``top_k``, ``top_p``, ``min_p``), not
both (the scalar left at its default when the tensor is given). A signature parameter has one type,
and the pair is what FlashInfer's and sgl-kernel's library ops take (``maybe_top_k_arr``,
``top_k_val``): the tensor is read on the device (no synchronisation, a CUDA graph replays with
new values), the scalar costs no tensor at all.

**Filters** (each keeps a set ``p >= t`` for a threshold ``t`` on the row, so ties at the
threshold are always kept):

* top-k: ``t`` = the k-th largest value; every value equal to it is kept, so more than k may be
  (FlashInfer's rule: its tests' reference keeps ``probs >= sorted_desc[k - 1]``). ``k = 0`` or
  ``k = V``: off (the row unchanged).
* top-p: the smallest set of the largest values whose mass is ``>= p`` times the row's mass
  (relative to the row's own total, so a row summing to 0.999 behaves as its normalised self):
  ``t`` = the value at which the descending cumulative sum first reaches ``p * total``; values
  tied with it are kept. ``p = 1``: off.
* min-p: ``t = min_p * max(row)``.
* ``filter_apply_order``: ``"top_k_first"``: top-p applied to the top-k set renormalised
  (``p`` times the kept mass); ``"joint"``: both filters on the original row, a token kept when
  it passes both (FlashInfer's two orders).

**Ops.** ``top_k_renorm_probs`` / ``top_p_renorm_probs``: the kept values divided by their sum
(renormalised), the others 0; ``top_k_mask_logits``: the others set to ``-inf`` (no
renormalisation); ``greedy``: the argmax (int32), ties to the LOWEST index (torch.argmax's
rule); ``top_k_top_p_sampling_from_probs`` / ``min_p_sampling_from_probs``: one id (int32) per
row, drawn from the kept values renormalised by inverse CDF: with one uniform ``u`` in [0, 1) per
row, the first index (in vocabulary order) whose cumulative kept mass exceeds ``u * kept mass``
(never a zero-probability or filtered token; should rounding leave no such index, the last kept
token with a positive probability).

**Randomness** (the sampling ops): ``seed`` and ``offset`` as ints, or as int64 one-element
tensors (``seed_tensor``, ``offset_tensor``) read on the device, so that a captured CUDA graph
replays with fresh draws when the caller bumps the offset tensor in place (ints are baked into
the graph). Draws are deterministic per backend: the same seed, offset and rows give the same
ids on one backend (FlashInfer's: up to its top-k renorm's atomic sums, ``flashinfer_backend.py``);
backends do not share their uniform numbers. Triton: Philox keyed by the seed, counter
``(offset lo, offset hi, row, 0)``, so each row has its own stream and the offset advances by 1 per
step. Native (CPU and CUDA units, ``jit/csrc/sampling_*``): the same Philox words
(``opmux/sampling_philox.h``), so they draw the same u as Triton (the ids agree unless the kept
mass's rounding differs at a boundary). Torch: a ``torch.Generator`` on the rows' device seeded with a mix of
seed and offset (a tensor seed / offset is read on the host there: a synchronisation).

**Contents.** A NaN in the rows, or a per-row parameter out of range (``k`` in ``[0, V]``, ``p``
in ``(0, 1]``, ``min_p`` in ``[0, 1]``), raises ``ValueError`` for CPU tensors; on CUDA that is
not checked (a synchronisation); out-of-range parameters then give an unspecified but in-bounds
result.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ...spec import Requirement
from .._common import INT32_EXACT, TOLERANCES
from .._contract import FLOATS, Arg, Contract, Rule, Scalar
from .._decl import declare
from . import flashinfer_backend as _fi

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

ORDERS = ("top_k_first", "joint")
_F32 = ("float32",)
#: renormalised rows: one division per value (float32 only)
_EXACT32 = (("float32", (1e-6, 1e-6)),)


# -- the contracts ---------------------------------------------------------------------------------
def _rows(name: str, dtypes: tuple[str, ...]) -> tuple[Any, ...]:
    return (
        Arg(name, "B, V", dtypes=dtypes, layout="matrix"),
        Rule("V >= 1", name + " has shape {tuple(" + name + ".shape)}; expected [B, V] with V >= 1"),
        Rule("V < 2147483648", "{V} columns do not fit int32 ids"),
    )


def _per_row(name: str, dtypes: tuple[str, ...], ref: str, what: str) -> Arg:
    return Arg(
        f"{name}_arr",
        "B",
        dtypes=dtypes,
        device_of=ref,
        layout="vector",
        note=f" (one {what} per row)",
        dtype_hint="has dtype {dtype}; expected " + " or ".join(dtypes),
    )


def _not_both(name: str, default: str) -> Rule:
    return Rule(
        f"{name}_arr is None or {name} == {default}",
        f"give {name} as a tensor ({name}_arr) or as a scalar ({name}), not both (got {name} = {{{name}}})",
    )


def _top_k(ref: str) -> tuple[Any, ...]:
    return (
        _per_row("top_k", ("int32", "int64"), ref, "k"),
        Scalar("top_k", "int32"),
        Rule("0 <= top_k <= V", "top_k must be in [0, V] = [0, {V}] (0: off), got {top_k}"),
        _not_both("top_k", "0"),
    )


def _top_p(ref: str) -> tuple[Any, ...]:
    return (
        _per_row("top_p", _F32, ref, "p"),
        Scalar("top_p", "positive"),
        Rule("top_p <= 1.0", "top_p must be in (0, 1] (1: off), got {top_p}"),
        _not_both("top_p", "1.0"),
    )


def _min_p(ref: str) -> tuple[Any, ...]:
    return (
        _per_row("min_p", _F32, ref, "min_p"),
        Scalar("min_p", "off_or_positive"),
        Rule("min_p <= 1.0", "min_p must be in [0, 1] (0: off), got {min_p}"),
        _not_both("min_p", "0.0"),
    )


def _philox(ref: str) -> tuple[Any, ...]:
    items: list[Any] = []
    for name in ("seed", "offset"):
        items += [
            Arg(
                f"{name}_tensor",
                "",
                dtypes=("int64",),
                device_of=ref,
                layout="element",
                note=f" (the {name}, read on the device)",
            ),
            Scalar(name, "int64"),
            Rule(
                f"{name}_tensor is None or {name} == 0",
                f"give the {name} as a tensor ({name}_tensor) or as an int ({name}), not both",
            ),
        ]
    return tuple(items)


def _out(like: str) -> Arg:
    return Arg("out", "B, V", like=like, layout="matrix", out=True)


def _ids_out(ref: str) -> Arg:
    return Arg("out", "B", dtypes=("int32",), device_of=ref, layout="vector", out=True)


def _nan_refused(name: str) -> dict[str, Any]:
    """The values hook's C++ counterpart for a serving lane: a CPU row holding a NaN is refused."""
    return {
        "values_cpp": f"rows_no_nan_on_cpu(device_type, {name})",
        "values_header": "opmux/sampling_values.h",
    }


_K_KERNEL = ("top_k_arr", "top_k_arr is not None", "top_k")
_P_KERNEL = ("top_p_arr", "top_p_arr is not None", "top_p")
_PHILOX_KERNEL = (
    "seed_tensor",
    "seed_tensor is not None",
    "seed",
    "offset_tensor",
    "offset_tensor is not None",
    "offset",
)

TOP_K_RENORM = Contract(
    "top_k_renorm",
    (*_rows("probs", _F32), *_top_k("probs"), _out("probs")),
    ("out", "probs", *_K_KERNEL),
    "out",
    **_nan_refused("probs"),
)
TOP_P_RENORM = Contract(
    "top_p_renorm",
    (*_rows("probs", _F32), *_top_p("probs"), _out("probs")),
    ("out", "probs", *_P_KERNEL),
    "out",
    **_nan_refused("probs"),
)
TOP_K_MASK = Contract(
    "top_k_mask",
    (*_rows("logits", FLOATS), *_top_k("logits"), _out("logits")),
    ("out", "logits", *_K_KERNEL),
    "out",
    **_nan_refused("logits"),
)
GREEDY = Contract(
    "greedy",
    (*_rows("logits", FLOATS), _ids_out("logits")),
    ("out", "logits"),
    "out",
    **_nan_refused("logits"),
)
TOP_K_TOP_P_SAMPLING = Contract(
    "top_k_top_p_sampling",
    (
        *_rows("probs", _F32),
        *_top_k("probs"),
        *_top_p("probs"),
        *_philox("probs"),
        Scalar("filter_apply_order", "choice", choices=ORDERS),
        _ids_out("probs"),
    ),
    ("out", "probs", *_K_KERNEL, *_P_KERNEL, *_PHILOX_KERNEL, "filter_apply_order"),
    "out",
    **_nan_refused("probs"),
)
MIN_P_SAMPLING = Contract(
    "min_p_sampling",
    (*_rows("probs", _F32), *_min_p("probs"), *_philox("probs"), _ids_out("probs")),
    ("out", "probs", "min_p_arr", "min_p_arr is not None", "min_p", *_PHILOX_KERNEL),
    "out",
    **_nan_refused("probs"),
)


# -- the values hooks (CPU tensors only: on the device a check would synchronise) ------------------
def _no_nan(op: str, name: str, x: Tensor) -> None:
    if x.is_cpu and x.numel() and bool(torch.isnan(x).any()):
        row = int(torch.isnan(x).any(1).nonzero()[0, 0])
        raise ValueError(f"{op}: {name} row {row} holds NaN; sampling needs finite rows")


def _in_range(op: str, name: str, t: Tensor | None, ok: Any, what: str) -> None:
    if t is None or not t.is_cpu or not t.numel():
        return
    bad = ~ok(t)
    if bool(bad.any()):
        i = int(bad.nonzero()[0, 0])
        raise ValueError(f"{op}: {name}[{i}] = {t[i].item()} is out of range; expected {what}")


def _check_k(op: str, t: Tensor | None, v: int) -> None:
    _in_range(op, "top_k_arr", t, lambda k: (k >= 0) & (k <= v), f"[0, V] = [0, {v}] (0: off)")


def _check_p(op: str, t: Tensor | None) -> None:
    _in_range(op, "top_p_arr", t, lambda p: (p > 0) & (p <= 1), "(0, 1] (1: off)")


def values_top_k_renorm(probs: Tensor, top_k_arr: Tensor | None = None, *_: Any) -> None:
    _no_nan("sampling.top_k_renorm_probs", "probs", probs)
    _check_k("sampling.top_k_renorm_probs", top_k_arr, probs.shape[1])


def values_top_k_mask(logits: Tensor, top_k_arr: Tensor | None = None, *_: Any) -> None:
    _no_nan("sampling.top_k_mask_logits", "logits", logits)
    _check_k("sampling.top_k_mask_logits", top_k_arr, logits.shape[1])


def values_top_p(probs: Tensor, top_p_arr: Tensor | None = None, *_: Any) -> None:
    _no_nan("sampling.top_p_renorm_probs", "probs", probs)
    _check_p("sampling.top_p_renorm_probs", top_p_arr)


def values_greedy(logits: Tensor, *_: Any) -> None:
    _no_nan("sampling.greedy", "logits", logits)


def values_top_k_top_p(
    probs: Tensor, top_k_arr: Tensor | None = None, top_k: int = 0, top_p_arr: Tensor | None = None, *_: Any
) -> None:
    op = "sampling.top_k_top_p_sampling_from_probs"
    _no_nan(op, "probs", probs)
    _check_k(op, top_k_arr, probs.shape[1])
    _check_p(op, top_p_arr)


def values_min_p(probs: Tensor, min_p_arr: Tensor | None = None, *_: Any) -> None:
    op = "sampling.min_p_sampling_from_probs"
    _no_nan(op, "probs", probs)
    _in_range(op, "min_p_arr", min_p_arr, lambda p: (p >= 0) & (p <= 1), "[0, 1] (0: off)")


# -- the definition (sort, cumulative sums, masks) -------------------------------------------------
def _param(arr: Tensor | None, given: bool, value: float, x: Tensor, dtype: torch.dtype) -> Tensor:
    """The per-row parameter as a [B] tensor on ``x``'s device."""
    if given and arr is not None:
        return arr.to(device=x.device, dtype=dtype)
    return torch.full((x.shape[0],), value, dtype=dtype, device=x.device)


def _kth(x: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
    """(threshold [B, 1], on [B]): the k-th largest value of each row (the smallest value where
    top-k is off: k = 0 or k >= V, every value kept)."""
    v = x.shape[1]
    on = (k > 0) & (k < v)
    s = x.sort(dim=1, descending=True).values
    idx = torch.where(on, k, v) - 1
    return s.gather(1, idx[:, None].long()), on


def _keep(probs: Tensor, k: Tensor, p: Tensor, joint: bool) -> Tensor:
    """The kept mask of top-k then top-p (``joint``: both on the original row)."""
    tk, _ = _kth(probs, k)
    s = probs.sort(dim=1, descending=True).values
    c = s.cumsum(1)
    n_k = (probs >= tk).sum(1, keepdim=True)  # the top-k set, ties included
    base = c[:, -1:] if joint else c.gather(1, n_k - 1)
    need = p[:, None].to(c.dtype) * base
    m = (c < need).sum(1, keepdim=True).clamp(max=probs.shape[1] - 1)
    tp = torch.where(p[:, None] < 1, s.gather(1, m), s[:, -1:])
    return probs >= torch.maximum(tk, tp)


def _renorm(probs: Tensor, keep: Tensor, on: Tensor) -> Tensor:
    q = torch.where(keep, probs, torch.zeros((), dtype=probs.dtype, device=probs.device))
    y = q / q.sum(1, keepdim=True)
    return torch.where(on[:, None], y, probs)


def _mix(seed: int, offset: int) -> int:
    """One 64-bit generator seed from (seed, offset) (splitmix64 of both)."""
    z = (seed * 0x9E3779B97F4A7C15 + offset * 0xBF58476D1CE4E5B9 + 0x94D049BB133111EB) % 2**64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) % 2**64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) % 2**64
    return (z ^ (z >> 31)) >> 1  # < 2^63


def uniforms(rows: int, device: torch.device, seed: int, offset: int) -> Tensor:
    """The torch backend's (and the reference's) uniforms: one per row in [0, 1)."""
    g = torch.Generator(device=device if device.type == "cuda" else "cpu")
    g.manual_seed(_mix(seed, offset))
    return torch.rand(rows, generator=g, device=g.device, dtype=torch.float32).to(device)


def _scalar(t: Tensor | None, given: bool, v: int) -> int:
    return int(t.reshape(-1)[0].item()) if given and t is not None else v  # (a sync on the device)


def _draw(probs: Tensor, keep: Tensor, u: Tensor) -> Tensor:
    """Inverse CDF over the kept row: the first index whose cumulative kept mass exceeds
    ``u * kept mass``; else the last kept index with a positive probability (else 0)."""
    q = torch.where(keep, probs, torch.zeros((), dtype=probs.dtype, device=probs.device))
    cq = q.cumsum(1)
    hit = cq > u[:, None].to(cq.dtype) * cq[:, -1:]
    cols = torch.arange(probs.shape[1], device=probs.device)
    last = torch.where(keep & (probs > 0), cols, -1).amax(1).clamp(min=0) if probs.shape[1] else cols
    ids = torch.where(hit.any(1), hit.int().argmax(1), last)
    return ids.to(torch.int32)


# -- torch backends (the kernel arguments) ---------------------------------------------------------
def torch_top_k_renorm_probs(out: Tensor, probs: Tensor, k_arr: Tensor, has_k: bool, top_k: int) -> None:
    if not probs.shape[0]:
        return
    k = _param(k_arr, has_k, top_k, probs, torch.int64)
    tk, on = _kth(probs, k)
    out.copy_(_renorm(probs, probs >= tk, on))


def torch_top_p_renorm_probs(out: Tensor, probs: Tensor, p_arr: Tensor, has_p: bool, top_p: float) -> None:
    if not probs.shape[0]:
        return
    p = _param(p_arr, has_p, top_p, probs, torch.float32)
    k = torch.zeros(probs.shape[0], dtype=torch.int64, device=probs.device)
    out.copy_(_renorm(probs, _keep(probs, k, p, joint=True), p < 1))


def torch_top_k_mask_logits(out: Tensor, logits: Tensor, k_arr: Tensor, has_k: bool, top_k: int) -> None:
    if not logits.shape[0]:
        return
    k = _param(k_arr, has_k, top_k, logits, torch.int64)
    tk, on = _kth(logits, k)
    ninf = torch.full((), -torch.inf, dtype=logits.dtype, device=logits.device)
    out.copy_(torch.where(on[:, None] & (logits < tk), ninf, logits))


def torch_greedy(out: Tensor, logits: Tensor) -> None:
    if logits.shape[0]:
        out.copy_(logits.argmax(1))  # the first maximum: the lowest index


def torch_top_k_top_p_sampling(
    out: Tensor,
    probs: Tensor,
    k_arr: Tensor,
    has_k: bool,
    top_k: int,
    p_arr: Tensor,
    has_p: bool,
    top_p: float,
    seed_t: Tensor,
    has_seed: bool,
    seed: int,
    offset_t: Tensor,
    has_offset: bool,
    offset: int,
    order: str,
) -> None:
    if not probs.shape[0]:
        return
    k = _param(k_arr, has_k, top_k, probs, torch.int64)
    p = _param(p_arr, has_p, top_p, probs, torch.float32)
    u = uniforms(
        probs.shape[0], probs.device, _scalar(seed_t, has_seed, seed), _scalar(offset_t, has_offset, offset)
    )
    out.copy_(_draw(probs, _keep(probs, k, p, joint=order == "joint"), u))


def torch_min_p_sampling(
    out: Tensor,
    probs: Tensor,
    m_arr: Tensor,
    has_m: bool,
    min_p: float,
    seed_t: Tensor,
    has_seed: bool,
    seed: int,
    offset_t: Tensor,
    has_offset: bool,
    offset: int,
) -> None:
    if not probs.shape[0]:
        return
    m = _param(m_arr, has_m, min_p, probs, torch.float32)
    thr = m[:, None].to(probs.dtype) * probs.amax(1, keepdim=True)
    u = uniforms(
        probs.shape[0], probs.device, _scalar(seed_t, has_seed, seed), _scalar(offset_t, has_offset, offset)
    )
    out.copy_(_draw(probs, probs >= thr, u))


# -- the references (the op's signature; float64 too: the parity harness's oracle) -----------------
def _result(x: Tensor, out: Tensor | None) -> Tensor:
    return x if out is None else out.copy_(x)


def _empty_ids(x: Tensor) -> Tensor:
    return torch.empty(x.shape[0], dtype=torch.int32, device=x.device)


def ref_top_k_renorm_probs(
    probs: Tensor, top_k_arr: Tensor | None = None, top_k: int = 0, out: Tensor | None = None
) -> Tensor:
    y = probs.clone()
    torch_top_k_renorm_probs(y, probs, top_k_arr, top_k_arr is not None, top_k)  # type: ignore[arg-type]
    return _result(y, out)


def ref_top_p_renorm_probs(
    probs: Tensor, top_p_arr: Tensor | None = None, top_p: float = 1.0, out: Tensor | None = None
) -> Tensor:
    y = probs.clone()
    torch_top_p_renorm_probs(y, probs, top_p_arr, top_p_arr is not None, top_p)  # type: ignore[arg-type]
    return _result(y, out)


def ref_top_k_mask_logits(
    logits: Tensor, top_k_arr: Tensor | None = None, top_k: int = 0, out: Tensor | None = None
) -> Tensor:
    y = logits.clone()
    torch_top_k_mask_logits(y, logits, top_k_arr, top_k_arr is not None, top_k)  # type: ignore[arg-type]
    return _result(y, out)


def ref_greedy(logits: Tensor, out: Tensor | None = None) -> Tensor:
    y = _empty_ids(logits)
    torch_greedy(y, logits)
    return _result(y, out)


def ref_top_k_top_p_sampling(
    probs: Tensor,
    top_k_arr: Tensor | None = None,
    top_k: int = 0,
    top_p_arr: Tensor | None = None,
    top_p: float = 1.0,
    seed_tensor: Tensor | None = None,
    seed: int = 0,
    offset_tensor: Tensor | None = None,
    offset: int = 0,
    filter_apply_order: str = "top_k_first",
    out: Tensor | None = None,
) -> Tensor:
    y = _empty_ids(probs)
    torch_top_k_top_p_sampling(
        y,
        probs,
        top_k_arr,  # type: ignore[arg-type]
        top_k_arr is not None,
        top_k,
        top_p_arr,  # type: ignore[arg-type]
        top_p_arr is not None,
        top_p,
        seed_tensor,  # type: ignore[arg-type]
        seed_tensor is not None,
        seed,
        offset_tensor,  # type: ignore[arg-type]
        offset_tensor is not None,
        offset,
        filter_apply_order,
    )
    return _result(y, out)


def ref_min_p_sampling(
    probs: Tensor,
    min_p_arr: Tensor | None = None,
    min_p: float = 0.0,
    seed_tensor: Tensor | None = None,
    seed: int = 0,
    offset_tensor: Tensor | None = None,
    offset: int = 0,
    out: Tensor | None = None,
) -> Tensor:
    y = _empty_ids(probs)
    torch_min_p_sampling(
        y,
        probs,
        min_p_arr,  # type: ignore[arg-type]
        min_p_arr is not None,
        min_p,
        seed_tensor,  # type: ignore[arg-type]
        seed_tensor is not None,
        seed,
        offset_tensor,  # type: ignore[arg-type]
        offset_tensor is not None,
        offset,
    )
    return _result(y, out)


# -- the declarations ------------------------------------------------------------------------------
_PHILOX_SIG = "Tensor? seed_tensor=None, int seed=0, Tensor? offset_tensor=None, int offset=0"
_IDS_TOL = (*TOLERANCES, INT32_EXACT)
#: FlashInfer's samplers first where installed, then the native CUDA unit (0.17-0.63x Triton's time on
#: the H200), Triton, torch: on an H100 FlashInfer beat the native unit in 25 of the 48 cases of
#: benchmarks/bench_sampling.py (B = 256, top_k_top_p) and passed the statistics there; the device's
#: select tables (tuned.SCHEMAS, configs/sampling.*) put the native unit first in the other 23
#: (docs/benchmarks/sampling_h200.md)
_CUDA_ORDER = (("cuda", (_fi.BACKEND, "aot", "jit", "triton", "torch")),)
#: FlashInfer's samplers where installed (``flashinfer_backend.py``)
_FI = Requirement(devices=("cuda",), dtypes=_F32, capabilities=("flashinfer",))


def _flashinfer(op: str) -> tuple[tuple[str, Any, Requirement], ...]:
    return ((_fi.BACKEND, getattr(_fi, op), _FI),)


top_k_renorm_probs = declare(
    "sampling.top_k_renorm_probs",
    "(Tensor probs, Tensor? top_k_arr=None, int top_k=0, Tensor(a!)? out=None) -> Tensor",
    doc="probs [B, V] float32 -> the k largest of each row (ties at the k-th value kept) renormalised, the "
    "rest 0; k per row (top_k_arr [B]) or one int; 0 or V: the row unchanged",
    contract=TOP_K_RENORM,
    values=values_top_k_renorm,
    reference=ref_top_k_renorm_probs,
    torch=torch_top_k_renorm_probs,
    dtypes=_F32,
    tolerances=_EXACT32,
    vendor=_flashinfer("top_k_renorm_probs"),
    priority=_CUDA_ORDER,
)
top_p_renorm_probs = declare(
    "sampling.top_p_renorm_probs",
    "(Tensor probs, Tensor? top_p_arr=None, float top_p=1.0, Tensor(a!)? out=None) -> Tensor",
    doc="probs [B, V] float32 -> the smallest set of largest values holding >= p of the row's mass (ties at "
    "the boundary kept) renormalised, the rest 0; p per row (top_p_arr [B]) or one float; 1: unchanged",
    contract=TOP_P_RENORM,
    values=values_top_p,
    reference=ref_top_p_renorm_probs,
    torch=torch_top_p_renorm_probs,
    dtypes=_F32,
    tolerances=_EXACT32,
    vendor=_flashinfer("top_p_renorm_probs"),
    priority=_CUDA_ORDER,
)
top_k_mask_logits = declare(
    "sampling.top_k_mask_logits",
    "(Tensor logits, Tensor? top_k_arr=None, int top_k=0, Tensor(a!)? out=None) -> Tensor",
    doc="logits [B, V] -> all but the k largest of each row (ties at the k-th value kept) set to -inf; k per "
    "row (top_k_arr [B]) or one int; 0 or V: the row unchanged",
    contract=TOP_K_MASK,
    values=values_top_k_mask,
    reference=ref_top_k_mask_logits,
    torch=torch_top_k_mask_logits,
    # the kept values are copied, never computed: exact in every dtype
    tolerances=(("float32", (0.0, 0.0)), ("float16", (0.0, 0.0)), ("bfloat16", (0.0, 0.0))),
    vendor=_flashinfer("top_k_mask_logits"),
    priority=_CUDA_ORDER,
)
greedy = declare(
    "sampling.greedy",
    "(Tensor logits, Tensor(a!)? out=None) -> Tensor",
    doc="logits or probs [B, V] -> argmax ids int32 [B], ties to the lowest index",
    contract=GREEDY,
    values=values_greedy,
    reference=ref_greedy,
    torch=torch_greedy,
    tolerances=_IDS_TOL,
    priority=_CUDA_ORDER,
)
top_k_top_p_sampling_from_probs = declare(
    "sampling.top_k_top_p_sampling_from_probs",
    "(Tensor probs, Tensor? top_k_arr=None, int top_k=0, Tensor? top_p_arr=None, float top_p=1.0, "
    f'{_PHILOX_SIG}, str filter_apply_order="top_k_first", Tensor(a!)? out=None) -> Tensor',
    doc="probs [B, V] float32 -> one id int32 [B] per row, drawn from the top-k then top-p set renormalised "
    "(top_k_first; joint: both filters on the row); Philox seed / offset as ints or int64 device tensors",
    contract=TOP_K_TOP_P_SAMPLING,
    values=values_top_k_top_p,
    reference=ref_top_k_top_p_sampling,
    torch=torch_top_k_top_p_sampling,
    dtypes=_F32,
    tolerances=_IDS_TOL,
    vendor=_flashinfer("top_k_top_p_sampling_from_probs"),
    priority=_CUDA_ORDER,
)
min_p_sampling_from_probs = declare(
    "sampling.min_p_sampling_from_probs",
    f"(Tensor probs, Tensor? min_p_arr=None, float min_p=0.0, {_PHILOX_SIG}, Tensor(a!)? out=None) -> Tensor",
    doc="probs [B, V] float32 -> one id int32 [B] per row, drawn among the tokens with p >= min_p * max(p) "
    "renormalised; Philox seed / offset as ints or int64 device tensors",
    contract=MIN_P_SAMPLING,
    values=values_min_p,
    reference=ref_min_p_sampling,
    torch=torch_min_p_sampling,
    dtypes=_F32,
    tolerances=_IDS_TOL,
    vendor=_flashinfer("min_p_sampling_from_probs"),
    priority=_CUDA_ORDER,
)
