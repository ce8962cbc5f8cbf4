"""The ``flashinfer`` backend of the sampling ops: FlashInfer's sort-free samplers
(``flashinfer.sampling``), where the package is installed (the ``flashinfer`` capability:
``python -m opmux.kernels env`` says whether it was found).

Each function takes the op's kernel arguments (the contract's checked views, as every backend)
and maps them onto FlashInfer's API:

* ``top_k = 0`` (opmux: off) is FlashInfer's ``top_k = V`` (every token kept); per-row
  ``top_k_arr`` entries of 0 likewise (``torch.where`` on the device: no sync);
* per-row tensors pass as they are (int32 k, float32 p / min_p), scalars as numbers;
* the draw's Philox seed and offset pass as FlashInfer's ``seed`` / ``offset`` (ints, or the
  int64 device tensors: a CUDA graph replays with fresh draws), ``deterministic=True``. Ids
  differ from opmux's own backends (another stream), the distribution is the same; the same seed
  gives the same ids on this backend;
* ``greedy`` has no FlashInfer kernel (argmax is not FlashInfer's): not declared there.

Where it runs: CUDA float32 rows (``top_k_mask_logits``: float32 too) where the package is found
(the requirement's capability, no import); a FlashInfer that cannot be imported, lacks a
function, or whose samplers take no ``seed`` / ``offset`` (before 0.5: a ``torch.Generator``
only, which a graph capture would freeze) raises ``BackendUnavailable`` with :func:`refusal`'s
reason at the first call, and dispatch falls back under the policy (no per-call predicate: it
would take the ops' serving lanes away on every device). Declared after opmux's own
backends on CUDA: FlashInfer runs only when forced, or once an H200 benchmark
(``benchmarks/bench_sampling.py``, which times both) shows it faster and the order is changed.
"""

from __future__ import annotations

import functools
import inspect
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


def _fn(op: str) -> Any:
    why = refusal(op)
    if why is not None:
        raise BackendUnavailable(BACKEND, why)
    return getattr(_sampling(), FUNCTIONS[op])


def _k(k_arr: Tensor, has_k: bool, top_k: int, v: int) -> Tensor | int:
    """opmux's k (0: off) as FlashInfer's (V: every token)."""
    if has_k:
        return torch.where(k_arr == 0, v, k_arr).to(torch.int32)
    return top_k if top_k > 0 else v


def _p(p_arr: Tensor, has_p: bool, p: float) -> Tensor | float:
    return p_arr if has_p else p


def _seed(t: Tensor, has: bool, value: int) -> Tensor | int:
    return t if has else value


def top_k_renorm_probs(out: Tensor, probs: Tensor, k_arr: Tensor, has_k: bool, top_k: int) -> None:
    if probs.shape[0]:
        out.copy_(_fn("top_k_renorm_probs")(probs, _k(k_arr, has_k, top_k, probs.shape[1])))


def top_p_renorm_probs(out: Tensor, probs: Tensor, p_arr: Tensor, has_p: bool, top_p: float) -> None:
    if probs.shape[0]:
        out.copy_(_fn("top_p_renorm_probs")(probs, _p(p_arr, has_p, top_p)))


def top_k_mask_logits(out: Tensor, logits: Tensor, k_arr: Tensor, has_k: bool, top_k: int) -> None:
    if logits.shape[0]:
        out.copy_(_fn("top_k_mask_logits")(logits, _k(k_arr, has_k, top_k, logits.shape[1])))


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
    ids = _fn("top_k_top_p_sampling_from_probs")(
        probs,
        _k(k_arr, has_k, top_k, probs.shape[1]),
        _p(p_arr, has_p, top_p),
        filter_apply_order=filter_apply_order,
        deterministic=True,
        seed=_seed(seed_t, has_seed, seed),
        offset=_seed(offset_t, has_offset, offset),
    )
    out.copy_(ids)


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
    ids = _fn("min_p_sampling_from_probs")(
        probs,
        _p(m_arr, has_m, min_p),
        deterministic=True,
        seed=_seed(seed_t, has_seed, seed),
        offset=_seed(offset_t, has_offset, offset),
    )
    out.copy_(ids)
