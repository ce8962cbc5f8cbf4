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
        (
            "cpu",
            ["opmux-cpu"],
            "cuda",
            ["this is the cpu wheel (opmux-cpu) but the machine looks like a cuda"],
        ),
        (
            "rocm",
            ["opmux-rocm"],
            "cpu",
            ["this is the rocm wheel (opmux-rocm) but the machine looks like a cpu"],
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
            ["several opmux distributions are installed", "this is the npu wheel (opmux-npu)"],
        ),
    ],
)
def test_problems(target, dists, machine, expected):
    found = _guard.problems(target, dists, machine)
    assert len(found) == len(expected)
    for have, want in zip(found, expected, strict=True):
        assert have.startswith(want)


def test_uninstall_advice_keeps_the_machines_distribution():
    (msg,) = _guard.problems("cpu", ["opmux", "opmux-cpu"], "cpu")
    assert msg.endswith("Keep one: pip uninstall opmux")


def test_machine_target_precedence():
    assert _guard.machine_target(lambda p: False) == "cpu"
    assert _guard.machine_target(lambda p: p == "/dev/kfd") == "rocm"
    assert _guard.machine_target(lambda p: p in ("/dev/kfd", "/dev/nvidiactl")) == "cuda"


def test_source_tree_never_warns(recwarn):
    _guard.check("source")
    assert not recwarn.list
