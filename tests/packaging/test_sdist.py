"""One sdist, every wheel; reproducible bytes; the shipped library loads; the install guard.

Builds for real (isolated `python -m build`, about 40 s in all): one snapshot of the tree,
copied to two directories, each builds the sdist and the cpu wheel from it (tools/reproducible.py);
the npu wheel is built from the first sdist. The snapshot has no git, so the version is the
visibly-dev fallback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from tools import from_sdist, reproducible, targets, wheel_check

pytestmark = pytest.mark.slow

DEV_VERSION = "0.0.0.dev0"


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SETUPTOOLS_SCM", "OPMUX_"))}
    env["SOURCE_DATE_EPOCH"] = "1700000000"
    return env


@pytest.fixture(scope="module")
def builds(root, tmp_path_factory) -> list[reproducible.Build]:
    return reproducible.build_twice(root, tmp_path_factory.mktemp("repro"), target="cpu", env=_env())


@pytest.fixture(scope="module")
def npu_wheel(builds, tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("npu")
    return from_sdist.build_wheel(builds[0].sdist, "npu", work, work / "dist", env=_env())


def _build_info(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as zf:
        return wheel_check.read_build_info(zf.read("opmux/_build_info.py").decode())


def test_sdist_carries_every_target(builds):
    sdist = builds[0].sdist
    assert sdist.name == f"opmux-{DEV_VERSION}.tar.gz"
    with tarfile.open(sdist) as tf:
        names = {m.name.split("/", 1)[1] for m in tf.getmembers() if "/" in m.name}
    table = targets.load()
    assert {t.pyproject for t in table.values()} <= names
    assert {"targets.toml", "setup.py", "tools/targets.py", "tools/release.py", "csrc/aot_cpu.cpp"} <= names
    assert wheel_check.check_sdist(sdist, builds[0].src, table["cuda"]) == []


@pytest.mark.parametrize("name", ["cpu", "npu"])
def test_one_sdist_builds_each_target(builds, npu_wheel, name):
    wheel = builds[0].wheel if name == "cpu" else npu_wheel
    target = targets.load()[name]
    assert wheel.name.startswith(f"{target.distribution.replace('-', '_')}-{DEV_VERSION}-py3-none-")
    info = _build_info(wheel)
    assert (info["target"], info["distribution"], info["version"], info["dev"]) == (
        name,
        target.distribution,
        DEV_VERSION,
        True,
    )
    assert info["aot"] == list(target.aot.filenames)
    assert wheel_check.check_wheel(wheel, builds[0].src, target) == []


def test_builds_are_reproducible(builds):
    assert reproducible.problems(builds) == []


def test_rpath_detection_works(tmp_path):
    src = tmp_path / "x.cpp"
    src.write_text("int f() { return 1; }\n")
    lib = tmp_path / "libx.so"
    subprocess.run(
        ["c++", "-shared", "-fPIC", str(src), "-o", str(lib), "-Wl,-rpath,/tmp/build-env-x"], check=True
    )
    assert reproducible.elf_runpaths(lib.read_bytes()) == ["/tmp/build-env-x"]


def _venv(path: Path, *wheels: str | Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(path)], check=True)
    py = path / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", *map(str, wheels)],
        check=True,
    )
    return py


def _run(py: Path, code: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OPMUX_AOT", "OPMUX_BACKENDS")}
    return subprocess.run(
        [str(py), "-c", code], capture_output=True, text=True, cwd=cwd, env=env, check=False
    )


def test_shipped_library_loads_without_rpath(builds, tmp_path):
    """No rpath: libtvm_ffi.so is found because tvm_ffi (from its own package) loaded it first."""
    py = _venv(tmp_path / "venv", builds[0].wheel, "apache-tvm-ffi>=0.1.15,<0.2", "typing-extensions")
    code = (
        "from opmux.kernels.aot import load_library, library_path\n"
        "m = load_library('cpu'); assert m is not None, 'no library'\n"
        "print(library_path('cpu')); print(m['rmsnorm_cpu'])\n"
    )
    proc = _run(py, code, tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert str(tmp_path / "venv") in proc.stdout


def test_two_distributions_warn_at_import(builds, npu_wheel, tmp_path):
    py = _venv(tmp_path / "venv", builds[0].wheel, npu_wheel)
    proc = _run(py, "import opmux", tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (
        "InstallWarning: opmux: several opmux distributions are installed (opmux-cpu, opmux-npu)"
        in proc.stderr
    )
    assert "pip uninstall -y opmux-cpu opmux-npu && pip install opmux-cpu" in proc.stderr
    assert proc.stderr.count("several opmux distributions") == 1


def test_release_build_refuses_a_dev_version(builds, tmp_path):
    env = {**_env(), "OPMUX_RELEASE": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "build", "--sdist", "--outdir", str(tmp_path), str(builds[0].src)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "OPMUX_RELEASE=1 but this is not a releasable tree" in out
    assert f"version '{DEV_VERSION}' is a development version" in out
