"""FlashInfer's ``flashinfer.sampling`` names and signatures (0.6 / 0.7), running opmux's sampling ops
(docs/compat.md): ``from opmux.compat import flashinfer`` then ``flashinfer.top_k_renorm_probs(...)``.
The rules are opmux's (ties at a threshold kept, one inverse-CDF draw per row: no rejection rounds,
so ``deterministic`` changes nothing); ``seed`` / ``offset`` or ``generator`` pick the draw.
FlashInfer's own conventions on top of the shared entries (``_sampling``):

* a per-row parameter is a scalar or a 1-d tensor of one entry per row (FlashInfer's errors
  otherwise); ``top_p = 0`` keeps the largest entries (where FlashInfer's search ends) and
  ``top_p > 1`` / ``top_k > V`` every entry (opmux's ops take p in (0, 1], k in [0, V]);
* the renorm ops return the input's dtype (computed in float32);
* ids come in ``indices``' dtype when ``indices`` is given, else int32; ``return_valid=True`` also
  returns a bool per output, False for a NaN row (whose id is 0), as FlashInfer's kernels do;
* ``softmax`` (with a temperature, a number or one per row) is torch's: opmux has no softmax op.

Importing this module imports no torch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, cast

from opmux.kernels.ops._torch import torch

from . import _sampling as _shared

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "min_p_sampling_from_probs",
    "sampling_from_logits",
    "sampling_from_probs",
    "softmax",
    "top_k_mask_logits",
    "top_k_renorm_probs",
    "top_k_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
    "top_p_renorm_probs",
    "top_p_sampling_from_probs",
]

Param = Any  # a number, or a 1-d tensor of one entry per row


def _param(name: str, value: Param, rows: int) -> Param:
    """``value`` after FlashInfer's checks of a per-row sampling parameter."""
    if not isinstance(value, torch.Tensor):
        return value
    if value.dim() == 0:
        raise ValueError(
            f"Expected a 1D tensor of shape (batch_size,) or scalar for {name}, got a 0-dimensional tensor"
        )
    if value.dim() != 1:
        raise ValueError(f"Expected a 1D tensor or scalar for {name}, got a {value.dim()}D tensor")
    if value.shape[0] != rows:
        raise ValueError(
            f"Sampling parameter tensor batch size mismatch: {name} has {value.shape[0]} entries "
            f"for {rows} rows"
        )
    return value


def _top_p(value: Param, rows: int) -> Param:
    """A checked top-p in opmux's (0, 1]: 0 (FlashInfer: the largest entries) as the least positive
    float32, past 1 (FlashInfer: every entry) as 1."""
    value = _param("top_p", value, rows)
    tiny = torch.finfo(torch.float32).tiny
    if isinstance(value, torch.Tensor):
        return value.float().clamp(tiny, 1.0)
    return min(max(float(value), tiny), 1.0)


def _top_k(value: Param, rows: int, vocab: int) -> Param:
    """A checked top-k in opmux's [0, V]: past V (FlashInfer: every entry) as V."""
    value = _param("top_k", value, rows)
    if isinstance(value, torch.Tensor):
        return value.clamp(max=vocab)
    return min(int(value), vocab)


def _rows_of(probs: Tensor, indices: Tensor | None) -> int:
    return probs.shape[0] if indices is None else indices.shape[0]


def _draw(
    fn: Callable[..., Tensor], probs: Tensor, indices: Tensor | None, return_valid: bool, **kwargs: Any
) -> Tensor | tuple[Tensor, Tensor]:
    """``fn(probs, indices=indices, **kwargs)``'s ids in FlashInfer's dtype, with ``valid`` where
    asked (NaN rows drawn as all-zero rows: id 0)."""
    valid = None
    if return_valid:
        ok = ~torch.isnan(probs).any(-1)
        probs = torch.where(ok[:, None], probs, 0.0)
        valid = ok if indices is None else ok.index_select(0, indices.long())
    ids = fn(probs, indices=indices, **kwargs)
    if valid is not None:
        ids = torch.where(valid, ids, 0)
    if indices is not None:
        ids = ids.to(indices.dtype)
    return (ids, valid) if valid is not None else ids


def softmax(
    logits: Tensor, temperature: Tensor | float | None = None, enable_pdl: bool | None = None
) -> Tensor:
    """float32 ``softmax(logits / temperature)`` per row (torch's; ``enable_pdl`` has no effect)."""
    x = logits.float()
    if isinstance(temperature, torch.Tensor):
        x = x / _param("temperature", temperature, logits.shape[0]).float()[:, None]
    elif temperature is not None and float(temperature) != 1.0:
        x = x / float(temperature)
    probs: Tensor = torch.softmax(x, dim=-1)
    return probs


def top_k_renorm_probs(probs: Tensor, top_k: Param) -> Tensor:
    """The k largest probabilities of each row (ties at the k-th kept) renormalised, the rest 0."""
    k = _top_k(top_k, probs.shape[0], probs.shape[-1])
    return _shared.top_k_renorm_probs(probs, k).to(probs.dtype)


def top_p_renorm_probs(probs: Tensor, top_p: Param) -> Tensor:
    """The smallest set of largest probabilities holding >= p of the row (ties kept), renormalised."""
    return _shared.top_p_renorm_probs(probs, _top_p(top_p, probs.shape[0])).to(probs.dtype)


def top_k_mask_logits(logits: Tensor, top_k: Param) -> Tensor:
    """All but the k largest logits of each row (ties at the k-th kept) set to -inf."""
    return _shared.top_k_mask_logits(logits, _top_k(top_k, logits.shape[0], logits.shape[-1]))


def top_k_top_p_sampling_from_probs(
    probs: Tensor,
    top_k: Param,
    top_p: Param,
    indices: Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | None = None,
    offset: int | None = None,
    return_valid: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """One id per output row from the top-k then top-p set (``joint``: both on the row)."""
    n = _rows_of(probs, indices)
    return _draw(
        _shared.top_k_top_p_sampling_from_probs,
        probs,
        indices,
        return_valid,
        top_k=_top_k(top_k, n, probs.shape[-1]),
        top_p=_top_p(top_p, n),
        filter_apply_order=filter_apply_order,
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
        seed=seed,
        offset=offset,
    )


def top_k_top_p_sampling_from_logits(
    logits: Tensor,
    top_k: Param,
    top_p: Param,
    indices: Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | None = None,
    offset: int | None = None,
    return_valid: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """``top_k_top_p_sampling_from_probs`` on ``softmax(logits)`` (float32): the top-k set of the
    logits is that of their probabilities, so both orders filter the same tokens as FlashInfer's."""
    if check_nan and bool(torch.isnan(logits).any()):
        raise ValueError("Input logits contains NaN.")
    return top_k_top_p_sampling_from_probs(
        softmax(logits),
        top_k,
        top_p,
        indices,
        filter_apply_order,
        deterministic,
        generator,
        False,
        seed,
        offset,
        return_valid,
    )


def top_k_sampling_from_probs(
    probs: Tensor,
    top_k: Param,
    indices: Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | None = None,
    offset: int | None = None,
    return_valid: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """One id per output row from the top-k set renormalised."""
    return top_k_top_p_sampling_from_probs(
        probs,
        top_k,
        1.0,
        indices,
        "top_k_first",
        deterministic,
        generator,
        check_nan,
        seed,
        offset,
        return_valid,
    )


def top_p_sampling_from_probs(
    probs: Tensor,
    top_p: Param,
    indices: Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | None = None,
    offset: int | None = None,
    return_valid: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """One id per output row from the top-p set renormalised."""
    return top_k_top_p_sampling_from_probs(
        probs,
        0,
        top_p,
        indices,
        "top_k_first",
        deterministic,
        generator,
        check_nan,
        seed,
        offset,
        return_valid,
    )


def sampling_from_probs(
    probs: Tensor,
    indices: Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | None = None,
    offset: int | None = None,
    return_valid: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """One id per output row from the row (no filter)."""
    return top_k_top_p_sampling_from_probs(
        probs, 0, 1.0, indices, "top_k_first", deterministic, generator, check_nan, seed, offset, return_valid
    )


def sampling_from_logits(
    logits: Tensor,
    indices: Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | None = None,
    offset: int | None = None,
) -> Tensor:
    """One id per output row from ``softmax(logits)`` (no filter)."""
    if check_nan and bool(torch.isnan(logits).any()):
        raise ValueError("Input logits contains NaN.")
    ids = sampling_from_probs(softmax(logits), indices, deterministic, generator, False, seed, offset)
    return cast("Tensor", ids)  # return_valid off: the ids alone


def min_p_sampling_from_probs(
    probs: Tensor,
    min_p: Param,
    indices: Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | None = None,
    offset: int | None = None,
    return_valid: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """One id per output row among the tokens with p >= min_p * max(p), renormalised."""
    return _draw(
        _shared.min_p_sampling_from_probs,
        probs,
        indices,
        return_valid,
        min_p=_param("min_p", min_p, _rows_of(probs, indices)),
        deterministic=deterministic,
        generator=generator,
        check_nan=check_nan,
        seed=seed,
        offset=offset,
    )
