"""Fault injection for platform detection: every probe that raises (any exception, SystemExit
included), a version field of the wrong type, a vendor import that hangs. Detection answers
with a reason in ``notes`` (or a clear PlatformDetectionError), never a raw traceback or a hang,
and ``env`` / ``explain`` keep working on such a torch."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

import opmux
from opmux.kernels import platform
from opmux.kernels.platform import PlatformDetectionError, detect_from

PYTHONPATH = str(Path(opmux.__file__).resolve().parents[1])


class Raising:
    """Wraps ``base``; reading attribute ``name`` raises ``exc``, everything else delegates."""

    def __init__(self, base: Any, name: str, exc: BaseException) -> None:
        object.__setattr__(self, "_base", base)
        object.__setattr__(self, "_name", name)
        object.__setattr__(self, "_exc", exc)

    def __getattr__(self, attr: str) -> Any:
        if attr == object.__getattribute__(self, "_name"):
            raise object.__getattribute__(self, "_exc")
        return getattr(object.__getattribute__(self, "_base"), attr)


def fake_cuda(available: bool = True) -> SimpleNamespace:
    props = SimpleNamespace(name="NVIDIA H200")
    return SimpleNamespace(
        is_available=lambda: available,
        device_count=lambda: 1 if available else 0,
        current_device=lambda: 0,
        get_device_capability=lambda i: (9, 0),
        get_device_properties=lambda i: props,
        get_device_name=lambda i: "NVIDIA H200",
    )


def fake_torch(*, cuda: bool = True, hip: Any = None) -> SimpleNamespace:
    return SimpleNamespace(
        __version__="2.13.0",
        version=SimpleNamespace(cuda="13.0" if cuda else None, hip=hip, xpu=None),
        cuda=fake_cuda(available=cuda),
        xpu=SimpleNamespace(is_available=lambda: False),
        npu=SimpleNamespace(is_available=lambda: False),
        backends=SimpleNamespace(mps=SimpleNamespace(is_available=lambda: False)),
        _C=SimpleNamespace(),
    )


def with_raising(torch: SimpleNamespace, path: str, exc: BaseException) -> Any:
    """``torch`` where reading ``path`` (``cuda``, ``version.hip``, ...) raises ``exc``."""
    parent_path, _, name = path.rpartition(".")
    if not parent_path:
        return Raising(torch, name, exc)
    parent = getattr(torch, parent_path)
    setattr(torch, parent_path, Raising(parent, name, exc))
    return torch


def detect(torch: Any, **kw: Any) -> platform.Platform:
    kw.setdefault("env", {})
    kw.setdefault("path_exists", lambda path: False)
    kw.setdefault("load_module", lambda name: None)
    return detect_from(torch, **kw)


ATTRS = ["cuda", "xpu", "npu", "backends.mps", "version.hip", "__version__"]
EXCS = [RuntimeError("driver exploded"), ImportError("libfoo.so: cannot open shared object file")]


@pytest.mark.parametrize("exc", EXCS, ids=lambda e: type(e).__name__)
@pytest.mark.parametrize("attr", ATTRS)
def test_a_raising_attribute_is_a_noted_unusable_device(attr: str, exc: BaseException) -> None:
    """The 12 shapes: each attribute raising RuntimeError or ImportError. A device module that
    raises is unusable (the probes go on to the next kind: here none, so cpu); a raising version
    field leaves a working CUDA device detected. Detection never raises; the reason is noted."""
    device_module = attr in ("cuda", "xpu", "npu", "backends.mps")
    p = detect(with_raising(fake_torch(cuda=not device_module), attr, exc))
    expected = "cpu" if device_module else "cuda"
    assert p.device_type == expected
    assert any(f"torch.{attr} raised {type(exc).__name__}: {exc}" in n for n in p.notes), p.notes
    if attr == "__version__":
        assert p.torch_version is None
    if expected == "cuda":
        assert p.arch == "sm_90"


@pytest.mark.parametrize("attr", ["cuda", "xpu", "npu", "backends.mps"])
def test_system_exit_from_a_probe_is_caught(attr: str) -> None:
    p = detect(with_raising(fake_torch(cuda=False), attr, SystemExit(3)))
    assert p.device_type == "cpu"
    assert any("raised SystemExit: 3" in n for n in p.notes)


def test_raising_device_method_after_attribute_access() -> None:
    torch = fake_torch()
    torch.cuda = Raising(torch.cuda, "get_device_properties", ImportError("no props"))
    p = detect(torch)
    assert (p.device_type, p.arch, p.device_name) == (
        "cuda",
        "sm_90",
        "NVIDIA H200",
    )  # get_device_name answers
    assert any("get_device_properties raised ImportError" in n for n in p.notes)


def test_float_hip_version_is_rocm() -> None:
    torch = fake_torch(hip=6.2)
    torch.cuda.get_device_properties = lambda i: SimpleNamespace(name="MI300X", gcnArchName="gfx942:xnack-")
    p = detect(torch)
    assert (p.device_type, p.runtime_version, p.arch) == ("hip", "6.2", "gfx942")
    assert any("torch.version.hip is a float (6.2)" in n for n in p.notes)


@pytest.mark.parametrize("value", [object(), ["6.2"], b"6.2"], ids=["object", "list", "bytes"])
def test_wrong_typed_hip_version_is_ignored_with_a_note(value: Any) -> None:
    p = detect(fake_torch(hip=value))
    assert p.device_type == "cuda"
    assert any("torch.version.hip is a" in n and "ignored" in n for n in p.notes)


def test_wrong_typed_torch_version() -> None:
    torch = fake_torch()
    torch.__version__ = (2, 13)
    p = detect(torch)
    assert p.torch_version is None
    assert any("torch.__version__ is a tuple" in n for n in p.notes)


def test_wrong_typed_capability() -> None:
    torch = fake_torch()
    torch.cuda.get_device_capability = lambda i: ("nine", "zero")
    p = detect(torch)
    assert p.device_type == "cuda" and p.capability is None and p.arch is None


def test_hung_vendor_import_times_out() -> None:
    torch = fake_torch(cuda=False)
    del torch.npu

    def hang(name: str) -> Any:
        time.sleep(30)

    start = time.monotonic()
    p = detect(torch, env={"OPMUX_PROBE_TIMEOUT": "0.3"}, load_module=hang)
    assert time.monotonic() - start < 5
    assert p.device_type == "cpu"
    assert any("import torch_npu raised ProbeTimeout" in n and "0.3 s" in n for n in p.notes), p.notes


def test_hung_vendor_import_with_npu_evidence_is_a_clear_error() -> None:
    torch = fake_torch(cuda=False)
    del torch.npu
    with pytest.raises(PlatformDetectionError, match=r"did not finish within 0\.3 s"):
        detect(
            torch,
            env={"OPMUX_PROBE_TIMEOUT": "0.3"},
            load_module=lambda name: time.sleep(30),
            path_exists=lambda path: path == "/dev/davinci0",
        )


def test_system_exit_from_vendor_import() -> None:
    torch = fake_torch(cuda=False)
    del torch.npu

    def exits(name: str) -> Any:
        raise SystemExit("torch_npu: no CANN toolkit")

    p = detect(torch, load_module=exits)
    assert p.device_type == "cpu"
    assert any("import torch_npu raised SystemExit: torch_npu: no CANN toolkit" in n for n in p.notes)


# -- end to end: the bug-report tools on a broken torch ------------------------------------------

FAKE_TORCH = {
    "raising_cuda": """
        __version__ = "2.13.0"
        def __getattr__(name):
            if name == "cuda":
                raise RuntimeError("CUDA driver initialization failed")
            raise AttributeError(name)
    """,
    "exits_on_import": """
        raise SystemExit("torch: refusing to import here")
    """,
}


def run_cli(tmp_path: Path, body: str, *args: str) -> subprocess.CompletedProcess[str]:
    pkg = tmp_path / "faketorch" / "torch"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text(textwrap.dedent(body))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "faketorch"), PYTHONPATH]),
        "OPMUX_CACHE_DIR": str(tmp_path / "cache"),
    }
    env.pop("OPMUX_DEVICE", None)
    return subprocess.run(
        [sys.executable, "-m", "opmux.kernels", *args], capture_output=True, text=True, env=env, timeout=120
    )


def test_env_shows_the_reason_for_a_raising_torch_cuda(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, FAKE_TORCH["raising_cuda"], "env", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    info = json.loads(proc.stdout)
    assert info["platform"]["device_type"] == "cpu"
    assert any("CUDA driver initialization failed" in n for n in info["platform"]["notes"])


def test_env_survives_torch_raising_system_exit(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, FAKE_TORCH["exits_on_import"], "env", "--json")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    info = json.loads(proc.stdout)
    assert "refusing to import here" in info["platform"]["error"]


def test_explain_reports_torch_raising_system_exit(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, FAKE_TORCH["exits_on_import"], "explain", "layernorm.rmsnorm")
    assert "Traceback" not in proc.stderr
    assert proc.returncode in (0, 1)
    if proc.returncode == 1:
        assert proc.stderr.startswith("error: ") and "refusing to import here" in proc.stderr
