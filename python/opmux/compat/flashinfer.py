"""FlashInfer's ``flashinfer.sampling`` names and signatures, running opmux's sampling ops
(docs/compat.md): ``from opmux.compat import flashinfer`` then ``flashinfer.top_k_renorm_probs(...)``.
The rules are opmux's (ties at a threshold kept, one inverse-CDF draw per row: no rejection rounds,
so ``deterministic`` changes nothing); ``seed`` / ``offset`` (newer FlashInfer) or ``generator`` pick
the draw. Importing this module imports no torch.
"""

from __future__ import annotations

from ._sampling import (
    min_p_sampling_from_probs,
    sampling_from_probs,
    top_k_mask_logits,
    top_k_renorm_probs,
    top_k_sampling_from_probs,
    top_k_top_p_sampling_from_logits,
    top_k_top_p_sampling_from_probs,
    top_p_renorm_probs,
    top_p_sampling_from_probs,
)

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
