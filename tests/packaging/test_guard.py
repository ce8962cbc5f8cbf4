"""python/opmux/_guard.py: the distribution map and the problems it reports."""

from __future__ import annotations

import pytest
from tools import targets

from opmux import _guard


def test_distributions_match_targets_toml():
    assert _guard.DISTRIBUTIONS == {t.name: t.distribution for t in targets.load().values()}


@pytest.mark.parametrize(
    ("target", "dists", "machine", "expected"),
    [
        ("cpu", ["opmux-cpu"], "cpu", []),
        ("cuda", ["opmux"], "cuda", []),
        ("cuda", ["opmux"], "cpu", []),  # the CUDA wheel ships the CPU library too
        ("cuda12", ["opmux-cu12"], "cuda", []),
        ("cuda12", ["opmux-cu12"], "cpu", []),
        ("cuda", ["opmux"], ["xpu"], []),  # an Intel iGPU does not make the CUDA wheel wrong
        ("cpu", ["opmux-cpu"], ["xpu"], []),
        ("xpu", ["opmux-xpu"], ["xpu"], []),  # an Intel GPU host: the right wheel never warns
        ("xpu", ["opmux-xpu"], ["cuda", "xpu"], []),
        ("rocm", ["opmux-rocm"], ["rocm"], []),
        ("npu", ["opmux-npu"], ["npu"], []),
        (
            "cpu",
            ["opmux-cpu"],
            "cuda",
            [
                "this is the cpu wheel (opmux-cpu) but this machine has a cuda device; for its kernels: "
                "pip uninstall -y opmux-cpu && pip install opmux"
            ],
        ),
        (
            "rocm",
            ["opmux-rocm"],
            "cpu",
            [
                "this is the rocm wheel (opmux-rocm) but this machine has no accelerator; for its "
                "kernels: pip uninstall -y opmux-rocm && pip install opmux-cpu"
            ],
        ),
        (
            "xpu",
            ["opmux-xpu"],
            [],
            ["this is the xpu wheel (opmux-xpu) but this machine has no accelerator"],
        ),
        (
            "cuda",
            ["opmux"],
            ["rocm"],
            [
                "this is the cuda wheel (opmux) but this machine has a rocm device; for its kernels: "
                "pip uninstall -y opmux && pip install opmux-rocm"
            ],
        ),
        (
            "cpu",
            ["opmux", "opmux-cpu"],
            "cpu",
            ["several opmux distributions are installed (opmux, opmux-cpu)"],
        ),
        (
            "npu",
            ["opmux-cpu", "opmux-npu"],
            "cuda",
            ["several opmux distributions are installed"],
        ),
    ],
)
def test_problems(target, dists, machine, expected):
    found = _guard.problems(target, dists, machine)
    assert len(found) == len(expected), found
    for have, want in zip(found, expected, strict=True):
        assert have.startswith(want)


@pytest.mark.parametrize(
    ("dists", "machine", "command"),
    [
        (["opmux", "opmux-cpu"], [], "pip uninstall -y opmux opmux-cpu && pip install opmux-cpu"),
        # a CPU host with opmux and opmux-xpu: one consistent command, not "keep one" + both listed
        (["opmux", "opmux-xpu"], [], "pip uninstall -y opmux opmux-xpu && pip install opmux-cpu"),
        (["opmux", "opmux-xpu"], ["xpu"], "pip uninstall -y opmux opmux-xpu && pip install opmux-xpu"),
        (["opmux-cpu", "opmux-npu"], ["cuda"], "pip uninstall -y opmux-cpu opmux-npu && pip install opmux"),
    ],
)
def test_two_wheels_advice_uninstalls_all_and_reinstalls_one(dists, machine, command):
    """The wheels share files: uninstalling one of two breaks the other, so the advice removes
    every one and reinstalls the machine's (following it leaves a working install)."""
    (msg,) = _guard.problems(dists[-1], dists, machine)
    assert msg.endswith(command)
    assert "Keep one" not in msg


def _fake_machine(nodes=(), drm=None):
    drm = drm or {}
    return {
        "exists": lambda p: p in nodes,
        "read": lambda p: drm.get(p),
        "listdir": lambda p: sorted({k.split("/")[4] for k in drm}) if p == "/sys/class/drm" else [],
    }


@pytest.mark.parametrize(
    ("nodes", "drm", "expected"),
    [
        ((), {}, []),
        (("/dev/kfd",), {}, ["rocm"]),
        (("/dev/kfd", "/dev/nvidiactl"), {}, ["cuda", "rocm"]),
        (("/dev/nvidia0",), {}, ["cuda"]),
        (("/dev/davinci0",), {}, ["npu"]),
        ((), {"/sys/class/drm/renderD128/device/vendor": "0x8086"}, ["xpu"]),
        ((), {"/sys/class/drm/renderD128/device/vendor": "0x1002"}, []),  # AMD render node: not xpu
        (
            ("/dev/nvidiactl",),
            {
                "/sys/class/drm/renderD128/device/vendor": "0x10de",
                "/sys/class/drm/renderD129/device/vendor": "0x8086",
            },
            ["cuda", "xpu"],
        ),
    ],
)
def test_machine_targets(nodes, drm, expected):
    assert _guard.machine_targets(**_fake_machine(nodes, drm)) == expected


def test_machine_target_precedence():
    assert _guard.machine_target(lambda p: False) == "cpu"
    assert _guard.machine_target(lambda p: p == "/dev/kfd") == "rocm"
    assert _guard.machine_target(lambda p: p in ("/dev/kfd", "/dev/nvidiactl")) == "cuda"


def test_source_tree_never_warns(recwarn):
    _guard.check("source")
    assert not recwarn.list


def test_installed_scans_dist_info_folders(tmp_path):
    """installed() finds what importlib.metadata would: <name>-<version>.dist-info (or
    .egg-info) folders on the path entries, names compared normalized, in DISTRIBUTIONS order."""
    a, b = tmp_path / "a", tmp_path / "b"
    for folder in (
        a / "opmux_cpu-0.1.0.dist-info",
        a / "opmux-0.1.0.dist-info",
        a / "opmux_kernels_extra-1.0.dist-info",  # another project whose name starts alike
        a / "opmux",  # the package itself
        b / "Opmux_CU12-0.1.0.dist-info",
        b / "opmux_cpu-0.1.0.dist-info",  # the same distribution again
    ):
        folder.mkdir(parents=True)
    (b / "opmux_rocm-0.1.0.dist-info").write_text("not a folder")
    paths = [str(a), str(b), str(tmp_path / "missing"), str(a / "opmux_cpu-0.1.0.dist-info" / "x.zip")]
    assert _guard.installed(paths) == ["opmux", "opmux-cu12", "opmux-cpu"]
    assert _guard.installed([str(tmp_path / "missing")]) == []


def test_installed_agrees_with_importlib_metadata():
    from importlib import metadata

    found = []
    for name in _guard.DISTRIBUTIONS.values():
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue
        found.append(name)
    assert _guard.installed() == found
