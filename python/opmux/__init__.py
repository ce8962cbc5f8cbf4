"""opmux: one kernel namespace for LLM-serving operators (placeholder; the lead fills this in)."""

from __future__ import annotations

__all__: list[str] = []
