"""``sgl_kernel.sampling``: the submodule where sgl_kernel defines its sampling entry points (the
package re-exports most of them; ``top_k_top_p_sampling_from_logits`` is reached as
``sgl_kernel.sampling.top_k_top_p_sampling_from_logits``). opmux.compat.sgl_kernel's ``sampling``
attribute; the engine-compat runner also installs it as ``sgl_kernel.sampling``. Imports no torch.
"""

from __future__ import annotations

from ._sampling import (
    min_p_sampling_from_probs,
    top_k_mask_logits,
    top_k_renorm_probs,
    top_k_top_p_sampling_from_logits,
    top_k_top_p_sampling_from_probs,
    top_p_renorm_probs,
    top_p_sampling_from_probs,
)

#: sgl_kernel's singular aliases
top_k_renorm_prob = top_k_renorm_probs
top_p_renorm_prob = top_p_renorm_probs

__all__ = [
    "min_p_sampling_from_probs",
    "top_k_mask_logits",
    "top_k_renorm_prob",
    "top_k_renorm_probs",
    "top_k_top_p_sampling_from_logits",
    "top_k_top_p_sampling_from_probs",
    "top_p_renorm_prob",
    "top_p_renorm_probs",
    "top_p_sampling_from_probs",
]
