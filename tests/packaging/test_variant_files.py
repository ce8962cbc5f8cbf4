"""tools/variants.py: the committed pyproject variants are exactly what the generator writes."""

from __future__ import annotations

import shutil
import sys

import pytest
from tools import targets, variants

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def test_committed_variants_do_not_drift(root):
    assert variants.check(root) == []


def test_template_is_the_default_target(root):
    template = (root / "pyproject.toml").read_text(encoding="utf-8")
    assert variants.render(template, targets.load()["cuda"]) == template


@pytest.mark.parametrize("name", ["cpu", "rocm", "xpu", "npu"])
def test_variant_content(root, name):
    t = targets.load()[name]
    data = tomllib.loads((root / t.pyproject).read_text(encoding="utf-8"))
    assert data["project"]["name"] == t.distribution
    assert data["tool"]["opmux"]["target"] == name
    assert data["project"]["dependencies"] == t.requirements
    assert data["project"]["requires-python"] == ">=3.10"
    globs = data["tool"]["setuptools"]["package-data"]["opmux"]
    assert {"py.typed", "kernels/jit/csrc/**/*", "kernels/jit/include/**/*"} <= set(globs)


def _copy(root, tmp_path):
    for f in ["targets.toml", "pyproject.toml", *(t.pyproject for t in targets.load().values())]:
        shutil.copy2(root / f, tmp_path / f)
    return tmp_path


def test_drift_is_detected_and_fixed(root, tmp_path):
    tree = _copy(root, tmp_path)
    path = tree / "pyproject_cpu.toml"
    path.write_text(path.read_text().replace('name = "opmux-cpu"', 'name = "opmux-cpu2"'))
    (tree / "pyproject_npu.toml").unlink()
    problems = variants.check(tree)
    assert len(problems) == 2
    assert problems[0].startswith(
        "pyproject_cpu.toml differs from the generator's output; run `nox -s variants`"
    )
    assert '-name = "opmux-cpu2"' in problems[0] and '+name = "opmux-cpu"' in problems[0]
    assert problems[1].startswith("pyproject_npu.toml is missing")
    assert variants.main(["--check", "--root", str(tree)]) == 1
    assert sorted(p.name for p in variants.write(tree)) == ["pyproject_cpu.toml", "pyproject_npu.toml"]
    assert variants.check(tree) == []


def test_table_change_reaches_the_variants(root, tmp_path):
    tree = _copy(root, tmp_path)
    table = tree / "targets.toml"
    table.write_text(table.read_text().replace('torch = "torch>=2.7"', 'torch = "torch>=2.8"'))
    problems = variants.check(tree)
    assert [p.split(" ", 1)[0] for p in problems] == ["pyproject_xpu.toml"]
    assert '+    "torch>=2.8",' in problems[0]
