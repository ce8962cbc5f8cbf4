"""The op contracts as data (ops/_contract.py) and the checks generated from them."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

from opmux.kernels.ops._contract import FLOATS, Arg, Contract, Rule, Scalar, split_dims

ROOT = Path(__file__).resolve().parents[2]


def test_generated_checks_are_current() -> None:
    """ops/<group>/_contracts.py and every group's _entrypoints.py (its ops' public, bound and
    library-op functions) are what tools/gen_contracts.py writes from the declarations."""
    r = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_contracts.py"), "--check"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    from opmux.kernels.ops._catalog import GROUPS

    spec = importlib.util.spec_from_file_location("gen_contracts", ROOT / "tools" / "gen_contracts.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    ops = ROOT / "python" / "opmux" / "kernels" / "ops"
    made = {p.relative_to(ops) for p in gen.expected() if p.name == "_entrypoints.py"}
    assert made == {Path(g) / "_entrypoints.py" for g in GROUPS}


def test_entry_points_of_another_form_are_refused() -> None:
    """fused_op takes an op's generated functions only for the declaration they were written
    from: a changed one (here: a values check added) asks for the generator, never runs stale."""
    from dataclasses import replace

    from opmux.kernels.fused_op import generated
    from opmux.kernels.ops._entry_codegen import form
    from opmux.kernels.ops.activation import op as act

    assert generated(act.silu_and_mul).FORMS["silu_and_mul"] == form(act.silu_and_mul)
    with pytest.raises(
        RuntimeError, match=r"activation\.silu_and_mul: .* run python tools/gen_contracts\.py"
    ):
        generated(replace(act.silu_and_mul, values=lambda *args: None))


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
    (out, xv, _wv, eps), res = check("toy.norm", x, w, 1e-6)  # type: ignore[operator]
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
