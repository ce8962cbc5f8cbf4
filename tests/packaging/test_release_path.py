"""The release path: each fault the rehearsal must catch, caught, with a message naming it.

The whole rehearsal runs in `nox -s release-rehearsal` (and, for the cpu target, in .ci/run);
these tests break one release step at a time, fast enough for `nox -s tests`.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import io
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
import yaml
from tools import cibw, release, release_check, targets, wheel_check

TABLE = targets.load()
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="needs git")


def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(cwd), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    ).stdout


# --- release.py: an unpacked sdist inside a dirty git workspace (release.yml, cibuildwheel) ---


@needs_git
def test_unpacked_sdist_inside_a_workspace_is_judged_by_its_version(tmp_path):
    _git(tmp_path, "init", "-q")
    (tmp_path / "tracked.txt").write_text("x")
    _git(tmp_path, "add", "tracked.txt")
    _git(tmp_path, "commit", "-q", "-m", "x")
    src = tmp_path / "build-src" / "opmux-1.2.3"  # untracked: the workspace is dirty and untagged
    src.mkdir(parents=True)
    (src / "PKG-INFO").write_text("Metadata-Version: 2.4\nName: opmux\nVersion: 1.2.3\n")
    assert release.git_problems(tmp_path)  # the workspace itself is not releasable
    assert release.check(src, "1.2.3") == []  # but the sdist inside it is
    assert "development version" in release.check(src, "1.2.4.dev1")[0]
    plain = tmp_path / "staged"  # no PKG-INFO, not the repository root: not judged by git either
    plain.mkdir()
    assert release.git_problems(plain) is None


# --- targets.toml: every promised library is one the build can make ---


def test_every_promised_aot_library_is_buildable(root):
    sys.path.insert(0, str(root / "python"))
    from opmux.kernels.jit.compile import build  # torch-free

    setup_text = (root / "setup.py").read_text(encoding="utf-8")
    for t in TABLE.values():
        for lib in t.aot.libraries:
            assert lib in targets.DEVICES, f"{t.name}: no AOT build for {lib}"
            assert f'"{lib}": "csrc/' in setup_text, f"setup.py has no AOT source for {lib}"
            archs = list(t.aot.archs) if lib != "cpu" else []
            build.compile_flags(lib, archs=archs, ptx_arch=(t.aot.ptx or None) if lib != "cpu" else None)
        if t.aot.compiler == "nvcc":
            assert t.aot.toolkit and t.driver, f"{t.name}: an nvcc target names its CUDA release and driver"
    assert "hipcc" not in {t.aot.compiler for t in TABLE.values()}, "no HIP build path exists yet"


def test_cuda_builds_are_two_rows_told_apart_by_name(root):
    cuda = {t.name: t for t in TABLE.values() if t.aot.compiler == "nvcc"}
    assert {t.cuda_major for t in cuda.values()} == {12, 13}
    assert len({t.distribution for t in cuda.values()}) == len(cuda)
    for t in cuda.values():  # the toolkit is pinned: from PyPI, or (cu12) the build image only
        pins = [r for r in t.build_requires if r.startswith("nvidia-cuda-nvcc")]
        if t.cuda_major == 13:
            assert pins == [f"nvidia-cuda-nvcc=={t.aot.toolkit}.*"]
        requires = wheel_check.tomllib.loads((root / t.pyproject).read_text())["build-system"]["requires"]
        assert set(t.build_requires) <= set(requires)


# --- cibuildwheel's table: what release.yml runs and the rehearsal reads ---


@pytest.mark.parametrize("name", list(TABLE))
def test_cibuildwheel_table_tests_and_repairs_every_wheel(root, name):
    cfg = cibw.load(root / TABLE[name].pyproject)
    assert cfg.build_frontend == "build"
    assert "import_smoke.py" in cfg.test_command and "find_spec_check.py" in cfg.test_command
    assert "bridge_check.py" in cfg.test_command
    assert cfg.test_requires, "the test venv needs torch"
    repair = cfg.repair("W.whl", "D")
    assert repair[:2] == ["auditwheel", "repair"]
    # one OpenMP runtime in the process (torch's): torch.set_num_threads sizes the CPU kernels
    assert "libgomp.so.1" in repair[repair.index("--exclude", 0) :], "libgomp must not be grafted"
    assert cfg.build_env({"PATH": "/bin"})["OPMUX_REQUIRE_AOT"] == "1"
    data = wheel_check.tomllib.loads((root / TABLE[name].pyproject).read_text())["tool"]["cibuildwheel"]
    assert data.get("test-skip") in (None, ""), "every wheel is installed and tested before publishing"
    known = {"build", "build-frontend", "environment-pass", "test-requires", "test-command", "linux"}
    assert set(data) <= known, f"cibuildwheel keys the rehearsal does not run: {set(data) - known}"
    linux = {"manylinux-x86_64-image", "manylinux-aarch64-image", "environment", "repair-wheel-command"}
    assert set(data["linux"]) <= linux, f"linux keys the rehearsal does not run: {set(data['linux']) - linux}"


# --- release.yml contains no step the rehearsal does not run ---

#: every command release.yml may run, and the rehearsal function that runs the same thing
RUN_COMMANDS = {
    "nox -s sdist": "build_sdist",
    "python tools/ci_matrix.py --release": None,  # planning the matrix, not a build or a check
    "python tools/from_sdist.py": "build_wheel",
    "python -m build --wheel": "build_wheel",
    "python tools/wheel_test.py": "_wheel_test.test_wheel",
    "nox -s release-check": "_release_check.check",
    "python -m pip install": None,
    "echo": None,
    "mkdir dist": None,
    "cp artifacts": None,
    "ls -l dist": None,
}
USES = {
    "actions/checkout",
    "actions/setup-python",
    "actions/upload-artifact",
    "actions/download-artifact",
    "actions/attest-build-provenance",
    "pypa/gh-action-pypi-publish",  # twine upload: the rehearsal uploads with twine
    "pypa/cibuildwheel",  # [tool.cibuildwheel]: checked above, run by rehearsal.build_wheel
}


def _commands(script: str) -> list[str]:
    out = []
    for line in script.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            if "$(" in line:  # src="$(python tools/from_sdist.py ...)"
                line = line.split("$(", 1)[1]
            out.append(line)
    return out


def test_release_workflow_runs_nothing_the_rehearsal_does_not(root):
    workflow = yaml.safe_load((root / ".github" / "workflows" / "release.yml").read_text(encoding="utf-8"))
    rehearsal = (root / "tools" / "rehearsal.py").read_text(encoding="utf-8")
    seen = set()
    for job, spec in workflow["jobs"].items():
        for step in spec.get("steps", []):
            if "uses" in step:
                action = step["uses"].split("@")[0]
                assert action in USES, (
                    f"release.yml job {job} uses {action}, which the rehearsal does not run"
                )
                continue
            for cmd in _commands(step["run"]):
                hit = [k for k in RUN_COMMANDS if cmd.startswith(k)]
                assert hit, f"release.yml job {job} runs `{cmd}`, which the rehearsal does not run"
                seen.add(hit[0])
                fn = RUN_COMMANDS[hit[0]]
                if fn is not None:
                    assert fn in rehearsal, f"the rehearsal does not call {fn} for `{cmd}`"
    assert {"nox -s sdist", "nox -s release-check", "python tools/from_sdist.py"} <= seen
    assert workflow["env"]["OPMUX_RELEASE"] == "1" and workflow["env"]["OPMUX_REQUIRE_AOT"] == "1"
    assert '"OPMUX_RELEASE": "1", "OPMUX_REQUIRE_AOT": "1"' in rehearsal


# --- a header left out of a package-data glob ---


def test_a_header_missing_from_the_globs_is_named(root, tmp_path):
    text = (root / "pyproject_cpu.toml").read_text(encoding="utf-8")
    broken = text.replace('"kernels/jit/include/**/*"', '"kernels/jit/include/*.h"')
    assert broken != text
    (tmp_path / "pyproject_cpu.toml").write_text(broken, encoding="utf-8")
    problems = wheel_check.check_package_data(tmp_path / "pyproject_cpu.toml", root)
    assert problems and all("kernels/jit/include/opmux/" in p for p in problems)
    assert "the wheel would lack it" in problems[0]


def _wheel(path: Path, dist: str, version: str, files: dict[str, bytes]) -> Path:
    """A minimal valid wheel (for the index tests: twine parses its metadata)."""
    name = f"{dist.replace('-', '_')}-{version}"
    info = f"{name}.dist-info"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for n, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{n},sha256={digest},{len(data)}")
    record.append(f"{info}/RECORD,,")
    files[f"{info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = path / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for n, data in files.items():
            zf.writestr(n, data)
    return wheel


def test_release_check_refuses_a_wheel_without_a_header(root, tmp_path):
    wheel = _wheel(tmp_path, "opmux-xpu", "1.0.0", {"opmux/__init__.py": b""})
    problems = release_check.check([wheel], root)
    assert any("missing opmux/kernels/jit/include/opmux/" in p for p in problems)
    assert release_check.main(["--root", str(root), str(wheel)]) == 1


# --- the local index: upload auth, a duplicate upload refused ---


@pytest.mark.slow
def test_the_index_refuses_a_second_upload_and_a_wrong_password(tmp_path):
    # find_spec, not importorskip: importing pypiserver in-process installs its bundled bottle's
    # legacy sys.meta_path hook (no find_spec), which breaks later imports in the same session
    if importlib.util.find_spec("pypiserver") is None:
        pytest.skip("nox -s tests installs pypiserver[passlib]")
    from tools import package_index

    wheel = _wheel(tmp_path, "opmux-dummy", "1.0.0", {"opmux_dummy/__init__.py": b""})
    with package_index.LocalIndex(tmp_path / "index") as index:
        package_index.upload(index, [wheel])
        assert index.names() == [wheel.name]
        with pytest.raises(package_index.UploadRefused, match=r"opmux_dummy-1\.0\.0.*400|refused the upload"):
            package_index.upload(index, [wheel])
        other = _wheel(tmp_path, "opmux-dummy", "1.0.1", {"opmux_dummy/__init__.py": b""})
        index.password = "wrong"
        with pytest.raises(package_index.UploadRefused, match="403"):
            package_index.upload(index, [other])
        assert index.names() == [wheel.name]


# --- a dirty tree: the release's sdist step refuses it ---


@needs_git
@pytest.mark.slow
def test_the_rehearsal_sdist_step_refuses_a_dirty_tree(root, tmp_path):
    from tools import rehearsal

    work = tmp_path / "ws"
    rehearsal.clone(root, work, "9.9.9")
    (work / "stray.txt").write_text("not committed")
    with pytest.raises(rehearsal.RehearsalError, match=r"sdist failed") as info:
        rehearsal.build_sdist(work, sys.executable)
    assert "the git tree is dirty" in str(info.value) and "stray.txt" in str(info.value)


def test_sdist_records_commit_and_epoch(root):
    setup_text = (root / "setup.py").read_text(encoding="utf-8")
    assert "make_release_tree" in setup_text and "BUILD_SOURCE.json" in setup_text


@needs_git
@pytest.mark.slow
def test_wheels_from_the_sdist_carry_its_commit_without_any_environment(root, tmp_path):
    """Build the sdist from a tagged clone, then read BUILD_SOURCE.json out of it."""
    from tools import rehearsal

    work = tmp_path / "ws"
    commit = rehearsal.clone(root, work, "9.9.8")
    sdist = rehearsal.build_sdist(work, sys.executable)
    with tarfile.open(sdist) as tf:
        member = next(m for m in tf.getmembers() if m.name.endswith("/BUILD_SOURCE.json"))
        facts = io.TextIOWrapper(tf.extractfile(member)).read()  # type: ignore[arg-type]
    assert commit in facts and "source_date_epoch" in facts


def test_each_target_builds_from_a_fresh_tree(root, tmp_path):
    """A setuptools build/ left by one target's build must never reach another target's wheel."""
    from tools import from_sdist

    sdist = tmp_path / "opmux-1.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as tf:
        for name in ["targets.toml", *(t.pyproject for t in TABLE.values())]:
            tf.add(root / name, arcname=f"opmux-1.0/{name}")
    cuda = from_sdist.prepare(sdist, "cuda", tmp_path / "build-src")
    (cuda / "build" / "lib").mkdir(parents=True)
    (cuda / "build" / "lib" / "libopmux_aot_cuda.so").write_bytes(b"stale")
    cpu = from_sdist.prepare(sdist, "cpu", tmp_path / "build-src")
    assert cpu != cuda and not (cpu / "build").exists()
    assert 'target = "cpu"' in (cpu / "pyproject.toml").read_text()
    again = from_sdist.prepare(sdist, "cuda", tmp_path / "build-src")
    assert again == cuda and not (again / "build").exists()
