"""Packaging tests: the build tooling under tools/, run against the tree (no wheel needed)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # tools/ is importable from the repository root


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT
