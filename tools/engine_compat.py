"""Run the engines' own kernel test files, unchanged, against opmux's compat modules.

    python tools/engine_compat.py [--device cpu|cuda] FOLDER [-- PYTEST_ARGS...]

FOLDER holds upstream test files a developer fetched (sgl-kernel/tests/test_norm.py,
vllm tests/kernels/core/test_layernorm.py, ...; never committed here). Before pytest collects
them, import shims make ``sgl_kernel`` resolve to ``opmux.compat.sgl_kernel`` and
``vllm._custom_ops`` to ``opmux.compat.vllm`` (only where the real packages are absent or
``--shadow`` is given). With ``--device cpu`` the tests' hard-coded CUDA device is mapped to the
CPU (``.to(0)``, ``.cuda()``, ``device="cuda"``), the rest of each file running unchanged
(the "device choice aside" of the issue); ``--device cuda`` changes nothing.

The summary at the end counts outcomes per file and groups failures by their first line, so a
missing signature (TypeError / AttributeError) stands apart from a numerical difference.
Exit status: pytest's.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def install_shims(shadow: bool = False) -> list[str]:
    """``sgl_kernel`` -> opmux.compat.sgl_kernel, ``vllm._custom_ops`` -> opmux.compat.vllm.
    Returns what it installed."""
    sys.path.insert(0, str(ROOT / "python"))
    installed = []
    if shadow or importlib.util.find_spec("sgl_kernel") is None:
        sys.modules["sgl_kernel"] = importlib.import_module("opmux.compat.sgl_kernel")
        installed.append("sgl_kernel -> opmux.compat.sgl_kernel")
    if shadow or importlib.util.find_spec("vllm") is None:
        ops = importlib.import_module("opmux.compat.vllm")
        pkg = sys.modules.get("vllm")
        if pkg is None:
            pkg = types.ModuleType("vllm")
            pkg.__path__ = []  # a package: other vllm submodules are absent (ImportError names them)
            sys.modules["vllm"] = pkg
        pkg._custom_ops = ops  # type: ignore[attr-defined]
        sys.modules["vllm._custom_ops"] = ops
        installed.append("vllm._custom_ops -> opmux.compat.vllm")
    return installed


def _cpu_device_mode() -> Any:
    """A torch function mode that sends every CUDA device argument to the CPU."""
    import torch
    from torch.overrides import TorchFunctionMode

    def cpu(d: Any) -> Any:
        if isinstance(d, bool):
            return d
        if isinstance(d, int) or (isinstance(d, str) and d.startswith("cuda")):
            return "cpu"
        if isinstance(d, torch.device) and d.type == "cuda":
            return torch.device("cpu")
        return d

    moves = {torch.Tensor.to, torch.Tensor.cuda}

    class CpuDevice(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
        ) -> Any:
            kwargs = dict(kwargs or {})
            if "device" in kwargs:
                kwargs["device"] = cpu(kwargs["device"])
            if func is torch.Tensor.cuda:
                return args[0]
            if func in moves and len(args) > 1:
                args = (args[0], cpu(args[1]), *args[2:])
            return func(*args, **kwargs)

    for name in ("synchronize", "empty_cache"):  # no device to wait for
        setattr(torch.cuda, name, lambda *a, **k: None)
    return CpuDevice()


class _Plugin:
    def __init__(self, device: str, shadow: bool) -> None:
        self.device, self.shadow = device, shadow
        self.mode: Any = None
        self.outcomes: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.reasons: collections.Counter[str] = collections.Counter()

    def pytest_configure(self, config: Any) -> None:
        for line in install_shims(self.shadow):
            print(f"engine-compat: {line}")
        if self.device == "cpu":
            self.mode = _cpu_device_mode()
            self.mode.__enter__()  # for collection too: parametrize lists may build tensors
            print("engine-compat: CUDA device arguments run on the CPU")

    def pytest_unconfigure(self, config: Any) -> None:
        if self.mode is not None:
            self.mode.__exit__(None, None, None)

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when != "call" and not (report.failed or report.skipped):
            return
        name = report.nodeid.split("::")[0]
        outcome = "error" if report.failed and report.when != "call" else report.outcome
        self.outcomes[name][outcome] += 1
        if report.failed:
            text = str(getattr(report.longrepr, "reprcrash", None) and report.longrepr.reprcrash.message)
            self.reasons[f"{outcome}: {text.splitlines()[0][:160] if text else '?'}"] += 1
        elif report.skipped and isinstance(report.longrepr, tuple):
            self.reasons[f"skipped: {str(report.longrepr[2])[:160]}"] += 1

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            name = report.nodeid or "?"
            self.outcomes[name]["collection error"] += 1
            text = str(report.longrepr).strip().splitlines()
            self.reasons[f"collection error: {text[-1][:160] if text else '?'}"] += 1

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        tr.section("engine-compat summary")
        for name, counts in sorted(self.outcomes.items()):
            tr.write_line(f"{name}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
        tr.write_line("")
        for reason, n in self.reasons.most_common(25):
            tr.write_line(f"{n:6d}  {reason}")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("folder", type=Path, help="a folder of upstream test files (or one file)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    p.add_argument("--shadow", action="store_true", help="shim even where sgl_kernel / vllm are installed")
    args = p.parse_args(argv)
    if not args.folder.exists():
        p.error(f"{args.folder} does not exist")
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    import os

    # the device decides: Triton's interpreter on the CPU, compiled kernels on a GPU (whatever the
    # caller's environment says; triton reads it when its kernels are defined, i.e. later)
    os.environ["TRITON_INTERPRET"] = "1" if device == "cpu" else "0"
    import pytest

    plugin = _Plugin(device, args.shadow)
    # rootdir/confcutdir at the folder: the upstream files run without this repo's conftests
    return int(
        pytest.main(
            [
                str(args.folder),
                "-p",
                "no:cacheprovider",
                "--continue-on-collection-errors",
                "--rootdir",
                str(args.folder),
                *extra,
            ],
            plugins=[plugin],
        )
    )


if __name__ == "__main__":
    sys.exit(main())
