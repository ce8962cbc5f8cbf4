"""tools/targets.py: the target table loads, and malformed tables fail with clear errors."""

from __future__ import annotations

import re

import pytest
from tools import targets

GOOD = (targets.TABLE).read_text(encoding="utf-8")


def test_repo_table_is_valid():
    table = targets.load()
    assert next(iter(table)) == "cuda" and table["cuda"].default
    assert {t.distribution for t in table.values()} == {
        "opmux",
        "opmux-cu12",
        "opmux-cpu",
        "opmux-rocm",
        "opmux-xpu",
        "opmux-npu",
    }
    assert table["cuda"].aot.filenames == ("libopmux_aot_cpu.so", "libopmux_aot_cuda.so")
    assert table["cpu"].aot.filenames == ("libopmux_aot_cpu.so",)
    assert table["cuda"].aot.compiler_for("cpu") == "cxx"
    assert "sm_90a" in table["cuda"].aot.archs
    assert (table["cuda"].cuda_major, table["cuda12"].cuda_major, table["cpu"].cuda_major) == (13, 12, None)
    assert table["cuda"].image("aarch64") == "quay.io/pypa/manylinux_2_28_aarch64"
    # the newest two torch releases, in the builds each target's users install
    assert (table["cuda"].bridge_torch, table["cpu"].bridge_torch) == (
        ("2.14.1", "2.13.0"),
        ("2.14.1", "2.13.0+cpu"),
    )
    assert all(not t.bridge_torch for t in table.values() if "cpu" not in t.aot.libraries)


def test_unknown_key_is_rejected():
    text = GOOD.replace("[targets.cpu]\n", "[targets.cpu]\nwheel_size = 3\n")
    with pytest.raises(
        targets.TargetTableError, match=r"\[targets\.cpu\]: unknown key\(s\) \['wheel_size'\]"
    ):
        targets.loads(text)


def test_unknown_aot_key_is_rejected():
    text = GOOD.replace('toolkit = "13.0" }', 'toolkit = "13.0", cubin = true }')
    with pytest.raises(
        targets.TargetTableError, match=r"\[targets\.cuda\]\.aot: unknown key\(s\) \['cubin'\]"
    ):
        targets.loads(text)


def test_missing_field_is_rejected():
    head, tail = GOOD.split("[targets.xpu]\n")
    text = head + "[targets.xpu]\n" + tail.replace("wheel_size_mb = 2\n", "", 1)
    with pytest.raises(
        targets.TargetTableError, match=r"\[targets\.xpu\]: missing field\(s\) \['wheel_size_mb'\]"
    ):
        targets.loads(text)


def test_duplicate_target_name_is_rejected():
    block = GOOD[GOOD.index("[targets.npu]") :]
    with pytest.raises(targets.TargetTableError, match=r"not valid TOML \(is a target declared twice\?\)"):
        targets.loads(GOOD + "\n" + block)


def test_duplicate_distribution_is_rejected():
    text = GOOD.replace('distribution = "opmux-npu"', 'distribution = "opmux-xpu"')
    with pytest.raises(
        targets.TargetTableError, match=r"duplicate distribution 'opmux-xpu' in targets 'xpu' and 'npu'"
    ):
        targets.loads(text)


@pytest.mark.parametrize(
    ("old", "new", "message"),
    [
        ('compiler = "cxx"', 'compiler = "msvc"', r"compiler = 'msvc' is not one of"),
        ('triton = "interpreter"', 'triton = "maybe"', r"triton = 'maybe' is not one of"),
        ('"sm_90a",', '"hopper",', r"arch 'hopper' is not like"),
        ('default = "cuda"', 'default = "tpu"', r"default = 'tpu' is not a target"),
        ('toolkit = "13.0"', 'toolkit = ""', r"an nvcc target names its CUDA release"),
        ('driver = "580"', 'driver = "R580"', r"an nvcc target names its driver branch"),
        ('machines = ["x86_64", "aarch64"]', 'machines = ["riscv64"]', r"must be a non-empty subset of"),
        ("wheel_size_mb = 5\n", 'wheel_size_mb = "5"\n', r"wheel_size_mb = '5' must be of type int/float"),
        (
            'bridge_torch = ["2.14.1", "2.13.0+cpu"]',
            'bridge_torch = ["2.14"]',
            r"distinct torch versions like",
        ),
        (
            'bridge_torch = ["2.14.1", "2.13.0+cpu"]',
            'bridge_torch = ["2.13.0+cpu", "2.13.0+cpu"]',
            r"distinct torch versions like",
        ),
        (
            'bridge_torch = []\njit = "none"\ntriton = "yes"\nvendor_backends = ["aiter"]',
            'bridge_torch = ["2.14.1"]\njit = "none"\ntriton = "yes"\nvendor_backends = ["aiter"]',
            r"\[targets\.rocm\]: bridge_torch needs the C\+\+ compiler",
        ),
        (
            'pyproject = "pyproject_cpu.toml"',
            'pyproject = "cpu.toml"',
            r"pyproject must be 'pyproject_cpu.toml'",
        ),
    ],
)
def test_bad_values_are_rejected(old, new, message):
    assert old in GOOD
    with pytest.raises(targets.TargetTableError, match=message):
        targets.loads(GOOD.replace(old, new, 1))


def test_error_names_the_file(tmp_path):
    bad = tmp_path / "targets.toml"
    bad.write_text(GOOD.replace("[targets.cpu]\n", "[targets.cpu]\nfoo = 1\n"))
    with pytest.raises(targets.TargetTableError, match=re.escape(str(bad))):
        targets.load(bad)


def test_each_target_tests_a_torch_it_ships_a_bridge_for():
    """The release tests (cibuildwheel's and the rehearsal's) install, per target, a torch build the
    wheel ships a bridge for, exactly as listed (a +cpu build is not PyPI's), and demand that bridge."""
    import tomllib

    for t in targets.load().values():
        cibw = tomllib.loads((targets.ROOT / t.pyproject).read_text(encoding="utf-8"))["tool"]["cibuildwheel"]
        assert cibw["test-requires"] == [t.test_torch]
        if t.bridge_torch:
            assert t.test_torch == f"torch==={t.bridge_torch[-1]}" and t.require_bridge
            assert cibw["test-command"].endswith("bridge_check.py --require")
        else:
            assert t.test_torch == targets.TEST_TORCH and "--require" not in cibw["test-command"]
    assert targets.load()["cpu"].test_torch == "torch===2.13.0+cpu"  # never PyPI's CUDA 2.13.0
    assert targets.load()["cuda"].test_torch == "torch===2.13.0"  # never PyTorch's +cpu build
