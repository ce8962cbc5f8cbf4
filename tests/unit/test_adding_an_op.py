"""docs/adding-an-op.md cannot rot: its example group is added to a copy of the package exactly
as documented (the files it shows, nothing else), the generator writes the files the doc says it
writes, then the new native op is checked end to end: the registry without torch, its JIT-compiled
CPU kernel and every other backend, the generated C++ lane on the default call, the torch bridge's
C++ kernel behind ``torch.ops.opmux``, the contract's errors everywhere, ``explain`` and the parity
harness (whose cells, lane and library-op checks for the op come from the registry)."""

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
SAMPLES = "tests/parity/samples/toy.py"
#: what the example adds by hand (package paths relative to opmux/kernels)
ADDED = {"ops/toy/__init__.py", "ops/toy/op.py", "jit/csrc/toy_cpu.cpp", "ops/toy/triton_kernels.py", SAMPLES}
#: what ``tools/gen_contracts.py`` then writes, and nothing else (the doc's table says so)
GENERATED = {
    "ops/toy/_contracts.py",
    "ops/toy/_entrypoints.py",
    "jit/include/opmux/contracts/toy.h",
    "jit/include/opmux/contracts/toy_cpu_lanes.inc",
    "jit/include/opmux/contracts/toy_cuda_lanes.inc",
}

CHECK = textwrap.dedent(
    """
    import os
    import sys
    import opmux.kernels as k
    assert "toy.scale" in k.all_ops() and "torch" not in sys.modules, "registry imports torch"
    import torch
    from opmux.kernels import explain, jit, registry, torch_kernels
    from opmux.kernels.explain import op_instance
    from opmux.kernels.ops.toy import scale

    def python_files(call):  # -> (call's result, the files of the Python functions it ran)
        seen = set()
        sys.setprofile(lambda frame, event, arg: seen.add(frame.f_code.co_filename) if event == "call" else None)
        try:
            return call(), seen
        finally:
            sys.setprofile(None)

    def contract_ran(files):
        return any(f.endswith(os.path.join("toy", "_contracts.py")) for f in files)

    assert {"aot", "jit", "triton", "torch"} <= set(registry.get("toy.scale").backend_names)
    torch_kernels.enable()  # the bridge: torch.ops.opmux's C++ kernels, the default calls' entries
    x = torch.randn(3, 8)

    # the CPU kernel, JIT-compiled from jit/csrc/toy_cpu.cpp, with the generated lane in the unit
    unit = jit.load_module("toy_cpu")
    assert unit["scale_cpu"] is not None and unit["scale_cpu_lane"] is not None
    for dtype in (torch.float32, torch.float16, torch.bfloat16):
        xd = x.to(dtype)
        for backend in ("jit", "torch", "triton", "reference"):
            torch.testing.assert_close(scale(xd, 0.5, backend=backend), (xd.double() * 0.5).to(dtype))
    assert explain("toy.scale", x).chosen == "jit"  # the default on the CPU: the native kernel

    # the default call: the generated lane (C++ check, then scale_cpu), no Python contract
    op = op_instance("toy.scale")
    torch.testing.assert_close(scale(x), x * 2)  # the first call selects jit and binds its lane
    assert ("jit", "cpu") in op._lanes and x.dtype in op._lane_cpu, (op._lanes, op._lane_cpu)
    calls = torch_kernels.entry_calls()
    y, files = python_files(lambda: scale(x, 0.5))
    assert torch_kernels.entry_calls() == calls + 1 and not contract_ran(files), sorted(files)
    torch.testing.assert_close(y, x * 0.5)
    out = torch.empty_like(x)
    assert scale(x, out=out) is out and torch.equal(out, x * 2)  # a caller's buffer: the lane too
    assert torch_kernels.entry_calls() == calls + 2
    # a form the lane refuses (a fresh result of a strided x) takes the Python contract
    y, files = python_files(lambda: scale(x[:, :4]))
    assert torch_kernels.entry_calls() == calls + 2 and contract_ran(files), sorted(files)
    torch.testing.assert_close(y, x[:, :4] * 2)

    # torch.ops.opmux.scale: the bridge's C++ kernel runs the lane, not the Python twin
    calls = torch_kernels.lane_calls()
    y, files = python_files(lambda: torch.ops.opmux.scale(x, 2.0))
    torch.testing.assert_close(y, x * 2)
    torch.ops.opmux.scale_out(out, x, 0.5)
    torch.testing.assert_close(out, x * 0.5)
    assert torch_kernels.lane_calls() == calls + 2, torch_kernels.lane_calls() - calls
    assert not any(f.endswith("_entrypoints.py") for f in files), sorted(files)

    # bad input: the contract's error, the same on every backend and through torch.ops.opmux
    bad = {
        "zero scale": ((x, 0.0), None),
        "int dtype": ((x.int(), 2.0), None),
        "grad input": ((x.clone().requires_grad_(), 2.0), None),
        "out dtype": ((x, 2.0), x.half()),
        "out shape": ((x, 2.0), torch.empty(3, 4)),
    }
    for case, (args, buf) in bad.items():
        seen = {}
        backends = (None, "jit", "triton", "torch", "reference")
        ways = [(b, lambda b=b: scale(*args, out=buf, backend=b)) for b in backends]
        if buf is None:
            ways.append(("torch.ops.opmux", lambda: torch.ops.opmux.scale(*args)))
        else:
            ways.append(("torch.ops.opmux", lambda: torch.ops.opmux.scale_out(buf, *args)))
        for where, call in ways:
            try:
                call()
            except (TypeError, ValueError) as exc:
                seen[where] = (type(exc).__name__, str(exc))
            else:
                raise AssertionError(f"{case}: {where} accepted it")
        assert len(set(seen.values())) == 1, (case, seen)
        assert "toy.scale" in seen[None][1], (case, seen)
    assert registry.verify_targets() == [], registry.verify_targets()
    print("toy ok")
    """
)


def _documented_files() -> dict[str, str]:
    blocks = re.findall(r"```(?:python|cpp) file=(\S+)\n(.*?)```", DOC.read_text(), flags=re.S)
    assert blocks, f"{DOC} shows no files"
    return dict(blocks)


def _tree(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def test_the_documented_steps_make_a_working_op(tmp_path: Path, shared_jit_cache: Path) -> None:
    pkg = tmp_path / "pkg"
    kernels = pkg / "opmux" / "kernels"
    shutil.copytree(
        ROOT / "python" / "opmux", pkg / "opmux", ignore=shutil.ignore_patterns("__pycache__", "*.so")
    )
    files = _documented_files()
    assert set(files) == ADDED
    # the kernel source holds the kernel only: its serving lane is generated from the contract
    assert not re.search(r"scale_cpu_lane\s*[(,]", files["jit/csrc/toy_cpu.cpp"])  # no definition, no export
    for rel, text in files.items():
        path = tmp_path / "samples" / "toy.py" if rel == SAMPLES else kernels / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = {
        **os.environ,
        "PYTHONPATH": str(pkg),
        "TRITON_INTERPRET": "1",
        # the session's cache: the torch bridge is built once per torch, whatever the package copy
        "OPMUX_CACHE_DIR": str(shared_jit_cache),
        "OPMUX_PARITY_SAMPLES": str(tmp_path / "samples"),
        "OPMUX_TORCH_KERNELS": "cpu",
    }
    env.pop("OPMUX_KERNEL_BACKEND", None)
    # the documented step after the declaration and the sources: the generator, which writes the
    # files the doc lists and nothing else
    before = _tree(kernels)
    gen = [sys.executable, str(ROOT / "tools" / "gen_contracts.py"), "--package", str(pkg / "opmux")]
    made = subprocess.run(gen, env=env, capture_output=True, text=True, cwd=tmp_path)
    assert made.returncode == 0, made.stderr
    assert _tree(kernels) - before == GENERATED, made.stdout
    doc = DOC.read_text()
    assert all(Path(rel).name in doc for rel in GENERATED)
    assert "scale_cpu_lane" in (kernels / "jit/include/opmux/contracts/toy_cpu_lanes.inc").read_text()
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
                "-rA",
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
    passed = set(re.findall(r"^PASSED \S+::(\S+)", out, flags=re.M))
    want = {
        f"test_parity[toy.scale-{b}-{d}]"
        for b in ("jit", "triton", "torch")
        for d in ("float32", "float16", "bfloat16")
    }
    want |= {f"test_bad_input_is_rejected[toy.scale-{b}]" for b in ("default", "jit", "triton")}
    # the generated lane against the Python contract, the bridge's C++ kernel and entry against
    # the Python twin, on every case: no test written for the op
    want |= {
        "test_lane_accepts_only_what_the_contract_accepts[toy.scale]",
        "test_cpp_kernel_is_the_python_kernel[toy.scale]",
        "test_default_entry_is_the_lane_call[toy.scale]",
    }
    assert want <= passed, (sorted(want - passed), out)


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


@pytest.mark.parametrize("rel", sorted(r for r in _documented_files() if r.endswith(".py")))
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
