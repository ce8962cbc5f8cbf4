"""docs/adding-an-op.md cannot rot: its example group is added to a copy of the package exactly
as documented (the files it shows, nothing else), then the new op is checked end to end: the
registry without torch, every backend, the contract, ``torch.ops.opmux``, ``explain`` and the
parity harness (whose cells for the op come from the registry)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "adding-an-op.md"

CHECK = textwrap.dedent(
    """
    import sys
    import opmux.kernels as k
    assert "toy.scale" in k.all_ops() and "torch" not in sys.modules, "registry imports torch"
    import torch
    from opmux.kernels import explain, registry
    from opmux.kernels.ops.toy import scale
    x = torch.randn(3, 8)
    for backend in ("torch", "triton", "reference"):
        torch.testing.assert_close(scale(x, backend=backend), x * 2)
    torch.testing.assert_close(scale(x, 0.5), x * 0.5)
    out = torch.empty_like(x)
    assert scale(x, out=out) is out and torch.equal(out, x * 2)
    torch.testing.assert_close(torch.ops.opmux.scale(x, 2.0), x * 2)
    for bad, err in (((x, 0.0), ValueError), ((x.int(),), TypeError), ((x.requires_grad_(),), ValueError)):
        try:
            scale(*bad)
        except err as exc:
            assert "toy.scale" in str(exc), exc
        else:
            raise AssertionError(f"{bad} was accepted")
    assert explain("toy.scale", x.detach()).chosen == "torch"
    assert registry.verify_targets() == [], registry.verify_targets()
    print("toy ok")
    """
)


def _documented_files() -> dict[str, str]:
    blocks = re.findall(r"```python file=(\S+)\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, f"{DOC} shows no files"
    return dict(blocks)


def test_the_documented_steps_make_a_working_op(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    shutil.copytree(
        ROOT / "python" / "opmux", pkg / "opmux", ignore=shutil.ignore_patterns("__pycache__", "*.so")
    )
    files = _documented_files()
    samples = "tests/parity/samples/toy.py"
    assert set(files) == {"ops/toy/__init__.py", "ops/toy/op.py", "ops/toy/triton_kernels.py", samples}
    for rel, text in files.items():
        path = tmp_path / "samples" / "toy.py" if rel == samples else pkg / "opmux" / "kernels" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = {
        **os.environ,
        "PYTHONPATH": str(pkg),
        "TRITON_INTERPRET": "1",
        "OPMUX_CACHE_DIR": str(tmp_path / "c"),
    }
    env["OPMUX_PARITY_SAMPLES"] = str(tmp_path / "samples")
    env.pop("OPMUX_KERNEL_BACKEND", None)
    # the documented step after the declaration: its contract's checks and its public, bound and
    # library-op functions, written by the generator
    gen = [sys.executable, str(ROOT / "tools" / "gen_contracts.py"), "--package", str(pkg / "opmux")]
    made = subprocess.run(gen, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    for name in ("_contracts.py", "_entrypoints.py"):
        assert (pkg / "opmux/kernels/ops/toy" / name).is_file(), made.stdout
    run = subprocess.run([sys.executable, "-c", CHECK], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert run.returncode == 0 and "toy ok" in run.stdout, run.stdout + run.stderr
    parity = subprocess.run(
        [
            *(
                sys.executable,
                "-m",
                "pytest",
                str(ROOT / "tests" / "parity"),
                "--target",
                "cpu",
                "--allow-tree",
            ),
            *(
                "-q",
                "-p",
                "no:cacheprovider",
                "-k",
                "toy",
                f"--rootdir={ROOT}",
                "-c",
                str(ROOT / "pyproject.toml"),
            ),
        ],
        env=env,
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    out = parity.stdout + parity.stderr
    assert parity.returncode == 0, out
    passed = re.search(r"(\d+) passed", out)
    assert passed and int(passed.group(1)) >= 6, out  # torch and triton x 3 dtypes, bad inputs


def test_a_native_unit_needs_no_table_row(tmp_path: Path) -> None:
    """A group's native sources are its only native files: dropping ``<group>_cpu.cpp`` and
    ``<group>_cuda.cu`` into ``jit/csrc`` makes the JIT modules and the AOT units' includes."""
    from opmux.kernels.jit import modules

    csrc = tmp_path / "csrc"
    shutil.copytree(modules.CSRC, csrc)
    (csrc / "toy_cpu.cpp").write_text("// toy\n")
    (csrc / "toy_cuda.cu").write_text("// toy\n")
    (csrc / "notes.txt").write_text("not a unit\n")
    table = modules.scan(csrc)
    assert table["toy_cpu"] == modules.JitModule("toy_cpu", ("toy_cpu.cpp",), "cpu")
    assert table["toy_cuda"] == modules.JitModule("toy_cuda", ("toy_cuda.cu",), "cuda")
    assert set(table) == set(modules.MODULES) | {"toy_cpu", "toy_cuda"}
    for device, unit in (("cpu", "toy_cpu.cpp"), ("cuda", "toy_cuda.cu")):
        header = modules.write_aot_header(device, tmp_path / "units", csrc) / f"opmux_aot_{device}_units.h"
        includes = re.findall(r'#include "(\S+)"', header.read_text())
        assert unit in includes and includes == [m.sources[0] for m in table.values() if m.device == device]
        aot = (ROOT / "csrc" / f"aot_{device}.{unit.rpartition('.')[2]}").read_text()
        assert f'#include "{header.name}"' in aot and '_cpu.cpp"' not in aot  # lists no unit itself


@pytest.mark.parametrize("rel", sorted(_documented_files()))
def test_the_documented_files_are_lint_clean(rel: str) -> None:
    """The example is code people copy: it must pass the project's own ruff rules."""
    ruff = shutil.which("ruff")
    if ruff is None:
        pytest.skip("ruff is not installed here (nox -s lint runs it on the tree)")
    text = _documented_files()[rel]
    run = subprocess.run(
        [ruff, "check", "--config", str(ROOT / "pyproject.toml"), "--stdin-filename", rel, "-"],
        input=text,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stdout + run.stderr
