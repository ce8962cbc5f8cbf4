"""A tuned table's entry the compiler refuses on this device (Triton's ``OutOfResources``: a table
checks its keys, not the chip's shared memory) runs the op's default instead, with a warning, and
later calls of that shape take the default without compiling the refused entry again
(``ops/_triton_tuned.launch_tuned``, ``tuned.reject``)."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from opmux.kernels import tuned

errors = pytest.importorskip("triton.runtime.errors")
_triton_tuned = pytest.importorskip("opmux.kernels.ops._triton_tuned")
tk = pytest.importorskip("opmux.kernels.ops.attention.triton_kernels")
pt = pytest.importorskip("opmux.kernels.ops.attention._prefill_triton")

from opmux.kernels.ops.attention import _decode, _prefill  # noqa: E402
from opmux.kernels.ops.attention import op as decls  # noqa: E402

pytestmark = pytest.mark.usefixtures("tuned_tables")
I32 = torch.int32


def _refusal() -> Exception:
    return errors.OutOfResources(300_000, 232_448, "shared memory")


class _Refusing:
    """The kernel, except that a launch whose ``key`` keyword is ``value`` raises as Triton's
    compiler does for a tile past the chip's shared memory."""

    def __init__(self, kernel: Any, key: str, value: int) -> None:
        self.kernel, self.key, self.value = kernel, key, value
        self.refused = 0
        self.ran: list[int] = []

    def __getitem__(self, grid: Any) -> Any:
        launch = self.kernel[grid]

        def call(*args: Any, **kw: Any) -> Any:
            if kw[self.key] == self.value:
                self.refused += 1
                raise _refusal()
            self.ran.append(kw[self.key])
            return launch(*args, **kw)

        return call


def _gemm_table(folder: Path, shape: tuple[int, int], entry: dict[str, Any]) -> None:
    name = tuned.table_key(GEMM, "triton", "cpu", shape).file_name()
    (folder / name).write_text(json.dumps({"64": entry}), encoding="utf-8")
    tuned.refresh()


GEMM = "gemm.w8a8_block_fp8_matmul"


def test_a_refused_entry_is_taken_out_of_its_table(tuned_user_dir: Path) -> None:
    """The entry is refused once: the call runs the default, one warning names the file, and
    every M the entry served (64 and 80 here) gets its own default from then on, with no
    second compile or warning; a reread table tries it again; a refused default raises."""
    shape = (512, 1024)
    default = {m: dict(tuned.default_config(GEMM, "triton", m, shape)) for m in (64, 80)}
    entry = {**default[64], "num_stages": default[64]["num_stages"] + 3}
    _gemm_table(tuned_user_dir, shape, entry)
    assert dict(tuned.lookup(GEMM, "triton", "cpu", shape, 80)) == entry
    ran: list[dict[str, Any]] = []

    def launch(cfg: Any) -> str:
        if dict(cfg) == entry:
            raise _refusal()
        ran.append(dict(cfg))
        return "done"

    def call(m: int) -> str:
        cfg = tuned.lookup(GEMM, "triton", "cpu", shape, m)
        return _triton_tuned.launch_tuned(launch, cfg, GEMM, "triton", "cpu", shape, m)

    with pytest.warns(tuned.TunedConfigWarning, match=r"does not compile here.*OutOfResources") as seen:
        assert call(64) == "done"
    name = tuned.table_key(GEMM, "triton", "cpu", shape).file_name()
    assert len(seen) == 1 and name in str(seen[0].message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert call(80) == call(64) == "done"
    assert ran == [default[64], default[80], default[64]]
    tuned.refresh()
    assert dict(tuned.lookup(GEMM, "triton", "cpu", shape, 64)) == entry
    with pytest.raises(errors.OutOfResources):  # the default refused: a bug of the default
        _triton_tuned.launch_tuned(lambda cfg: launch(entry), default[64], GEMM, "triton", "cpu", shape, 64)


def test_gemm_and_moe_launches_fall_back(tuned_user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The two table readers outside attention go through launch_tuned with their own key (the
    MoE's form tags included)."""
    gk = pytest.importorskip("opmux.kernels.ops.gemm.triton_kernels")
    mk = pytest.importorskip("opmux.kernels.ops.moe.fused_experts_triton")
    a, b = torch.zeros(64, 1024, dtype=torch.float8_e4m3fn), torch.zeros(512, 1024, dtype=torch.float8_e4m3fn)
    entry = {**tuned.default_config(GEMM, "triton", 64, (512, 1024)), "num_stages": 7}
    _gemm_table(tuned_user_dir, (512, 1024), entry)
    seen: list[Any] = []
    refused = [entry]

    def refusing(*args: Any) -> None:
        if dict(args[-1]) in refused:
            raise _refusal()
        seen.append(dict(args[-1]))

    monkeypatch.setattr(gk, "launch", refusing)
    with pytest.warns(tuned.TunedConfigWarning, match=GEMM):
        gk.w8a8_block_fp8_matmul(torch.empty(64, 512), a, b, torch.ones(64, 8), torch.ones(4, 8))
    assert seen == [dict(tuned.default_config(GEMM, "triton", 64, (512, 1024)))]

    e, n, k, m = 4, 128, 256, 8
    args = (
        torch.empty(m, k, dtype=torch.bfloat16), torch.zeros(m, k, dtype=torch.bfloat16),
        torch.zeros(e, 2 * n, k, dtype=torch.bfloat16), torch.zeros(e, k, n, dtype=torch.bfloat16),
        torch.ones(m, 2), torch.zeros(m, 2, dtype=torch.int32), torch.empty(0), torch.empty(0),
        torch.empty(0, dtype=torch.int32),
    )  # fmt: skip
    shape, rows = mk._PROBLEM(*args)
    tags = mk._TAGS(*args)
    moe_default = dict(tuned.default_config(mk.OP, "triton", rows, shape, tags))
    moe_entry = {**moe_default, "num_stages": 7}
    refused[:] = [moe_entry]
    name = tuned.table_key(mk.OP, "triton", "cpu", shape, tags).file_name()
    (tuned_user_dir / name).write_text(json.dumps({str(rows): moe_entry}), encoding="utf-8")
    tuned.refresh()
    monkeypatch.setattr(mk, "launch_fused_experts", lambda *a, **kw: refusing(*a))
    seen.clear()
    with pytest.warns(tuned.TunedConfigWarning, match=mk.OP):
        mk.fused_experts(*args, "silu", False, False)
    assert seen == [moe_default]


def _decode_problem() -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    lens, width, nb = [300, 130, 1], 24, 80
    table = torch.randperm(nb, generator=g)[: 3 * width].reshape(3, width).to(I32)
    return [
        torch.randn(3, 4, 64, generator=g).bfloat16(),
        torch.randn(nb, 16, 2, 64, generator=g).bfloat16(),
        torch.randn(nb, 16, 2, 64, generator=g).bfloat16(),
        table,
        torch.tensor(lens, dtype=I32),
    ]


def test_paged_decode_refused_table_entry(tuned_user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = {"BLOCK_N": 16, "num_warps": 2, "num_stages": 1, "PREFETCH": 0, "WAVES": 1}
    assert tk.tile_config(64).block_n != 16
    name = tuned.table_key("attention.paged_decode", "triton", "cpu", (64, 2)).file_name()
    (tuned_user_dir / name).write_text(json.dumps({"4": entry}), encoding="utf-8")
    tuned.refresh()
    kernel = _Refusing(tk._decode_split, "BLOCK_N", 16)
    monkeypatch.setattr(tk, "_decode_split", kernel)
    args = _decode_problem()
    want = _decode.reference(*args).float()
    for call in range(2):
        kernel_args, out = decls.paged_decode.check("attention.paged_decode", *args)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            tk.launch(*kernel_args)
        named = [w for w in seen if issubclass(w.category, tuned.TunedConfigWarning)]
        assert len(named) == (1 if call == 0 else 0), [str(w.message) for w in seen]
        if call == 0:
            assert name in str(named[0].message) and "BLOCK_N" in str(named[0].message)
        torch.testing.assert_close(out.float(), want, atol=1.6e-2, rtol=1.6e-2)
    assert kernel.refused == 1 and kernel.ran == [tk.tile_config(64).block_n] * 2


def test_paged_prefill_refused_table_entry(tuned_user_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    entry = {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    default = tuned.default_config("attention.paged_prefill", "triton", 50, (64, 2))
    assert default["BLOCK_M"] != 32
    name = tuned.table_key("attention.paged_prefill", "triton", "cpu", (64, 2)).file_name()
    (tuned_user_dir / name).write_text(json.dumps({"32": entry}), encoding="utf-8")
    tuned.refresh()
    kernel = _Refusing(pt._prefill, "BLOCK_M", 32)
    monkeypatch.setattr(pt, "_prefill", kernel)
    g = torch.Generator().manual_seed(5)
    table = torch.randperm(12, generator=g)[:10].reshape(2, 5).to(I32)
    args = [
        torch.randn(50, 4, 64, generator=g).bfloat16(),
        torch.randn(12, 16, 2, 64, generator=g).bfloat16(),
        torch.randn(12, 16, 2, 64, generator=g).bfloat16(),
        table,
        torch.tensor([70, 30], dtype=I32),
        torch.tensor([0, 30, 50], dtype=I32),
    ]
    want = _prefill.reference(*args).float()
    for call in range(2):
        kernel_args, out = decls.paged_prefill.check("attention.paged_prefill", *args)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            pt.launch(*kernel_args)
        named = [w for w in seen if issubclass(w.category, tuned.TunedConfigWarning)]
        assert len(named) == (1 if call == 0 else 0), [str(w.message) for w in seen]
        torch.testing.assert_close(out.float(), want, atol=1.6e-2, rtol=1.6e-2)
    assert kernel.refused == 1 and kernel.ran == [default["BLOCK_M"]] * 2


def test_a_callers_tile_refused_is_the_callers_error(
    tuned_user_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An explicit tile (a sweep's candidate) the compiler refuses raises, and the table's entry
    stays: the refusal is not the table's."""
    entry = {"BLOCK_M": 32, "BLOCK_N": 16, "num_warps": 4, "num_stages": 1}
    name = tuned.table_key("attention.paged_prefill", "triton", "cpu", (64, 2)).file_name()
    (tuned_user_dir / name).write_text(json.dumps({"32": entry}), encoding="utf-8")
    tuned.refresh()
    monkeypatch.setattr(pt, "_prefill", _Refusing(pt._prefill, "BLOCK_M", 64))
    q = torch.randn(50, 4, 64).bfloat16()
    kc = torch.randn(12, 16, 2, 64).bfloat16()
    table = torch.arange(10, dtype=I32).reshape(2, 5)
    args = [q, kc, kc.clone(), table, torch.tensor([70, 30], dtype=I32), torch.tensor([0, 30, 50], dtype=I32)]
    kernel_args, _ = decls.paged_prefill.check("attention.paged_prefill", *args)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(errors.OutOfResources):
            pt.launch(*kernel_args, block_m=64)
    assert dict(tuned.lookup("attention.paged_prefill", "triton", "cpu", (64, 2), 50)) == entry
