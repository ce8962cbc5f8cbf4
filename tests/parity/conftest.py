"""Parity harness configuration: the target under test and the coverage matrix output.

Run against an installed wheel (``nox -s parity-cpu``): the harness refuses to test a
source tree unless ``--allow-tree`` is given, so a green run proves the artefact.
"""

from __future__ import annotations

import json
import os
import platform as _pyplatform
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# parity_samples.py and samples/ sit beside this file; --import-mode=importlib (nox parity-<target>,
# the rehearsal, the H200 runs) does not put the test directory on sys.path by itself.
if str(Path(__file__).resolve().parent) not in sys.path:
    sys.path.insert(0, str(Path(__file__).resolve().parent))


@dataclass
class Matrix:
    """op x backend x dtype cells: passed, failed, or n/a with the reason."""

    target: str
    device_type: str
    cells: dict[tuple[str, str, str], dict[str, Any]] = field(default_factory=dict)

    def add(self, op: str, backend: str, dtype: str, status: str, detail: str = "", cases: int = 0) -> None:
        self.cells[(op, backend, dtype)] = {"status": status, "detail": detail, "cases": cases}

    def device_name(self) -> str:
        import torch

        if self.device_type in ("cuda", "hip") and torch.cuda.is_available():
            return torch.cuda.get_device_name()
        return f"cpu ({_pyplatform.machine()})"

    def write(self, path: Path) -> None:
        import torch

        import opmux

        path.parent.mkdir(parents=True, exist_ok=True)
        meta = {
            "target": self.target,
            "device": self.device_name(),
            "torch": torch.__version__,
            "opmux": getattr(opmux, "__version__", "?"),
        }
        rows = [{"op": o, "backend": b, "dtype": d, **v} for (o, b, d), v in sorted(self.cells.items())]
        path.with_suffix(".json").write_text(json.dumps({"meta": meta, "cells": rows}, indent=1) + "\n")
        dtypes = [
            d for d in ("float32", "float16", "bfloat16", "int32") if any(c[2] == d for c in self.cells)
        ]
        lines = [
            f"# Coverage matrix: target `{self.target}` on {meta['device']}",
            "",
            f"torch {meta['torch']}, opmux {meta['opmux']}. Every op x backend x dtype cell; "
            "`pass (N)` = N parity cases matched the reference and the float64 oracle.",
            "",
            "| op | backend | " + " | ".join(dtypes) + " |",
            "|---|---|" + "---|" * len(dtypes),
        ]
        for op, backend in sorted({(o, b) for o, b, _ in self.cells}):
            row = []
            for d in dtypes:
                c = self.cells.get((op, backend, d))
                if c is None:
                    row.append("-")
                elif c["status"] == "passed":
                    row.append(f"pass ({c['cases']})")
                else:
                    row.append(f"{c['status']}: {c['detail']}".replace("|", "/"))
            lines.append(f"| {op} | {backend} | " + " | ".join(row) + " |")
        path.with_suffix(".md").write_text("\n".join(lines) + "\n")


_DEVICES = {"cpu": "cpu", "cuda": "cuda", "cuda12": "cuda", "rocm": "hip", "xpu": "xpu", "npu": "npu"}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("opmux parity")
    group.addoption("--target", default="cpu", choices=sorted(_DEVICES), help="wheel target under test")
    group.addoption(
        "--matrix-out", default=None, help="write the coverage matrix here (.json; .md beside it)"
    )
    group.addoption(
        "--allow-tree", action="store_true", help="allow testing a source tree, not an installed wheel"
    )


def pytest_configure(config: pytest.Config) -> None:
    target = config.getoption("--target")
    if target == "cpu":
        # Triton kernels run on CPU only through the interpreter; set before triton loads.
        os.environ.setdefault("TRITON_INTERPRET", "1")
    os.environ["OPMUX_FALLBACK"] = "error"  # a parity run never silently tests another backend
    # the library ops' C++ kernels are built and checked by test_torch_kernels.py, not in the
    # background of every test
    os.environ.setdefault("OPMUX_TORCH_KERNELS", "off")
    config.stash[MATRIX] = Matrix(target=target, device_type=_DEVICES[target])


MATRIX = pytest.StashKey[Matrix]()


def pytest_sessionstart(session: pytest.Session) -> None:
    config = session.config
    import opmux

    where = Path(opmux.__file__).resolve()
    if "site-packages" not in where.parts and not config.getoption("--allow-tree"):
        raise pytest.UsageError(
            f"opmux was imported from {where}, not an installed wheel; pass --allow-tree to test a tree"
        )
    device = _DEVICES[config.getoption("--target")]
    if device != "cpu":
        import torch

        ok = {
            "cuda": lambda: torch.cuda.is_available() and torch.version.hip is None,
            "hip": lambda: torch.cuda.is_available() and torch.version.hip is not None,
            "xpu": lambda: hasattr(torch, "xpu") and torch.xpu.is_available(),
            "npu": lambda: hasattr(torch, "npu") and torch.npu.is_available(),
        }[device]
        if not ok():
            raise pytest.UsageError(
                f"parity-{config.getoption('--target')}: no {device} device on this machine; "
                "this session must run where the device is (it fails rather than skips)"
            )


@pytest.fixture(scope="session")
def matrix(request: pytest.FixtureRequest) -> Matrix:
    return request.config.stash[MATRIX]


@pytest.fixture(scope="session")
def device_type(matrix: Matrix) -> str:
    return matrix.device_type


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    config = session.config
    m = config.stash.get(MATRIX, None)
    if m is None:
        return
    worker_output = getattr(config, "workeroutput", None)
    if worker_output is not None:  # a pytest-xdist worker: its cells go to the controller
        worker_output[_WORKER_KEY] = [[*key, cell] for key, cell in m.cells.items()]
        return
    out = config.getoption("--matrix-out")
    if out and m.cells:
        m.write(Path(out))


#: where a pytest-xdist worker hands its matrix cells to the controller (``-n N``: the GPU runs
#: spread the Triton compilations of the parity cells over the machine's cores)
_WORKER_KEY = "opmux_parity_matrix"


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node: Any, error: Any) -> None:
    """pytest-xdist's controller: merge a finished worker's cells into the one matrix."""
    m = node.config.stash.get(MATRIX, None)
    if m is not None:
        for op, backend, dtype, cell in getattr(node, "workeroutput", {}).get(_WORKER_KEY, []):
            m.cells[(op, backend, dtype)] = cell
