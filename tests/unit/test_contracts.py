"""The op contracts as data (ops/_contract.py) and the checks generated from them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from opmux.kernels.ops._contract import FLOATS, Arg, Contract, Rule, Scalar, split_dims

ROOT = Path(__file__).resolve().parents[2]


def test_generated_checks_are_current() -> None:
    """ops/<group>/_contracts.py is what tools/gen_contracts.py writes from the declarations."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_contracts.py"), "--check"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr


def test_dims_split_outside_parentheses() -> None:
    assert split_dims("*T, cdiv(K, 128)") == ("*T", "cdiv(K, 128)")
    assert split_dims("N, K") == ("N", "K")


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Arg("x", "*T, H", layout="diagonal", dtypes=FLOATS), "layout 'diagonal'"),
        (lambda: Arg("x", "*T, H"), "exactly one of dtypes="),
        (lambda: Arg("x", "H", dtypes=FLOATS, dtype_from="d"), "exactly one of"),
        (lambda: Scalar("eps", "tiny"), "kind 'tiny'"),
        (lambda: Contract("c", (Arg("x", "H, *T", dtypes=FLOATS),), kernel=("x",)), "only on the first dim"),
        (lambda: Contract("c", (Arg("x", "H", dtypes=FLOATS),), kernel=("y",)), "'y' is not declared"),
        (
            lambda: Contract("c", (Arg("w", "H", like="x"), Arg("x", "H", dtypes=FLOATS)), kernel=("x",)),
            "refers to 'x' before",
        ),
    ],
)
def test_invalid_contracts_are_refused(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


def test_rule_and_scalar_messages_come_from_the_contract() -> None:
    """A generated check raises the contract's own words (here: a toy contract, rendered and run)."""
    import torch

    from opmux.kernels.ops._contract_codegen import render_group
    from opmux.kernels.ops._decl import declare

    c = Contract(
        "toy",
        (
            Arg("x", "*T, H", dtypes=FLOATS),
            Arg("w", "H", like="x", layout="vector"),
            Scalar("eps", "positive"),
            Rule("H % 4 == 0", "x has {H} columns; a multiple of 4 is needed"),
            Rule("H <= 8", "x has {H} columns; at most 8 on this device", device="cpu"),
            Arg("out", "*T, H", like="x", out=True),
        ),
        kernel=("out", "x", "w", "eps"),
        result="out",
    )
    decl = declare(
        "toy.norm",
        "(Tensor x, Tensor w, float eps=1e-06, Tensor(a!)? out=None) -> Tensor",
        contract=c,
        reference=test_rule_and_scalar_messages_come_from_the_contract,
        doc="toy",
        native=False,
        triton=False,
    )
    scope: dict[str, object] = {}
    text = render_group([decl]).replace("from .. import _checks", "from opmux.kernels.ops import _checks")
    exec(compile(text.replace("from .._torch import torch", "import torch"), "<toy>", "exec"), scope)
    check = scope["check_toy"]
    x, w = torch.randn(3, 8), torch.randn(8)
    (out, xv, wv, eps), res = check("toy.norm", x, w, 1e-6)  # type: ignore[operator]
    assert res is out and out.shape == x.shape and xv is x and eps == 1e-6
    with pytest.raises(ValueError, match="x has 6 columns; a multiple of 4 is needed"):
        check("toy.norm", torch.randn(3, 6), torch.randn(6), 1e-6)  # type: ignore[operator]
    with pytest.raises(ValueError, match="at most 8 on this device"):
        check("toy.norm", torch.randn(3, 12), torch.randn(12), 1e-6)  # type: ignore[operator]
    with pytest.raises(ValueError, match="eps must be a finite number > 0"):
        check("toy.norm", x, w, 0.0)  # type: ignore[operator]
    with pytest.raises(TypeError, match="w has dtype float16, expected float32 like x"):
        check("toy.norm", x, w.half(), 1e-6)  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"w has shape \(4,\), expected \[8\]"):
        check("toy.norm", x, w[:4], 1e-6)  # type: ignore[operator]
    with pytest.raises(ValueError, match="dense vector"):
        check("toy.norm", x, torch.randn(16)[::2], 1e-6)  # type: ignore[operator]


# -- the cache extensions: Forms, trailing E... dims, any-dtype caches, cache layouts -----------
def _toy_forms() -> tuple[object, object]:
    """A toy paged-cache write: a cache of x's dtype (the serving form) or fp8 with a scale."""
    from opmux.kernels.ops._contract import ANY, FP8, Forms, When
    from opmux.kernels.ops._decl import declare

    x = Arg("x", "T, E...", dtypes=FLOATS, layout="entries")
    slots = Arg(
        "slots", "T", dtypes=("int64",), device_of="x", layout="dense_last", expect="[{T}] (one a row)"
    )
    plain = Contract(
        "toy_plain",
        (
            x,
            Arg("cache", "NB, E...", like="x", layout="blocks", expect="[num_blocks, {E}]"),
            Rule("scale is None", "scale is for an fp8 cache"),
            slots,
        ),
        kernel=("x", "cache", "slots", "slots", "False"),
        values_cpp="slots_fit(device_type, slots)",
        values_header="opmux/toy_values.h",
    )
    fp8 = Contract(
        "toy_fp8",
        (
            x,
            Arg("cache", "NB, E...", dtypes=FP8, device_of="x", layout="blocks"),
            Arg("scale", "", dtypes=("float32",), device_of="x", layout="element"),
            slots,
        ),
        kernel=("x", "cache", "slots", "scale", "True"),
    )
    forms = Forms("toy_write", cases=(((When("cache", dtype="float8_e4m3fn"),), fp8),), default=plain)
    decl = declare(
        "toy.write",
        "(Tensor x, Tensor(a!) cache, Tensor slots, Tensor? scale=None) -> ()",
        contract=forms,
        reference=_toy_forms,
        doc="toy",
        triton=False,
    )
    swap = Contract(
        "toy_swap",
        (
            Arg("src", "NS, B...", dtypes=ANY, layout="blocks"),
            Arg("dst", "ND, C...", like="src", any_device=True, layout="blocks"),
            Rule("C == B", "dst has blocks {C}, src {B}"),
        ),
        kernel=("src", "dst"),
    )
    return decl, swap


def _exec_checks(*decls: object) -> dict[str, object]:
    from opmux.kernels.ops._contract_codegen import render_group

    text = render_group(decls).replace("from .. import _checks", "from opmux.kernels.ops import _checks")  # type: ignore[arg-type]
    scope: dict[str, object] = {}
    exec(compile(text.replace("from .._torch import torch", "import torch"), "<toy>", "exec"), scope)
    return scope


def test_forms_pick_the_contract_of_the_call() -> None:
    import torch

    from opmux.kernels.ops._decl import declare

    decl, swap = _toy_forms()
    swap_decl = declare(
        "toy.swap",
        "(Tensor src, Tensor(a!) dst) -> ()",
        contract=swap,
        reference=_toy_forms,
        doc="toy",
        native=False,
        triton=False,
    )
    check = _exec_checks(decl, swap_decl)["check_toy_write"]
    x, cache, slots = torch.randn(3, 2, 4), torch.zeros(5, 2, 4), torch.arange(3)
    kargs, _ = check("toy.write", x, cache, slots)  # type: ignore[operator]
    assert kargs[-2:] == (slots, False) and kargs[1] is cache
    q, scale = cache.to(torch.float8_e4m3fn), torch.tensor(0.5)
    kargs, _ = check("toy.write", x, q, slots, scale)  # type: ignore[operator]
    assert kargs[-1] is True and kargs[-2].shape == (1,)
    with pytest.raises(ValueError, match="scale is for an fp8 cache"):
        check("toy.write", x, cache, slots, scale)  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"cache has shape \(5, 2, 3\), expected \[num_blocks, \(2, 4\)\]"):
        check("toy.write", x, torch.zeros(5, 2, 3), slots)  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"slots has shape \(2,\), expected \[3\] \(one a row\)"):
        check("toy.write", x, cache, slots[:2])  # type: ignore[operator]
    with pytest.raises(ValueError, match="each block cache\\[b\\] must be one dense region"):
        check("toy.write", x, torch.zeros(5, 2, 8)[:, :, ::2], slots)  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"its entries \(dims 1\.\.\) must be contiguous"):
        check("toy.write", torch.randn(3, 4, 2).transpose(1, 2), cache, slots)  # type: ignore[operator]
    with pytest.raises(ValueError, match="slots has a non-contiguous last dimension"):
        check("toy.write", x, cache, torch.arange(6)[::2])  # type: ignore[operator]
    swap_check = _exec_checks(decl, swap_decl)["check_toy_swap"]
    a = torch.zeros(4, 2, dtype=torch.int16)  # any dtype; another device would do
    assert swap_check("toy.swap", a, torch.zeros(3, 2, dtype=torch.int16))[0][0] is a  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"dst has blocks \(3,\), src \(2,\)"):
        swap_check("toy.swap", a, torch.zeros(3, 3, dtype=torch.int16))  # type: ignore[operator]


def test_forms_lanes_run_the_forms_a_lane_can_state() -> None:
    """The C++ lane picks the form as Python does; the fp8 form (a one-element scale) has none."""
    from opmux.kernels.ops._contract_cpp import lane_form, render_entries, render_header

    decl, swap = _toy_forms()
    assert lane_form(decl.contract) is None  # type: ignore[attr-defined]
    assert lane_form(decl.contract.cases[0][1]) == "scale's layout element"  # type: ignore[attr-defined]
    assert lane_form(swap) == "dst may be on another device"  # type: ignore[arg-type]
    header = render_header("toy", [decl])  # type: ignore[list-item]
    assert header is not None
    assert '#include "opmux/toy_values.h"' in header
    assert (
        "if (is_dtype(cache, kDLFloat8_e4m3fn, 8)) return refused();  // no lane: scale's layout element"
        in header
    )
    assert "if (!(is_none(scale_arg))) return refused();" in header
    assert "if (!(same_tail(cache, 1, x, 1))) return refused();" in header
    assert "if (!(slots_fit(device_type, slots))) return refused();" in header
    assert "kernel(x, cache, slots, slots, false);" in header
    entries = render_entries("toy", "cpu", [decl])  # type: ignore[list-item]
    assert entries is not None and "lane::AnyView scale" in entries


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (
            lambda: Contract("c", (Arg("x", "E..., H", dtypes=FLOATS),), kernel=("x",)),
            "'E...' only on the last dim",
        ),
        (
            lambda: Contract("c", (Arg("x", "*T, E...", dtypes=FLOATS),), kernel=("x",)),
            "'E...' only on the last dim",
        ),
    ],
)
def test_invalid_trailing_dims_are_refused(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


def test_forms_need_conditions_and_names_of_their_own() -> None:
    from opmux.kernels.ops._contract import Forms, When

    c = Contract("c", (Arg("x", "H", dtypes=FLOATS),), kernel=("x",))
    with pytest.raises(ValueError, match="a name of its own"):
        Forms("f", cases=(((When("x", ndim=2),), c),), default=c)
    with pytest.raises(ValueError, match="needs a condition"):
        Forms("f", cases=(((), Contract("d", c.items, kernel=("x",))),), default=c)
