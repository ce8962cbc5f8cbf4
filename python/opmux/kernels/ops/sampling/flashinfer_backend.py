"""The ``flashinfer`` backend of the sampling ops: FlashInfer's sort-free samplers
(``flashinfer.sampling``), where the package is installed (the ``flashinfer`` capability:
``python -m opmux.kernels env`` says whether it was found).

Each function takes the op's kernel arguments (the contract's checked views, as every backend)
and maps them onto FlashInfer's API:

* ``top_k = 0`` (opmux: off) is FlashInfer's ``top_k = V`` (every token kept); per-row
  ``top_k_arr`` entries of 0 likewise (``torch.threshold`` on the device: one kernel, no sync);
* per-row tensors pass as they are (int32 k, float32 p / min_p), scalars as numbers;
* the draw's Philox seed and offset pass as FlashInfer's ``seed`` / ``offset`` (ints, or one-element
  int64 device tensors: a CUDA graph replays with fresh draws; an int beside a tensor becomes one),
  ``deterministic=True``. Ids differ from opmux's own backends (another stream), the distribution
  is the same. FlashInfer's top-k renorm (the renorm op, and the first step of the ``top_k_first``
  draw, as in FlashInfer's own function) runs in its default mode, which sums block masses with
  atomics: renormalised values may differ in the last bit between runs, and so, rarely, may a
  draw at a cumulative boundary;
* ``greedy`` has no FlashInfer kernel (argmax is not FlashInfer's): not declared there;
* rows with a row stride other than V are made contiguous first (FlashInfer refuses them).

**No copy.** FlashInfer's public functions return new tensors; copying them into the op's ``out``
would cost a kernel (a whole [B, V] pass for the renorms: 1.1-1.2x FlashInfer's own time on the
H200). For the FlashInfer series whose compiled module this file was written against
(:data:`RAW_SERIES`), the ops call that module (``flashinfer.jit.sampling``'s, the functions the
public ones wrap, which take the output tensor) with ``out`` directly, composing them as the public
functions do (``top_k_first``: the top-k renorm, then the top-p draw). Any other FlashInfer, or an
``out`` that is not contiguous, goes through the public API and a copy.

Where it runs: CUDA float32 rows (``top_k_mask_logits``: float32 too) where the package is found
(the requirement's capability, no import); a FlashInfer that cannot be imported, lacks a
function, or whose samplers take no ``seed`` / ``offset`` (before 0.5: a ``torch.Generator``
only, which a graph capture would freeze) raises ``BackendUnavailable`` with :func:`refusal`'s
reason at the first call, and dispatch falls back under the policy (no per-call predicate: it
would take the ops' serving lanes away on every device).
"""

from __future__ import annotations

import functools
import inspect
import types
from typing import TYPE_CHECKING, Any

from ...errors import BackendUnavailable

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

BACKEND = "flashinfer"
#: the FlashInfer functions each op maps to
FUNCTIONS = {
    "top_k_renorm_probs": "top_k_renorm_probs",
    "top_p_renorm_probs": "top_p_renorm_probs",
    "top_k_mask_logits": "top_k_mask_logits",
    "top_k_top_p_sampling_from_probs": "top_k_top_p_sampling_from_probs",
    "min_p_sampling_from_probs": "min_p_sampling_from_probs",
}
_DRAWS = ("top_k_top_p_sampling_from_probs", "min_p_sampling_from_probs")
#: FlashInfer versions (prefixes) whose compiled sampling module's signatures this file calls
RAW_SERIES = ("0.7.",)
#: FlashInfer's top-k-first draw takes a radix top-k path for a scalar k up to this over a
#: vocabulary of at least _FAST_MIN_V (its public function decides; this file defers to it there)
_FAST_MAX_K, _FAST_MIN_V = 256, 65536


@functools.cache
def _sampling() -> Any:
    """``flashinfer.sampling`` (imported on first use), or None when it cannot be imported."""
    try:
        import flashinfer.sampling as fs  # vendor library, present only where installed
    except Exception:  # not installed, or a build that fails to import here
        return None
    return fs


@functools.cache
def refusal(op: str) -> str | None:
    """Why FlashInfer cannot run ``op`` here (None: it can); read once per op."""
    fs = _sampling()
    if fs is None:
        return "flashinfer.sampling cannot be imported"
    fn = getattr(fs, FUNCTIONS[op], None)
    if fn is None:
        return f"this FlashInfer has no flashinfer.sampling.{FUNCTIONS[op]}"
    if op in _DRAWS:
        params = inspect.signature(fn).parameters
        if not {"seed", "offset"} <= params.keys():
            return (
                f"this FlashInfer's {FUNCTIONS[op]} takes no seed / offset (a torch.Generator only, "
                "frozen by a CUDA-graph capture): FlashInfer 0.5 or later"
            )
    return None


@functools.cache
def _raw() -> Any:
    """FlashInfer's compiled sampling module and its row-state buffers, for a FlashInfer of
    :data:`RAW_SERIES` (None otherwise, or when it cannot be loaded: the public API then)."""
    try:
        import flashinfer  # vendor library, present only where installed

        if not str(getattr(flashinfer, "__version__", "")).startswith(RAW_SERIES):
            return None
        from flashinfer.jit.sampling import gen_sampling_module
        from flashinfer.topk import _get_row_states_buffer

        module = gen_sampling_module().build_and_load()
    except Exception:  # not this series' layout: the public functions
        return None
    return types.SimpleNamespace(module=module, row_states=_get_row_states_buffer)


def _dense(x: Tensor) -> Tensor:
    """Rows as FlashInfer reads them (row stride V: its checks refuse strided rows)."""
    return x if x.is_contiguous() else x.contiguous()


def _direct(out: Tensor, x: Tensor) -> Any:
    """The compiled module when it can write ``out`` in place (contiguous, not sharing storage with
    the rows ``x``: FlashInfer's kernels are not written for in-place use), else None."""
    if not out.is_contiguous() or out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr():
        return None
    return _raw()


def _split(v: Tensor | float | int) -> tuple[Tensor | None, Any]:
    """FlashInfer's (maybe_arr, val) pair of a per-row parameter."""
    return (v, 0) if isinstance(v, torch.Tensor) else (None, v)


def _philox_pair(v: Tensor | int) -> tuple[Tensor | None, int]:
    return (v, 0) if isinstance(v, torch.Tensor) else (None, v)


def _top_p_workspace(probs: Tensor) -> Tensor:
    """The scratch of the 0.7 series' top-p renorm (its public function's sizing, non-deterministic
    histograms)."""
    b, v = probs.shape

    def align(x: int) -> int:
        return (x + 255) // 256 * 256

    buf = max(align(v // 32), 256)
    size = align(384 * b) + align(4 * 2048 * b) + align(4 * 2048 * b) + 2 * align(4 * buf * b)
    return torch.empty(size, dtype=torch.uint8, device=probs.device)


def _fn(op: str) -> Any:
    why = refusal(op)
    if why is not None:
        raise BackendUnavailable(BACKEND, why)
    return getattr(_sampling(), FUNCTIONS[op])


def _k(k_arr: Tensor, has_k: bool, top_k: int, v: int) -> Tensor | int:
    """opmux's k (0: off) as FlashInfer's (V: every token). Per-row: ``threshold`` keeps k > 0
    and writes V elsewhere, one elementwise kernel (``where(k == 0, ...)`` took two: about 4 us of
    a CUDA graph's time on an H100, where FlashInfer's own kernel takes 20-60)."""
    if has_k:
        return torch.threshold(k_arr, 0, v).to(torch.int32)  # int32 already: no copy
    return top_k if top_k > 0 else v


def _p(p_arr: Tensor, has_p: bool, p: float) -> Tensor | float:
    return p_arr if has_p else p


def _philox(
    probs: Tensor, seed_t: Tensor, has_seed: bool, seed: int, offset_t: Tensor, has_offset: bool, offset: int
) -> tuple[Tensor | int, Tensor | int]:
    """The draw's (seed, offset) as FlashInfer takes them: both ints, or both one-element 1-d int64
    tensors (its check refuses a mix and 0-d tensors; opmux's tensors may be either, and longer:
    their first element counts, as on the native unit)."""
    if not (has_seed or has_offset):
        return seed, offset

    def word(t: Tensor, has: bool, value: int) -> Tensor:
        if has:
            return t.reshape(-1)[:1]
        return torch.full((1,), value, dtype=torch.int64, device=probs.device)

    return word(seed_t, has_seed, seed), word(offset_t, has_offset, offset)


def _row_filter(op: str, out: Tensor, x: Tensor, param: Tensor | float | int, scratch: Any) -> None:
    """One of the row filters (FlashInfer's function ``op``): the compiled op writing ``out`` in
    place (``scratch(raw, x)``: its trailing arguments), else the public function and a copy."""
    if not x.shape[0]:
        return
    fn, x = _fn(op), _dense(x)
    raw = _direct(out, x)
    if raw is None:
        out.copy_(fn(x, param))
        return
    getattr(raw.module, op)(x, out, *_split(param), *scratch(raw, x))


def _row_states(name: str) -> Any:
    return lambda raw, x: (raw.row_states(f"{name}_row_states", x.device),)


def top_k_renorm_probs(out: Tensor, probs: Tensor, k_arr: Tensor, has_k: bool, top_k: int) -> None:
    k = _k(k_arr, has_k, top_k, probs.shape[1])
    states = _row_states("top_k_renorm_probs")
    _row_filter("top_k_renorm_probs", out, probs, k, lambda raw, x: (False, *states(raw, x)))


def top_p_renorm_probs(out: Tensor, probs: Tensor, p_arr: Tensor, has_p: bool, top_p: float) -> None:
    p = _p(p_arr, has_p, top_p)
    _row_filter("top_p_renorm_probs", out, probs, p, lambda raw, x: (False, _top_p_workspace(x)))


def top_k_mask_logits(out: Tensor, logits: Tensor, k_arr: Tensor, has_k: bool, top_k: int) -> None:
    k = _k(k_arr, has_k, top_k, logits.shape[1])
    _row_filter("top_k_mask_logits", out, logits, k, _row_states("top_k_mask_logits"))


def top_k_top_p_sampling_from_probs(
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
    filter_apply_order: str,
) -> None:
    if not probs.shape[0]:
        return
    fn, v, probs = _fn("top_k_top_p_sampling_from_probs"), probs.shape[1], _dense(probs)
    k, p = _k(k_arr, has_k, top_k, v), _p(p_arr, has_p, top_p)
    s, o = _philox(probs, seed_t, has_seed, seed, offset_t, has_offset, offset)
    raw = _direct(out, probs)
    radix = (
        filter_apply_order == "top_k_first" and not has_k and 0 < top_k <= _FAST_MAX_K and _FAST_MIN_V <= v
    )
    if raw is None or radix:  # FlashInfer's public function (its radix top-k path included)
        out.copy_(
            fn(probs, k, p, filter_apply_order=filter_apply_order, deterministic=True, seed=s, offset=o)
        )
        return
    valid = torch.empty(probs.shape[0], dtype=torch.bool, device=probs.device)
    draw = (*_philox_pair(s), *_philox_pair(o))
    if filter_apply_order == "joint":
        raw.module.top_k_top_p_sampling_from_probs(
            probs, out, valid, None, *_split(k), *_split(p), True, *draw
        )
        return
    kept = torch.empty_like(probs)  # the public function's composition: top-k renorm, then top-p
    raw.module.top_k_renorm_probs(
        probs, kept, *_split(k), False, raw.row_states("top_k_renorm_probs_row_states", probs.device)
    )
    raw.module.top_p_sampling_from_probs(kept, out, valid, None, *_split(p), True, *draw)


def min_p_sampling_from_probs(
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
    fn, m, probs = _fn("min_p_sampling_from_probs"), _p(m_arr, has_m, min_p), _dense(probs)
    s, o = _philox(probs, seed_t, has_seed, seed, offset_t, has_offset, offset)
    raw = _direct(out, probs)
    if raw is None:
        out.copy_(fn(probs, m, deterministic=True, seed=s, offset=o))
        return
    valid = torch.empty(probs.shape[0], dtype=torch.bool, device=probs.device)
    raw.module.min_p_sampling_from_probs(
        probs, out, valid, None, *_split(m), True, *_philox_pair(s), *_philox_pair(o)
    )
