"""Every docstring example in the package runs (and so stays true)."""

from __future__ import annotations

import doctest
import importlib
import pkgutil

import pytest

import opmux

SKIP = ("__main__", "triton_kernels")  # CLIs; Triton kernels (no examples, need a device or interpreter)
MODULES = sorted(
    m.name
    for m in pkgutil.walk_packages(opmux.__path__, "opmux.")
    if not any(part in SKIP for part in m.name.split(".")) and m.name != "opmux._version"
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{name}: {result.failed} docstring example(s) failed"


def test_the_readme_example_runs() -> None:
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    block = re.search(r"## Using the ops\n\n```python\n(.*?)```", readme, re.S)
    assert block is not None
    exec(compile(block.group(1), "README.md", "exec"), {})
