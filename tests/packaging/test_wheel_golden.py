"""tools/wheel_check.py: golden file lists catch a missing header, a stray file and a narrowed glob."""

from __future__ import annotations

import shutil
import zipfile
from pathlib import Path

import pytest
from tools import targets, wheel_check

HEADER = "opmux/kernels/jit/include/opmux/cuda_utils.cuh"


@pytest.fixture(autouse=True)
def _placeholder_libraries(monkeypatch: pytest.MonkeyPatch) -> None:
    """Synthetic wheels carry placeholder .so files, not fatbins: the device-code check is
    tested on a real nvcc build in test_fatbin.py, so it is off here."""
    monkeypatch.setattr(wheel_check, "_check_device_code", lambda *a, **k: [])


def _synthetic_wheel(root: Path, tmp_path: Path, target: targets.Target, *, drop=(), add=()) -> Path:
    """A wheel with exactly the golden content of ``target`` (minus ``drop``, plus ``add``)."""
    dist, version = target.distribution.replace("-", "_"), "1.2.3"
    has_so = bool(target.aot.libraries)
    wheel = tmp_path / f"{dist}-{version}-py3-none-{'linux_x86_64' if has_so else 'any'}.whl"
    info = {
        "target": target.name,
        "distribution": target.distribution,
        "version": version,
        "archs": list(target.aot.archs) if [x for x in target.aot.libraries if x != "cpu"] else [],
        "aot": list(target.aot.filenames),
        "aot_missing": {},
        "cuda": {"toolkit": target.aot.toolkit, "driver": target.driver, "older": []}
        if "cuda" in target.aot.libraries
        else None,
    }
    info["bridges"] = {
        f"torch_bridge_torch{v.replace('.', '_').replace('+', '_')}_x.so": {
            "requested": v,
            "torch": v,
            "python": "cpython-312",
        }
        for v in target.bridge_torch
    }
    di = f"{dist}-{version}.dist-info"
    files = {f: b"" for f in wheel_check.expected_package_files(root)}
    files.update({f"opmux/kernels/aot/{n}": b"\x7fELF" for n in target.aot.filenames})
    files.update({f"{wheel_check.BRIDGES}/{n}": b"\x7fELF" for n in info["bridges"]})
    files["opmux/_build_info.py"] = f"BUILD_INFO = {info!r}\n".encode()
    requires = "".join(f"Requires-Dist: {r}\n" for r in target.requirements)
    files[f"{di}/METADATA"] = (
        f"Metadata-Version: 2.4\nName: {target.distribution}\nVersion: {version}\n"
        f"Requires-Python: >=3.10\n{requires}"
    ).encode()
    files[f"{di}/WHEEL"] = f"Wheel-Version: 1.0\nRoot-Is-Purelib: {str(not has_so).lower()}\n".encode()
    files[f"{di}/RECORD"] = b""
    files[f"{di}/top_level.txt"] = b"opmux\n"
    for f in drop:
        del files[f]
    files.update(dict.fromkeys(add, b""))
    with zipfile.ZipFile(wheel, "w") as zf:
        for name, data in sorted(files.items()):
            zf.writestr(name, data)
    return wheel


@pytest.fixture(params=["cpu", "cuda", "npu"])
def target(request) -> targets.Target:
    return targets.load()[request.param]


def test_golden_list_covers_the_kernel_sources(root):
    files = wheel_check.expected_package_files(root)
    jit = root / "python" / "opmux" / "kernels" / "jit"
    on_disk = {
        "opmux/" + p.relative_to(root / "python" / "opmux").as_posix()
        for d in ("csrc", "include")
        for p in (jit / d).rglob("*")
        if p.is_file()
    }
    assert on_disk, "the tree has no kernel sources"
    assert on_disk <= files
    assert {"opmux/__init__.py", "opmux/py.typed", "opmux/_version.py", "opmux/_build_info.py"} <= files
    assert not [f for f in files if "__pycache__" in f or f.endswith(".pyc")]


def test_golden_wheel_passes(root, tmp_path, target):
    assert wheel_check.check_wheel(_synthetic_wheel(root, tmp_path, target), root, target) == []


def test_missing_header_is_named(root, tmp_path, target):
    assert HEADER in wheel_check.expected_package_files(root)
    wheel = _synthetic_wheel(root, tmp_path, target, drop=[HEADER])
    assert wheel_check.check_wheel(wheel, root, target) == [f"{wheel.name}: missing {HEADER}"]


def test_missing_aot_library_is_named(root, tmp_path):
    cpu = targets.load()["cpu"]
    wheel = _synthetic_wheel(root, tmp_path, cpu, drop=["opmux/kernels/aot/libopmux_aot_cpu.so"])
    problems = wheel_check.check_wheel(wheel, root, cpu)
    assert f"{wheel.name}: missing opmux/kernels/aot/libopmux_aot_cpu.so" in problems


def _with_build_info(wheel: Path, tmp_path: Path, edit) -> Path:
    """A copy of ``wheel`` whose _build_info.py is ``edit(info)``."""
    out = tmp_path / "edited" / wheel.name
    out.parent.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as zin, zipfile.ZipFile(out, "w") as zout:
        for name in zin.namelist():
            data = zin.read(name)
            if name == "opmux/_build_info.py":
                info = wheel_check.read_build_info(data.decode())
                edit(info)
                data = f"BUILD_INFO = {info!r}\n".encode()
            zout.writestr(name, data)
    return out


def test_shipped_bridges_are_golden(root, tmp_path):
    cpu = targets.load()["cpu"]
    wheel = _synthetic_wheel(root, tmp_path, cpu)
    bridge = f"{wheel_check.BRIDGES}/torch_bridge_torch2_13_0_cpu_x.so"
    assert wheel_check.check_wheel(wheel, root, cpu) == []
    # a bridge file the build info does not name is a stray; one it names must be there
    (tmp_path / "stray").mkdir()
    (tmp_path / "gone").mkdir()
    stray = _synthetic_wheel(
        root, tmp_path / "stray", cpu, add=[f"{wheel_check.BRIDGES}/torch_bridge_other.so"]
    )
    assert f"{stray.name}: unexpected file {wheel_check.BRIDGES}/torch_bridge_other.so" in (
        wheel_check.check_wheel(stray, root, cpu)
    )
    gone = _synthetic_wheel(root, tmp_path / "gone", cpu, drop=[bridge])
    assert wheel_check.check_wheel(gone, root, cpu) == [f"{gone.name}: missing {bridge}"]


def test_a_torch_release_without_its_bridge_is_named(root, tmp_path):
    cpu = targets.load()["cpu"]
    wheel = _synthetic_wheel(
        root, tmp_path, cpu, drop=[f"{wheel_check.BRIDGES}/torch_bridge_torch2_14_1_x.so"]
    )

    def failed(info: dict) -> None:
        del info["bridges"]["torch_bridge_torch2_14_1_x.so"]
        info["bridges_missing"] = {"2.14.1": {"why": "compile", "message": "error: no member named X"}}

    problems = wheel_check.check_wheel(_with_build_info(wheel, tmp_path, failed), root, cpu)
    assert problems == [
        f"{wheel.name}: no torch bridge for torch 2.14.1 (targets.toml bridge_torch): error: no member named X"
    ]

    def unfetchable(info: dict) -> None:  # a build machine that cannot reach torch's wheel
        failed(info)
        info["bridges_missing"]["2.14.1"]["why"] = "torch"

    assert wheel_check.check_wheel(_with_build_info(wheel, tmp_path / "t", unfetchable), root, cpu) == []


def test_stray_files_are_named(root, tmp_path, target):
    stray = ["opmux/kernels/__pycache__/spec.cpython-311.pyc", "tests/test_x.py", "opmux/.git/HEAD"]
    wheel = _synthetic_wheel(root, tmp_path, target, add=stray)
    problems = wheel_check.check_wheel(wheel, root, target)
    for f in stray:
        assert f"{wheel.name}: unexpected file {f} (stray: cache/VCS/test file)" in problems


def test_size_budget(root, tmp_path):
    npu = targets.load()["npu"]
    wheel = _synthetic_wheel(root, tmp_path, npu)
    import dataclasses

    tiny = dataclasses.replace(npu, wheel_size_mb=1e-6)
    assert any("exceeds the 1e-06 MB budget" in p for p in wheel_check.check_wheel(wheel, root, tiny))


def test_build_info_must_match_target(root, tmp_path):
    table = targets.load()
    wheel = _synthetic_wheel(root, tmp_path, table["cpu"])
    renamed = tmp_path / wheel.name.replace("opmux_cpu", "opmux_npu")
    wheel.rename(renamed)
    problems = wheel_check.check_wheel(renamed, root, table["npu"])
    assert any("_build_info.py target = 'cpu', expected 'npu'" in p for p in problems)
    assert any("unexpected file opmux/kernels/aot/libopmux_aot_cpu.so" in p for p in problems)


def test_every_pyproject_globs_match_the_tree(root):
    for t in targets.load().values():
        assert wheel_check.check_package_data(root / t.pyproject, root) == []


def _tree_copy(root: Path, tmp_path: Path) -> Path:
    tree = tmp_path / "tree"
    shutil.copytree(root / "python", tree / "python", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy2(root / "pyproject_cpu.toml", tree / "pyproject_cpu.toml")
    return tree


def test_narrowed_glob_fails_naming_the_file(root, tmp_path):
    tree = _tree_copy(root, tmp_path)
    pyproject = tree / "pyproject_cpu.toml"
    text = pyproject.read_text()
    assert '"kernels/jit/include/**/*"' in text
    pyproject.write_text(text.replace('"kernels/jit/include/**/*"', '"kernels/jit/include/**/*.h"'))
    problems = wheel_check.check_package_data(pyproject, tree)
    assert problems, "a glob that skips .cuh headers must fail"
    assert all(
        "python/opmux/kernels/jit/include/" in p and p.endswith("(use globs like 'kernels/jit/include/**/*')")
        for p in problems
    )
    assert any("python/opmux/kernels/jit/include/opmux/cuda_utils.cuh" in p for p in problems)


def test_new_kernel_file_in_a_subdirectory_is_required_and_matched(root, tmp_path):
    tree = _tree_copy(root, tmp_path)
    new = tree / "python/opmux/kernels/jit/csrc/sub/extra_kernel.inc"
    new.parent.mkdir(parents=True)
    new.write_text("// new\n")
    assert "opmux/kernels/jit/csrc/sub/extra_kernel.inc" in wheel_check.required_data_files(tree)
    assert wheel_check.check_package_data(tree / "pyproject_cpu.toml", tree) == []
    narrowed = tree / "pyproject_cpu.toml"
    narrowed.write_text(narrowed.read_text().replace('"kernels/jit/csrc/**/*"', '"kernels/jit/csrc/*"'))
    problems = wheel_check.check_package_data(narrowed, tree)
    assert len(problems) == 1 and "python/opmux/kernels/jit/csrc/sub/extra_kernel.inc" in problems[0]


def test_a_tuned_table_of_any_op_is_required_and_matched(root, tmp_path):
    """A table in a new file (an op's folder made for it, as a first table's is): the golden list
    requires it and every target's package-data globs bundle it."""
    tree = _tree_copy(root, tmp_path)
    for t in targets.load().values():
        shutil.copy2(root / t.pyproject, tree / t.pyproject)
    table = tree / "python/opmux/kernels/configs/opmux.test_op/DV=128,G=4,device_name=NVIDIA_H200.json"
    assert not table.parent.exists()
    table.parent.mkdir(parents=True)
    table.write_text('{"1": {"BLOCK_N": 32, "num_warps": 4, "num_stages": 3, "PREFETCH": 1, "WAVES": 4}}\n')
    assert table.relative_to(tree / "python").as_posix() in wheel_check.required_data_files(tree)
    for t in targets.load().values():
        assert wheel_check.check_package_data(tree / t.pyproject, tree) == [], t.pyproject
