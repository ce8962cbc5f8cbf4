"""Integrations with model libraries: ``opmux.integrations.transformers.kernelize(model)``.

Importing this package imports nothing heavy; each integration imports its library when used.
"""

from __future__ import annotations

__all__ = ["transformers"]
