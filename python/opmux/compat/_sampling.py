"""FlashInfer's / sgl_kernel's sampling names on opmux's sampling ops (docs/compat.md).

One implementation for ``opmux.compat.flashinfer`` and ``opmux.compat.sgl_kernel``: their
signatures (``top_k`` / ``top_p`` / ``min_p`` a tensor per row or one number; ``indices``,
``generator``, ``check_nan``, ``deterministic``), opmux's rules (ties at a threshold kept; no
rejection rounds, so ``deterministic`` changes nothing). The draws take their seed and offset from
``generator`` (or the device's default generator) as a device tensor: no synchronisation, and
``torch.manual_seed`` reproduces them. Importing this module imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opmux.kernels.ops._torch import torch

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "min_p_sampling_from_probs",
    "sampling_from_probs",
    "top_k_mask_logits",
    "top_k_renorm_probs",
    "top_k_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
    "top_p_renorm_probs",
    "top_p_sampling_from_probs",
]


def _ops() -> Any:
    from opmux.kernels.ops import sampling

    return sampling


def _k(top_k: Tensor | int) -> dict[str, Any]:
    return {"top_k_arr": top_k} if isinstance(top_k, torch.Tensor) else {"top_k": int(top_k)}


def _p(name: str, value: Tensor | float) -> dict[str, Any]:
    if isinstance(value, torch.Tensor):
        return {f"{name}_arr": value.float()}
    return {name: float(value)}


def _rows(probs: Tensor, indices: Tensor | None, check_nan: bool) -> Tensor:
    """float32 rows, one per output (``indices[i]``: the row output i draws from)."""
    if check_nan and bool(torch.isnan(probs).any()):
        raise ValueError("Input probs contains NaN.")
    probs = probs.float()
    return probs if indices is None else probs.index_select(0, indices.long())


def random_words(device: torch.device, generator: torch.Generator | None = None) -> tuple[Tensor, Tensor]:
    """(seed, offset): two int64 one-element tensors on ``device`` from ``generator`` (else the
    device's default one), for the ops' ``seed_tensor`` / ``offset_tensor``."""
    dev = generator.device if generator is not None else device
    w = torch.randint(-(2**63), 2**63 - 1, (2,), dtype=torch.int64, device=dev, generator=generator)
    w = w.to(device)
    return w[:1], w[1:]


def _draw_words(
    probs: Tensor, generator: torch.Generator | None, seed: int | None, offset: int | None
) -> dict[str, Any]:
    if seed is not None:
        return {"seed": int(seed), "offset": int(offset or 0)}
    s, o = random_words(probs.device, generator)
    return {"seed_tensor": s, "offset_tensor": o}


def top_k_renorm_probs(probs: Tensor, top_k: Tensor | int) -> Tensor:
    """The k largest probabilities of each row (ties at the k-th kept) renormalised, the rest 0."""
    return _ops().top_k_renorm_probs(probs.float(), **_k(top_k))  # type: ignore[no-any-return]


def top_p_renorm_probs(probs: Tensor, top_p: Tensor | float) -> Tensor:
    """The smallest set of largest probabilities holding >= p of the row (ties kept), renormalised."""
    return _ops().top_p_renorm_probs(probs.float(), **_p("top_p", top_p))  # type: ignore[no-any-return]


def top_k_mask_logits(logits: Tensor, top_k: Tensor | int) -> Tensor:
    """All but the k largest logits of each row (ties at the k-th kept) set to -inf."""
    return _ops().top_k_mask_logits(logits, **_k(top_k))  # type: ignore[no-any-return]


def top_k_top_p_sampling_from_probs(
    probs: Tensor,
    top_k: Tensor | int,
    top_p: Tensor | float,
    indices: Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | None = None,
    offset: int | None = None,
) -> Tensor:
    """One int32 id per output row from the top-k then top-p set (``joint``: both on the row)."""
    if filter_apply_order not in ("top_k_first", "joint"):
        raise ValueError(f"Invalid filter_apply_order: {filter_apply_order}")
    rows = _rows(probs, indices, check_nan)
    return _ops().top_k_top_p_sampling_from_probs(  # type: ignore[no-any-return]
        rows,
        **_k(top_k),
        **_p("top_p", top_p),
        **_draw_words(rows, generator, seed, offset),
        filter_apply_order=filter_apply_order,
    )


def top_k_top_p_sampling_from_logits(
    logits: Tensor,
    top_k: Tensor | int,
    top_p: Tensor | float,
    indices: Tensor | None = None,
    filter_apply_order: str = "top_k_first",
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | None = None,
    offset: int | None = None,
) -> Tensor:
    """``top_k_top_p_sampling_from_probs`` on ``softmax(logits)`` (float32): the top-k set of the
    logits is that of their probabilities, so both orders filter the same tokens as FlashInfer's
    (which masks the logits first for ``top_k_first``). The same ``generator`` state gives the same
    ids as the probs entry on ``torch.softmax(logits, dim=-1)``."""
    if check_nan and bool(torch.isnan(logits).any()):
        raise ValueError("Input logits contains NaN.")
    probs = torch.softmax(logits.float(), dim=-1)
    return top_k_top_p_sampling_from_probs(
        probs, top_k, top_p, indices, filter_apply_order, deterministic, generator, False, seed, offset
    )


def top_k_sampling_from_probs(
    probs: Tensor,
    top_k: Tensor | int,
    indices: Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | None = None,
    offset: int | None = None,
) -> Tensor:
    """One int32 id per output row from the top-k set renormalised."""
    return top_k_top_p_sampling_from_probs(
        probs, top_k, 1.0, indices, "top_k_first", deterministic, generator, check_nan, seed, offset
    )


def top_p_sampling_from_probs(
    probs: Tensor,
    top_p: Tensor | float,
    indices: Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | None = None,
    offset: int | None = None,
) -> Tensor:
    """One int32 id per output row from the top-p set renormalised."""
    return top_k_top_p_sampling_from_probs(
        probs, 0, top_p, indices, "top_k_first", deterministic, generator, check_nan, seed, offset
    )


def sampling_from_probs(
    probs: Tensor,
    indices: Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | None = None,
    offset: int | None = None,
) -> Tensor:
    """One int32 id per output row from the row (no filter)."""
    return top_k_top_p_sampling_from_probs(
        probs, 0, 1.0, indices, "top_k_first", deterministic, generator, check_nan, seed, offset
    )


def min_p_sampling_from_probs(
    probs: Tensor,
    min_p: Tensor | float,
    indices: Tensor | None = None,
    deterministic: bool = True,
    generator: torch.Generator | None = None,
    check_nan: bool = False,
    seed: int | None = None,
    offset: int | None = None,
) -> Tensor:
    """One int32 id per output row among the tokens with p >= min_p * max(p), renormalised."""
    rows = _rows(probs, indices, check_nan)
    return _ops().min_p_sampling_from_probs(  # type: ignore[no-any-return]
        rows, **_p("min_p", min_p), **_draw_words(rows, generator, seed, offset)
    )
