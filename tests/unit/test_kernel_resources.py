"""tools/kernel_resources.py: ptxas's per-kernel report parsed and shown beside a base revision's."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))

import kernel_resources as kr  # noqa: E402

# ptxas -v as nvcc 13 prints it for sm_90a (sampling_cuda, trimmed): a device function's
# properties between entries, a line with a cumulative stack size before the shared memory, an
# entry without shared memory
PTXAS = """\
ptxas info    : 0 bytes gmem
ptxas info    : Function properties for _ZN5opmux6helperEv
    16 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Compiling entry function '_Z4maskv' for 'sm_90a'
ptxas info    : Function properties for _Z4maskv
    8 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 32 registers, used 1 barriers, 8 bytes cumulative stack size, 34816 bytes smem
ptxas info    : Compile time = 61.377 ms
ptxas info    : Compiling entry function '_Z6greedyv' for 'sm_90a'
ptxas info    : Function properties for _Z6greedyv
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 60 registers, used 1 barriers, 688 bytes smem
ptxas info    : Compiling entry function '_Z1kPf' for 'sm_90a'
ptxas info    : Function properties for _Z1kPf
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 8 registers, used 0 barriers
"""


def test_entries_are_parsed_with_their_frames_and_shared_memory() -> None:
    ks = kr.parse_ptxas(PTXAS)
    assert [k.name for k in ks] == ["_Z4maskv", "_Z6greedyv", "_Z1kPf"]  # the device function is no entry
    mask, greedy, plain = ks
    assert (mask.registers, mask.spill_stores, mask.spill_loads, mask.stack, mask.smem, mask.barriers) == (
        32,
        8,
        12,
        8,
        34816,
        1,
    )
    assert (greedy.registers, greedy.spill_stores, greedy.smem) == (60, 0, 688)
    assert (plain.registers, plain.smem, plain.barriers, plain.arch) == (8, 0, 0, "sm_90a")


def test_the_table_marks_changed_new_and_gone_kernels() -> None:
    tree = kr.parse_ptxas(PTXAS)
    base = kr.parse_ptxas(
        PTXAS.replace("Used 60 registers", "Used 64 registers").replace("_Z1kPf", "_Z3oldv")
    )
    names = {k.name: k.name for k in [*tree, *base]}
    rows = {line.split()[0]: line for line in kr.render(tree, base, names).splitlines()[1:]}
    assert rows["_Z4maskv"].rstrip().endswith("34816")  # unchanged: no mark
    assert rows["_Z6greedyv"].split()[1:3] == ["60", "64"] and rows["_Z6greedyv"].endswith("*")
    assert rows["_Z1kPf"].endswith("new") and rows["_Z3oldv"].endswith("gone")


def test_an_unknown_unit_names_the_valid_ones() -> None:
    with pytest.raises(SystemExit, match=r"valid: .*sampling_cuda"):
        kr.main(["no_such_unit"])


@pytest.mark.skipif(
    os.environ.get("OPMUX_TEST_NVCC") != "1", reason="set OPMUX_TEST_NVCC=1: nvcc builds a unit"
)
def test_a_unit_compiled_here_reports_every_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    assert kr.main(["rope_cuda", "--json"]) == 0
    record = json.loads(capsys.readouterr().out)
    assert record["unit"] == "rope_cuda.cu" and record["arch"] == "sm_90a"
    assert record["tree"] and all(k["registers"] > 0 for k in record["tree"])
    assert any("rope" in k["readable"] for k in record["tree"])
