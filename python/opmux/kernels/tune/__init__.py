"""The tuner of launch configurations (``python -m opmux.kernels.tune``); imports no torch."""

from __future__ import annotations

from .models import MODELS, MOE_MODELS, model_shapes, moe_shapes
from .runner import Entry, Report, tune
from .space import DEFAULT_MS, candidates

__all__ = [
    "DEFAULT_MS",
    "MODELS",
    "MOE_MODELS",
    "Entry",
    "Report",
    "candidates",
    "model_shapes",
    "moe_shapes",
    "tune",
]
