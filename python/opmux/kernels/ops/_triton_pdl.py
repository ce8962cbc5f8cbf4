"""Whether a Triton launch may go programmatically (PDL) behind the kernel before it: the rule the
ops with a two-kernel Triton launch share (paged decode's split and merge, the MoE decode's up and
down kernels)."""

from __future__ import annotations

import functools
import os

import torch

__all__ = ["triton_pdl"]

#: Triton's CPU interpreter runs launches in order: no PDL there
_INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"


@functools.cache
def triton_pdl(device: torch.device) -> bool:
    """CUDA sm_90+ only: never in the interpreter, never on ROCm (its torch device is also
    ``cuda`` and its compiler has no ``griddepcontrol``), never below sm_90."""
    if _INTERPRETED or device.type != "cuda" or torch.version.hip:
        return False
    return torch.cuda.get_device_capability(device)[0] >= 9
