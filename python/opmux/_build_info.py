"""Build facts of this copy of opmux.

This is the source tree's copy (``target = "source"``). Every wheel replaces it with the facts
of its build: setup.py writes target, distribution, version, toolchains, arch list, the AOT
libraries shipped (and why any were left out), the git commit and the build time.
"""

from typing import Any

BUILD_INFO: dict[str, Any] = {
    "target": "source",
    "distribution": None,
    "version": None,
    "toolchains": {},
    "archs": [],
    "ptx": None,
    "cuda": None,
    "aot": [],
    "aot_missing": {},
    "commit": None,
    "build_time": None,
}
