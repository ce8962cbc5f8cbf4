"""vLLM v1's ``vllm/v1/sample/ops/topk_topp_sampler.py`` entry points on opmux's sampling ops
(docs/compat.md): ``TopKTopPSampler``, ``random_sample``, ``apply_top_k_top_p``.

vLLM sorts each row (``apply_top_k_top_p``) and draws by an exponential race
(``probs.div_(q).argmax()``); here the thresholds come from opmux's no-sort kernels and the draw is
one inverse-CDF step per row, from the same distribution. Differences: ties at the top-k or top-p
boundary are all kept (vLLM's sort keeps an arbitrary subset of a tie at the top-p boundary), and
the random stream is opmux's (seeded from the device's default generator, or a request's own
``generators[i]``), so ids match vLLM's in distribution, not draw by draw. Imports no torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from opmux.kernels.ops._torch import torch

from ._sampling import random_words

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["TopKTopPSampler", "apply_top_k_top_p", "apply_top_k_top_p_triton", "random_sample"]

_LOGPROBS_MODES = ("raw_logprobs", "raw_logits", "processed_logits", "processed_logprobs")


def _ops() -> Any:
    from opmux.kernels.ops import sampling

    return sampling


def apply_top_k_top_p(logits: Tensor, k: Tensor | None, p: Tensor | None) -> Tensor:
    """``logits`` with everything outside the top-k then top-p set at -inf, in place (returned).
    ``k`` [B] (V: off), ``p`` [B] (1: off); top-p is taken on the top-k set's softmax, as vLLM."""
    if k is None and p is None:
        return logits
    s = _ops()
    if k is not None:
        s.top_k_mask_logits(logits, top_k_arr=k, out=logits)
    if p is not None:
        # a row of -inf only (a grammar mask leaving nothing) has no softmax: it stays as it is
        # (vLLM's no-op), its probabilities replaced by a uniform row for the op (no host read)
        dead = (logits.amax(dim=-1, keepdim=True) == -float("inf")).expand_as(logits)
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        probs = torch.where(dead, torch.full_like(probs, 1.0 / max(1, logits.shape[-1])), probs)
        kept = s.top_p_renorm_probs(probs, top_p_arr=p.float())
        logits.masked_fill_((kept == 0) & ~dead, -float("inf"))
    return logits


def apply_top_k_top_p_triton(
    logits: Tensor, k: Tensor | None, p: Tensor | None, mask_value: float = float("-inf")
) -> Tensor:
    """vLLM's Triton entry (``vllm/v1/sample/ops/topk_topp_triton.py``, what its
    ``apply_top_k_top_p`` calls for 8 rows and more): ``apply_top_k_top_p`` on a float32
    ``[B, V]`` ``logits``, in place (returned); ``k`` [B] int, ``p`` [B] float, either None.
    The positions masked out are set to ``mask_value`` (vLLM's default -inf)."""
    if logits.ndim != 2 or logits.dtype != torch.float32:
        raise ValueError(f"logits must be a 2-D float32 tensor, got {tuple(logits.shape)} {logits.dtype}")
    for name, t in (("k", k), ("p", p)):
        if t is not None and (t.ndim != 1 or t.shape[0] != logits.shape[0]):
            raise ValueError(f"{name} must have shape [{logits.shape[0]}], got {tuple(t.shape)}")
    if logits.shape[0] == 0 or (k is None and p is None):
        return logits
    logits = apply_top_k_top_p(logits, k, p)
    if mask_value != float("-inf"):
        logits.masked_fill_(logits == float("-inf"), mask_value)
    return logits


def random_sample(probs: Tensor, generators: dict[int, torch.Generator]) -> Tensor:
    """One id (int64) per row of ``probs`` (rows need not sum to 1): rows with a generator of their
    own draw from it, the others from the device's default generator; no synchronisation."""
    return _sample(probs, None, None, generators)


def _sample(
    probs: Tensor, k: Tensor | None, p: Tensor | None, generators: dict[int, torch.Generator]
) -> Tensor:
    """The ids of top_k_top_p_sampling_from_probs (top_k_first, vLLM's order), int64."""
    s = _ops()
    probs = probs.float()

    def draw(rows: Tensor, kk: Tensor | None, pp: Tensor | None, gen: torch.Generator | None) -> Tensor:
        seed, offset = random_words(rows.device, gen)
        kw: dict[str, Any] = {"seed_tensor": seed, "offset_tensor": offset}
        if kk is not None:
            kw["top_k_arr"] = kk
        if pp is not None:
            kw["top_p_arr"] = pp.float()
        return s.top_k_top_p_sampling_from_probs(rows, **kw)  # type: ignore[no-any-return]

    ids = draw(probs, k, p, None).long()
    for i, gen in generators.items():
        sl = slice(i, i + 1)
        ids[i] = draw(probs[sl], None if k is None else k[sl], None if p is None else p[sl], gen)[0]
    return ids.view(-1)


class TopKTopPSampler:
    """vLLM's module: ``forward(logits, generators, k, p) -> (ids int64 [B], logits or logprobs
    for the processed logprobs modes, else None)``, also as a call. ``logits`` may be updated in
    place. A plain class (no parameters or buffers to register): defining it imports no torch."""

    def __init__(self, logprobs_mode: str = "raw_logprobs") -> None:
        if logprobs_mode not in _LOGPROBS_MODES:
            raise ValueError(f"logprobs_mode must be one of {_LOGPROBS_MODES}, got {logprobs_mode!r}")
        self.logprobs_mode = logprobs_mode

    def forward(
        self, logits: Tensor, generators: dict[int, torch.Generator], k: Tensor | None, p: Tensor | None
    ) -> tuple[Tensor, Tensor | None]:
        if self.logprobs_mode.startswith("processed"):
            logits = apply_top_k_top_p(logits, k, p)
            out = (
                logits
                if self.logprobs_mode == "processed_logits"
                else logits.log_softmax(-1, dtype=torch.float32)
            )
            return _sample(logits.softmax(dim=-1, dtype=torch.float32), None, None, generators), out
        probs = logits.softmax(dim=-1, dtype=torch.float32)
        return _sample(probs, k, p, generators), None

    forward_native = forward
    forward_cuda = forward
    __call__ = forward
