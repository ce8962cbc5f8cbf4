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


def test_a_refused_entry_runs_the_default_and_is_remembered() -> None:
    op, shape, m = "gemm.w8a8_block_fp8_matmul", (512, 1024), 64
    default = dict(tuned.default_config(op, "triton", m, shape))
    entry = {**default, "num_stages": default["num_stages"] + 3}
    ran: list[dict[str, Any]] = []

    def launch(cfg: Any) -> str:
        if dict(cfg) == entry:
            raise _refusal()
        ran.append(dict(cfg))
        return "done"

    with pytest.warns(tuned.TunedConfigWarning, match="does not compile here.*OutOfResources"):
        assert _triton_tuned.launch_tuned(launch, entry, op, "triton", "cpu", shape, m) == "done"
    assert ran == [default]
    assert dict(tuned.lookup(op, "triton", "cpu", shape, m)) == default  # served from now on
    tuned.refresh()  # a reread table is tried again
    # the default refused as well: a bug of the default, raised, not hidden
    with pytest.raises(errors.OutOfResources):
        _triton_tuned.launch_tuned(lambda cfg: launch(entry), default, op, "triton", "cpu", shape, m)


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
