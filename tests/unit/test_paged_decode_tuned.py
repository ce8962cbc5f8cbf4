"""attention.paged_decode's Triton launch from tuned tables: without a table every shape launches
as before the tables (the tile and split rule, copied below as they were, are the oracle); a table
in the user dir picks the tile and the wave target of the forms the sweep timed only, gives the
reference's result in the interpreter, and yields to explicit arguments; a bad entry is named and
skipped; the schema's checks, default and M."""

from __future__ import annotations

import itertools
import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from opmux.kernels import tuned
from opmux.kernels.ops.attention import _decode
from opmux.kernels.ops.attention import op as decls

tk = pytest.importorskip("opmux.kernels.ops.attention.triton_kernels")

OP = "attention.paged_decode"
SMS = 132  # the interpreter's SM count (an H200's)
CPU = torch.device("cpu")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _pow2(n: int) -> int:
    return 1 << max(n - 1, 0).bit_length()


def _before_tables(
    bsz: int, hkv: int, g: int, capacity: int, d: int, dv: int, dtype: torch.dtype, fp8: bool
) -> tuple[tuple[int, int, int, bool], int, int]:
    """(tile, splits, BLOCK_G) as the launch chooses them without a table (its rule spelled out
    again: one round of four programs an SM for the plain 16-bit tile, two otherwise, rounded down)."""
    block_dv = max(16, _pow2(dv))
    block_g = 1 if g <= 1 else max(16, min(_pow2(g), 16 * 512 // block_dv))
    programs = max(1, bsz * hkv * _cdiv(g, block_g))
    plain = dtype != torch.float32 and d == dv
    if block_dv <= 128 and not fp8:
        waves, least, most = (4 if plain else 2), 32, 128
    else:
        waves, least, most = 2, 64, 64
    splits = max(1, min(waves * SMS // programs, _cdiv(max(1, capacity), least), most))
    if block_dv <= 128:
        tile = (32, 4, 3, True) if plain else (32, 8, 3, False)
    else:
        tile = (16, 8, 3, False) if block_dv >= 512 else (16, 4, 3, False)
    return tile, splits, block_g


pytestmark = pytest.mark.usefixtures("tuned_tables")


class _Recorder:
    """A kernel that records its grid and keyword arguments and runs nothing."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, dict[str, Any]]] = []

    def __getitem__(self, grid: Any) -> Any:
        return lambda *args, **kw: self.calls.append((grid, kw))


class _Spy(_Recorder):
    """The kernel launched as before, each launch's grid and keyword arguments kept."""

    def __init__(self, kernel: Any) -> None:
        super().__init__()
        self.kernel = kernel

    def __getitem__(self, grid: Any) -> Any:
        record, launch = super().__getitem__(grid), self.kernel[grid]
        return lambda *args, **kw: (record(*args, **kw), launch(*args, **kw))


def _chosen(recorder: _Recorder) -> tuple[tuple[int, int, int, bool], int, int]:
    grid, kw = recorder.calls[-1]
    return (kw["BLOCK_N"], kw["num_warps"], kw["num_stages"], kw["PREFETCH"]), grid[2], kw["BLOCK_G"]


FORMS = [(64, 64), (96, 96), (128, 128), (256, 256), (192, 128), (576, 512)]  # (D, Dv)


def test_without_a_table_the_launch_is_unchanged_over_a_grid(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every form (16-bit and fp32 queries, fp8 caches, head dims 64-576 with and without a key
    tail, MHA to MLA's 128-head groups) from one sequence to a full batch and from one page to a
    million positions: the same tile, split count and heads per program as before the tables,
    through the launcher itself (kernels recorded, not run) and through launch_config."""
    split, merge = _Recorder(), _Recorder()
    monkeypatch.setattr(tk, "_decode_split", split)
    monkeypatch.setattr(tk, "_decode_merge", merge)
    for bsz, hkv, g, capacity, (d, dv), dtype, fp8 in itertools.product(
        (1, 3, 16, 64), (1, 4), (1, 8, 128), (16, 100, 4096, 1 << 20), FORMS,
        (torch.bfloat16, torch.float16, torch.float32), (False, True),
    ):  # fmt: skip
        if fp8 and dtype == torch.float32:
            continue
        page = 4 if capacity < 1024 else 1024
        width = _cdiv(capacity, page)
        cache = torch.float8_e4m3fn if fp8 else dtype
        hq = hkv * g
        one = torch.ones(1)
        tk.launch(
            torch.empty(bsz, hq, dv, dtype=dtype), torch.empty(0), False, torch.empty(bsz, hq, d, dtype=dtype),
            torch.empty(1, page, hkv, d, dtype=cache), torch.empty(1, page, hkv, dv, dtype=cache),
            torch.zeros(bsz, width, dtype=torch.int32), torch.zeros(bsz, dtype=torch.int32), one, False,
            one, one, fp8, 0.1, 0.0, -1,
        )  # fmt: skip
        want = _before_tables(bsz, hkv, g, width * page, d, dv, dtype, fp8)
        assert _chosen(split) == want, (bsz, hkv, g, capacity, d, dv, dtype, fp8)
    for bsz, hkv, g, capacity, (d, dv), dtype, fp8 in itertools.product(
        (1, 2, 5, 8, 16, 33, 64, 100, 256, 1024), (1, 2, 4, 8, 16), (1, 2, 4, 8, 16, 32, 128),
        (1, 31, 32, 33, 100, 512, 4096, 32768, 1 << 20), FORMS, (torch.bfloat16, torch.float32), (False, True),
    ):  # fmt: skip
        block_dv = max(16, _pow2(dv))
        heads = hkv * _cdiv(g, tk.group_tile(g, block_dv))
        plain = dtype != torch.float32 and d == dv
        tile, _, splits = tk.launch_config(CPU, bsz, heads, capacity, block_dv, g, plain, fp8)
        want = _before_tables(bsz, hkv, g, capacity, d, dv, dtype, fp8)
        assert (tuple(tile), splits) == want[:2], (bsz, hkv, g, capacity, d, dv, dtype, fp8)


def _problem(lens: list[int], width: int, dtype: torch.dtype, seed: int = 0) -> list[torch.Tensor]:
    """[query, key_cache, value_cache, block_tables, seq_lens]: 4 query heads on 2 KV heads, D 64,
    pages of 16, blocks shuffled."""
    g = torch.Generator().manual_seed(seed)
    nb = len(lens) * width + 2
    order = torch.randperm(nb, generator=g)[: len(lens) * width].reshape(len(lens), width).to(torch.int32)
    return [
        torch.randn(len(lens), 4, 64, generator=g).to(dtype),
        torch.randn(nb, 16, 2, 64, generator=g).to(dtype),
        torch.randn(nb, 16, 2, 64, generator=g).to(dtype),
        order,
        torch.tensor(lens, dtype=torch.int32),
    ]


def _launch(args: list[torch.Tensor], **kw: Any) -> torch.Tensor:
    kernel_args, out = decls.paged_decode.check(OP, *args)
    tk.launch(*kernel_args, **kw)
    return out


ENTRY = {"BLOCK_N": 16, "num_warps": 2, "num_stages": 1, "PREFETCH": 0, "WAVES": 1}


def test_a_user_table_picks_the_launch(tuned_user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A table for (padded value head dim, group) on this device: its entry nearest the programs
    of a split (3 sequences x 2 KV heads = 6: the M = 4 entry) sets the tile and the wave target
    (one program an SM: 22 splits where the rule's four hit the length bound, 32), and the result is
    the reference's; an entry without WAVES keeps the rule's; explicit arguments win; fp32 queries,
    fp8 caches, a key tail and wider heads read no table."""
    spy = _Spy(tk._decode_split)
    monkeypatch.setattr(tk, "_decode_split", spy)
    args = _problem([300, 130, 1], width=64, dtype=torch.bfloat16, seed=1)
    name = tuned.table_key(OP, "triton", "cpu", (64, 2)).file_name()
    assert name == "DV=64,G=2,device_name=cpu.json"
    no_waves = {k: v for k, v in ENTRY.items() if k != "WAVES"}
    (tuned_user_dir / name).write_text(
        json.dumps({"4": ENTRY, "64": {**no_waves, "BLOCK_N": 64}}), encoding="utf-8"
    )
    tuned.refresh()
    got = _launch(args)
    torch.testing.assert_close(got.float(), _decode.reference(*args).float(), atol=1.6e-2, rtol=1.6e-2)
    assert _chosen(spy) == ((16, 2, 1, False), 22, 16)
    assert _before_tables(3, 2, 2, 1024, 64, 64, torch.bfloat16, False)[1] == 32
    # 40 sequences: the M = 64 entry, no WAVES: the rule's four programs an SM (6 x 80 = 480 <= 528)
    assert tk.launch_config(CPU, 40, 2, 1024, 64, 2, True, False) == (tk.TileConfig(64, 2, 1, False), 4, 6)
    _launch(args, splits=5, tile=tk.TileConfig(32, 4, 2, True))
    assert _chosen(spy) == ((32, 4, 2, True), 5, 16)
    for dtype, fp8 in ((torch.float32, False), (torch.bfloat16, True)):  # (a key tail: as fp32)
        tile, _, splits = tk.launch_config(CPU, 3, 2, 1024, 64, 2, dtype != torch.float32, fp8)
        assert (tuple(tile), splits) == _before_tables(3, 2, 2, 1024, 64, 64, dtype, fp8)[:2]
    (tuned_user_dir / tuned.table_key(OP, "triton", "cpu", (256, 2)).file_name()).write_text(
        json.dumps({"4": ENTRY})
    )
    tuned.refresh()
    assert tk.launch_config(CPU, 3, 2, 1024, 256, 2, True, False)[0] == tk.tile_config(256)


def test_a_bad_table_entry_is_named_and_skipped(
    tuned_user_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    split = _Recorder()
    monkeypatch.setattr(tk, "_decode_split", split)
    monkeypatch.setattr(tk, "_decode_merge", _Recorder())
    name = tuned.table_key(OP, "triton", "cpu", (64, 2)).file_name()
    (tuned_user_dir / name).write_text(json.dumps({"4": {**ENTRY, "PREFETCH": 2}}), encoding="utf-8")
    tuned.refresh()
    args = _problem([300, 130, 1], width=64, dtype=torch.bfloat16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _launch(args)
    messages = [str(w.message) for w in caught]
    assert any(name in m and "M=4: PREFETCH=2 (0 or 1)" in m for m in messages), messages
    tile, splits, block_g = _before_tables(3, 2, 2, 1024, 64, 64, torch.bfloat16, False)
    assert _chosen(split) == (tile, splits, block_g)


@pytest.mark.parametrize(
    ("entry", "problems"),
    [
        ({"BLOCK_N": 32, "num_warps": 4}, ["missing num_stages"]),
        (
            {**ENTRY, "SPLITS": 4},
            ["unknown key(s) SPLITS (known: BLOCK_N, num_warps, num_stages, PREFETCH, WAVES)"],
        ),
        ({**ENTRY, "WAVES": 2.0}, ["WAVES=2.0 is not an integer"]),
        ({**ENTRY, "PREFETCH": True}, ["PREFETCH=True is not an integer"]),
        ({**ENTRY, "BLOCK_N": 24}, ["BLOCK_N=24 (a power of two in 16..256)"]),
        ({**ENTRY, "num_warps": 3}, ["num_warps=3 (1, 2, 4, 8 or 16)"]),
        ({**ENTRY, "num_stages": 0}, ["num_stages=0 (1..8)"]),
        ({**ENTRY, "PREFETCH": 2}, ["PREFETCH=2 (0 or 1)"]),
        ({**ENTRY, "WAVES": 0}, ["WAVES=0 (1..16 programs an SM)"]),
        ({**ENTRY, "WAVES": 17}, ["WAVES=17 (1..16 programs an SM)"]),
        ({"BLOCK_N": 32, "num_warps": 4, "num_stages": 3}, []),
    ],
)
def test_entry_checks_name_each_problem(entry: dict[str, Any], problems: list[str]) -> None:
    assert tuned.validate_entry(OP, "triton", entry) == problems


@pytest.mark.parametrize("block_dv", [16, 64, 128])
def test_default_is_the_plain_tile_and_the_wave_rule(block_dv: int) -> None:
    """No table: tile_config's plain tile, no WAVES (the launch's rule: it needs the SM count)."""
    config = tuned.default_config(OP, "triton", 8, (block_dv, 4))
    assert tuned.validate_entry(OP, "triton", config) == []
    block_n, warps, stages, prefetch = tk.tile_config(block_dv)
    assert config == {"BLOCK_N": block_n, "num_warps": warps, "num_stages": stages, "PREFETCH": int(prefetch)}
    assert tk.wave_target() == 4 and tk.wave_target(False) == 2


def test_kernel_problem_is_what_the_launch_looks_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """(padded Dv, G) and M = sequences x KV head chunks (MLA's 128-head group: 8 chunks)."""
    seen: list[tuple[Any, ...]] = []
    lookup = tuned.lookup
    monkeypatch.setattr(tuned, "lookup", lambda *a, **kw: (seen.append(a), lookup(*a, **kw))[1])
    monkeypatch.setattr(tk, "_decode_split", _Recorder())
    monkeypatch.setattr(tk, "_decode_merge", _Recorder())
    problem = tuned.SCHEMAS[OP].kernel_problem
    assert problem is not None
    args = _problem([300, 130, 1], width=4, dtype=torch.bfloat16)
    kernel_args, _ = decls.paged_decode.check(OP, *args)
    tk.launch(*kernel_args)
    assert problem(*kernel_args) == ((64, 2), 6) == (seen[-1][3], seen[-1][4])
    q, kc = torch.empty(2, 128, 576, dtype=torch.bfloat16), torch.empty(3, 16, 1, 576, dtype=torch.bfloat16)
    assert problem(None, None, False, q, kc, kc[..., :512]) == ((512, 128), 16)
