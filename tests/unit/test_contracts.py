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


# -- the forms the quantization ops added ---------------------------------------------------------
_F32 = ("float32",)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: Arg("s", "*T, C", dtypes=_F32, layout="scales"), "is for outputs"),
        (
            lambda: Arg("s", "*T, C", dtypes=_F32, out=True, alloc=(("f", "columns"),)),
            "go with layout='scales'",
        ),
        (
            lambda: Arg("s", "*T, C", dtypes=_F32, out=True, layout="scales", alloc=(("f", "diagonal"),)),
            "alloc 'diagonal'",
        ),
        (lambda: Arg("s", "G", dtypes=_F32, layout="blocks"), "2-d shape"),
        (
            lambda: Contract(
                "c",
                (
                    Arg("x", "*T, H", dtypes=FLOATS),
                    Arg("s", "*T, H", dtypes=_F32, out=True, layout="scales", alloc=(("cm", "columns"),)),
                ),
                kernel=("s", "x"),
            ),
            "allocated by 'cm', not a bool scalar",
        ),
        (
            lambda: Contract("c", (Arg("x", "H", dtypes=FLOATS),), kernel=("x",), result=("x", "y")),
            "'y' is not",
        ),
    ],
)
def test_invalid_output_forms_are_refused(make: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make()  # type: ignore[operator]


def _two_outputs() -> tuple[Contract, object]:
    """A toy quantization: x [*T, H] -> (q like x, group scales chosen by flags / packed)."""
    from opmux.kernels.ops._contract import Packed
    from opmux.kernels.ops._decl import declare

    c = Contract(
        "toy_quant",
        (
            Arg("x", "*T, H", dtypes=FLOATS),
            Rule(
                "H <= 64", "x has {prod(T)} rows of {H}; at most 64 wide on CUDA", device="cuda", name="wide"
            ),
            Arg("ub", "", dtypes=_F32, device_of="x", layout="element"),
            Scalar("g", "positive_int"),
            Rule("H % g == 0", "x's last dim {H} is not a multiple of g {g}", name="multiple"),
            Scalar("cm", "bool"),
            Scalar("packed", "bool"),
            Arg("q", "*T, H", like="x", out=True),
            Arg(
                "s",
                "*T, H // g",
                dtypes=_F32,
                device_of="x",
                out=True,
                layout="scales",
                note=" (one per group)",
                alloc=(("cm", "columns"),),
                packed=Packed("int32", "packed", "cdiv(H // g, 4)", "packed", "4 per int32"),
            ),
        ),
        kernel=("q", "s", "x", "ub", "g", "max(prod(T) // 2, 1)"),
        result=("q", "s"),
    )
    decl = declare(
        "toy.quant",
        "(Tensor x, Tensor? ub=None, int g=2, bool cm=False, bool packed=False, Tensor(a!)? q=None, "
        "Tensor(a!)? s=None) -> (Tensor, Tensor)",
        contract=c,
        reference=_two_outputs,
        doc="toy",
        triton=False,
    )
    return c, decl


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
            Arg("cache", "NB, E...", like="x", layout="paged", expect="[num_blocks, {E}]"),
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
            Arg("cache", "NB, E...", dtypes=FP8, device_of="x", layout="paged"),
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
            Arg("src", "NS, B...", dtypes=ANY, layout="paged"),
            Arg("dst", "ND, C...", like="src", any_device=True, layout="paged"),
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


def test_several_outputs_flag_layouts_and_packed_forms() -> None:
    """Outputs allocated as their flags say (column-major), a caller's packed form allowed only
    with its flag, an absent optional input as an empty view, a kernel expression, the generated
    ``outputs_<contract>`` allocating what the check's serving form does."""
    import torch

    _c, decl = _two_outputs()
    scope = _exec_checks(decl)
    check, outputs = scope["check_toy_quant"], scope["outputs_toy_quant"]
    x = torch.randn(3, 8)
    (q, s, _xv, ub, _g, gm), (rq, rs) = check("toy.quant", x)  # type: ignore[operator]
    assert rq is q and rs is s and s.shape == (3, 4) and s.is_contiguous() and ub.numel() == 0 and gm == 1
    (q, s, *_), (_, rs) = check("toy.quant", x.view(1, 3, 8), None, 2, True)  # type: ignore[operator]
    assert rs.shape == (1, 3, 4) and s.stride() == (1, 3)  # a [T, G] view of a column-major [G, T]
    (outs, res) = outputs(x, None, 2, True)  # type: ignore[operator]
    assert outs[1].stride() == (1, 3) and res[1] is outs[1]
    packed = torch.zeros(3, 1, dtype=torch.int32)
    with pytest.raises(TypeError, match=r"s has dtype int32 \(packed\), which needs packed=True"):
        check("toy.quant", x, None, 2, False, False, None, packed)  # type: ignore[operator]
    (_, sv, *_), _ = check("toy.quant", x, None, 2, False, True, None, packed)  # type: ignore[operator]
    assert sv.shape == (3, 1)
    with pytest.raises(
        ValueError, match=r"s has shape \(3, 2\), expected \[\.\.\., 1\] \(4 per int32\) for 3 rows"
    ):
        check("toy.quant", x, None, 2, False, True, None, torch.zeros(3, 2, dtype=torch.int32))  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"s has overlapping or negative strides \(0, 0\)"):
        check("toy.quant", x, None, 2, False, False, None, torch.zeros(1).expand(3, 4))  # type: ignore[operator]
    with pytest.raises(ValueError, match="x's last dim 8 is not a multiple of g 3"):
        check("toy.quant", x, None, 3)  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"ub has shape \(2,\), expected one element"):
        check("toy.quant", x, torch.ones(2))  # type: ignore[operator]


def test_extended_lane_states_the_same_contract_in_cpp() -> None:
    """The C++ lane of a contract with several outputs: device-tagged rules bind on their device,
    ``prod(T)`` is the serving form's one batch dim, a flag that allocates another way refuses a
    fresh output, fresh outputs come back as ``ran_all``; a named rule is a native ``rule_<name>``."""
    from opmux.kernels.ops._contract_cpp import extended_form, lane_form, render_header

    c, decl = _two_outputs()
    assert lane_form(c) is not None and extended_form(c, decl) is None  # type: ignore[arg-type]
    text = render_header("toy", [decl])  # type: ignore[list-item]
    assert text is not None
    assert "if (!(device_type != kDLCUDA || (H <= 64))) return refused();" in text
    assert "if (!(ub_arg.type_index() == TypeIndex::kTVMFFINone)) return refused();" in text
    assert "if (!s && cm) return refused();" in text
    assert "kernel(q_t, s_t, x, ub_none.view(), g, std::max<int64_t>(T / 2, 1));" in text
    assert "return ran_all({&q_fresh, &s_fresh});" in text
    assert (
        "inline void rule_multiple(const char* op, int64_t H, int64_t g) {\n"
        '  if (!(H % g == 0)) TVM_FFI_THROW(ValueError) << op << ": " << "x\'s last dim " << H '
        '<< " is not a multiple of g " << g;\n}'
    ) in text
    assert "inline void rule_wide(const char* op, int64_t H, int64_t T)" in text


def test_a_lane_without_the_values_hooks_counterpart_is_refused() -> None:
    """An op whose ``values=`` hook checks contents gets no lane unless its contract states the
    hook's C++ counterpart: such a lane would run the kernel on indices Python refuses."""
    from dataclasses import replace

    from opmux.kernels.ops._contract_cpp import render_header

    c, decl = _two_outputs()

    def in_range(*args: object) -> None:
        return None

    with pytest.raises(
        ValueError, match=r"toy\.quant: contract .* has a C\+\+ lane but no values_cpp.*in_range"
    ):
        render_header("toy", [replace(decl, values=in_range)])  # type: ignore[type-var]
    stated = replace(decl, values=in_range, contract=replace(c, values_cpp="device_type != kDLCUDA"))
    text = render_header("toy", [stated])  # type: ignore[type-var]
    assert text is not None and "if (!(device_type != kDLCUDA)) return refused();" in text


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


# -- the moe extensions: index buffers of at least a length, several-dtype and optional written
# -- tensors, int32 scalars, scalars named in shapes, kernel flags of what the caller passed
def _toy_align() -> tuple[Contract, object]:
    """A toy alignment: ids [T, k] -> (slots: at least T*k + min(n, T*k) padded, allocated longer;
    routes [T, k] int32 or int64, rows apart), an optional map [n] and a written count buffer."""
    from opmux.kernels.ops._decl import declare

    c = Contract(
        "toy_align",
        (
            Arg(
                "ids",
                "T, k",
                dtypes=("int32", "int64"),
                layout="contiguous",
                dtype_hint="has dtype {dtype}, expected int32",
                layout_hint="is not contiguous",
            ),
            Scalar("n", "positive_int"),
            Scalar("fill", "int32"),
            Scalar("cap", "off_or_positive"),
            Rule("T * k + n < 2**31", "{T * k + n} slots do not fit int32", name="fits"),
            Arg("map", "n", dtypes=("int32",), device_of="ids", layout="vector", note=" (one per expert)"),
            Arg(
                "slots",
                "T * k + min(n, T * k)",
                dtypes=("int32",),
                device_of="ids",
                layout="vector",
                out=True,
                at_least=True,
                alloc_shape="T * k + n",
                note=" (padded)",
            ),
            Arg(
                "routes",
                "T, k",
                dtypes=("int32", "int64"),
                device_of="ids",
                layout="rows_apart",
                out=True,
                expect="[{T}, {k}]",
                dtype_hint="has dtype {dtype}; expected int32 or int64",
            ),
            Arg(
                "counts",
                "n + 1",
                dtypes=("int32",),
                device_of="ids",
                layout="vector",
                at_least=True,
                note=" (n + 1)",
            ),
        ),
        kernel=("slots", "routes", "counts", "counts is not None", "ids", "map", "slots is None or fill > 0"),
        result=("slots", "routes"),
        lane_optional=True,
    )
    decl = declare(
        "toy.align",
        "(Tensor ids, int n, Tensor? map=None, int fill=-1, float cap=0.0, Tensor(a!)? slots=None, "
        "Tensor(a!)? routes=None, Tensor(a!)? counts=None) -> (Tensor, Tensor)",
        contract=c,
        reference=_toy_align,
        doc="toy",
        triton=False,
    )
    return c, decl


def test_index_buffers_optional_written_inputs_and_int32_scalars() -> None:
    """A caller's buffer may be longer than its declared length (the op's own is ``alloc_shape``
    long), an output of several dtypes is made in the first, a written optional input is checked
    when given, a shape names a scalar, a kernel flag says whether the caller passed an output
    (as passed, not after the op allocated its own), and the generated ``outputs_<contract>``
    bounds its sizes by the rules and refuses where that flag would differ."""
    import torch

    _c, decl = _toy_align()
    scope = _exec_checks(decl)
    check, outputs = scope["check_toy_align"], scope["outputs_toy_align"]
    ids = torch.zeros(2, 3, dtype=torch.int64)
    (slots, routes, counts, has_counts, _, m, own), res = check("toy.align", ids, 4)  # type: ignore[operator]
    assert slots.shape == (10,) and routes.dtype == torch.int32 and res == (slots, routes)
    assert counts.numel() == 0 and has_counts is False and m.numel() == 0 and own is True
    mine = torch.zeros(20, dtype=torch.int32)
    (slots, *_, own), _ = check("toy.align", ids.clone(), 4, None, -1, 0.0, mine)  # type: ignore[operator]
    assert slots is mine and own is False  # the caller's buffer, and fill <= 0: as passed
    with pytest.raises(
        ValueError, match=r"slots has shape \(9,\), expected a vector of at least 10 \(padded\)"
    ):
        check("toy.align", ids, 4, None, -1, 0.0, torch.zeros(9, dtype=torch.int32))  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"slots has stride 2; it must be dense"):
        check("toy.align", ids, 4, None, -1, 0.0, torch.zeros(40, dtype=torch.int32)[::2])  # type: ignore[operator]
    with pytest.raises(TypeError, match=r"routes has dtype float32; expected int32 or int64"):
        check("toy.align", ids, 4, None, -1, 0.0, None, torch.zeros(2, 3))  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"routes rows overlap \(strides \(1, 1\)\)"):
        check(
            "toy.align",
            ids,
            4,
            None,
            -1,
            0.0,
            None,
            torch.zeros(4, dtype=torch.int64).as_strided((2, 3), (1, 1)),
        )  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"map has shape \(3,\), expected \[4\] \(one per expert\)"):
        check("toy.align", ids, 4, torch.zeros(3, dtype=torch.int32))  # type: ignore[operator]
    with pytest.raises(
        ValueError, match=r"counts has shape \(4,\), expected a vector of at least 5 \(n \+ 1\)"
    ):
        check("toy.align", ids, 4, None, -1, 0.0, None, None, torch.zeros(4, dtype=torch.int32))  # type: ignore[operator]
    (*_, counts, has_counts, _, _, _), _ = check(  # type: ignore[operator]
        "toy.align", ids, 4, None, -1, 0.0, None, None, torch.zeros(5, dtype=torch.int32)
    )
    assert counts.shape == (5,) and has_counts is True
    with pytest.raises(ValueError, match=r"fill must be an int32, got 2147483648"):
        check("toy.align", ids, 4, None, 2**31)  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"cap must be finite and >= 0 \(0: off\), got -1.0"):
        check("toy.align", ids, 4, None, -1, -1.0)  # type: ignore[operator]
    with pytest.raises(TypeError, match=r"ids has dtype float32, expected int32"):
        check("toy.align", ids.float(), 4)  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"ids is not contiguous"):
        check("toy.align", ids.t(), 4)  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"2147483651 slots do not fit int32"):
        check("toy.align", ids, 2**31 - 3)  # type: ignore[operator]
    outs, res = outputs(ids, 4, None, 1)  # type: ignore[operator]
    assert outs[0].shape == (10,) and outs[2] is None and res == (outs[0], outs[1])
    for bad in ((ids, 4, None, -1), (ids, 2**31 - 3, None, 1)):  # the flag would differ; past the rules
        with pytest.raises(ValueError, match="not the serving form"):
            outputs(*bad)  # type: ignore[operator]


def test_index_buffers_in_the_cpp_lane() -> None:
    """The lane of that contract: optional inputs taken when given (checked there, the kernel
    getting an empty view otherwise), buffers of at least their length, the op's own of its
    ``alloc_shape``, ``min`` and ``x is None`` of the caller's arguments in C++."""
    from opmux.kernels.ops._contract_cpp import extended_form, render_header

    c, decl = _toy_align()
    assert extended_form(c, decl) is None  # type: ignore[arg-type]
    text = render_header("toy", [decl])  # type: ignore[list-item]
    assert text is not None
    assert (
        "if (!(int_arg(fill_arg, &fill) && fill > -2147483648LL && fill < 2147483648LL)) return refused();"
        in text
    )
    assert "if (!(float_arg(cap_arg, &cap) && cap >= 0.0 && cap < HUGE_VAL)) return refused();" in text
    assert "if (!((*map).size(0) == n)) return refused();" in text
    assert (
        "(*slots).size(0) >= T * k + std::min<int64_t>(n, T * k) && (*slots).size(0) < 2147483648LL" in text
    )
    assert "if (!(rows_apart((*routes)))) return refused();" in text
    assert "empty({T * k + n}, DLDataType{kDLInt, 32, 1}, ids.device())" in text
    assert (
        "kernel(slots_t, routes_t, (counts ? *counts : counts_none.view()), !is_none(counts_arg), ids, "
        "(map ? *map : map_none.view()), is_none(slots_arg) || fill > 0);"
    ) in text
    assert "(!counts || may_share(*slots, *counts, true))" in text


def _heads_decl() -> object:
    from opmux.kernels.ops._decl import declare

    c = Contract(
        "heads",
        (Arg("q", "*T, H, D", dtypes=FLOATS, layout="heads"), Arg("w", "D", like="q", layout="vector")),
        kernel=("q", "w"),
    )
    return declare(
        "toy.heads",
        "(Tensor(a!) q, Tensor w) -> ()",
        contract=c,
        reference=test_heads_layout_views_leading_dims_as_tokens,
        doc="toy",
        native=False,
        triton=False,
    )


def test_heads_layout_views_leading_dims_as_tokens() -> None:
    """``heads``: [*T, H, D] reaches the kernel as [tokens, H, D] (any token and head strides);
    its lane takes the serving [T, H, D] as is, refusing a last stride other than 1."""
    import torch

    from opmux.kernels.ops._contract_cpp import _Lane, lane_form

    decl = _heads_decl()
    check = _exec_checks(decl)["check_heads"]
    q = torch.randn(2, 3, 4, 8)
    (qv, _), _ = check("toy.heads", q, torch.randn(8))  # type: ignore[operator]
    assert qv.shape == (6, 4, 8) and qv.data_ptr() == q.data_ptr()
    qkv = torch.randn(5, 6, 8)[:, 2:4]  # a head slice: token stride 48, head stride 8
    (qv, _), _ = check("toy.heads", qkv, torch.randn(8))  # type: ignore[operator]
    assert qv.stride() == (48, 8, 1)
    with pytest.raises(ValueError, match="non-contiguous last dimension"):
        check("toy.heads", torch.randn(5, 4, 16)[..., ::2], torch.randn(8))  # type: ignore[operator]
    assert lane_form(decl.contract) is None  # type: ignore[attr-defined]
    text = _Lane(decl.contract, decl).render()  # type: ignore[attr-defined]
    assert "if (!(q.ndim() == 3 && is_float(q.dtype()))) return refused();" in text
    assert "if (!(q.size(2) <= 1 || q.stride(2) == 1)) return refused();" in text


def _rope_like() -> object:
    from opmux.kernels.ops._decl import declare

    heads = {
        "layout": "heads",
        "view": "heads",
        "view_args": ("pos", "d"),
        "view_cpp": "heads_view({t}, T, d, &{v})",
    }
    c = Contract(
        "rot",
        (
            Scalar("d", "positive_int"),
            Arg("pos", "*T", dtypes=("int64",), layout="flat"),
            Arg("q", "*T, Hq, d", dtypes=FLOATS, device_of="pos", **heads),  # type: ignore[arg-type]
            Arg("k", "*T, Hk, d", like="q", none_as="q_v[:, :0]", **heads),  # type: ignore[arg-type]
            Arg("c", "P, R", like="q", or_dtypes=("float32",), layout="dense_last"),
            Rule("Hq + Hk <= 8", "{Hq + Hk} heads", device="cuda", name="toy_heads"),
        ),
        kernel=("pos", "q", "k", "c"),
    )
    return declare(
        "toy.rot",
        "(Tensor pos, Tensor(a!) q, Tensor(a!)? k, int d, Tensor c) -> ()",
        contract=c,
        reference=test_escape_hatch_views_stand_ins_and_other_dtypes,
        doc="toy",
        native=False,
        triton=False,
    )


def test_escape_hatch_views_stand_ins_and_other_dtypes() -> None:
    """``view=``: the escape hatch makes the kernel view (rope's heads, [T, H * D] or [T, H, D])
    and binds its dims; ``none_as=``: an optional input's stand-in when None (given in the
    serving form); ``or_dtypes=``: like another or these; ``flat`` inputs reach the kernel as
    their dense [tokens]; the C++ lane states the same through the hatch's counterpart."""
    import torch

    from opmux.kernels.ops._contract_codegen import render_group
    from opmux.kernels.ops._contract_cpp import _ViewLane, view_form

    decl = _rope_like()
    text = render_group([decl])  # type: ignore[list-item]
    text = text.replace("from . import _views", "from opmux.kernels.ops.rope import _views")
    text = text.replace("from .. import _checks", "from opmux.kernels.ops import _checks")
    scope: dict[str, object] = {}
    exec(compile(text.replace("from .._torch import torch", "import torch"), "<toy>", "exec"), scope)
    check = scope["check_rot"]
    pos, c = torch.arange(3), torch.randn(8, 4)
    q, k = torch.randn(3, 2 * 8), torch.randn(3, 1, 8)
    (p, qv, kv, _), _ = check("toy.rot", pos, q, k, 8, c)  # type: ignore[operator]
    assert p is pos and qv.shape == (3, 2, 8) and qv.data_ptr() == q.data_ptr() and kv is k
    (p, qv, kv, _), _ = check("toy.rot", pos.view(1, 3), q.view(1, 3, 16), None, 8, c)  # type: ignore[operator]
    assert p.shape == (3,) and kv.shape == (3, 0, 8)  # no key: no heads
    with pytest.raises(
        TypeError, match=r"c has dtype torch.float16; expected torch.float32 or torch.float32 \(q's\)"
    ):
        check("toy.rot", pos, q, k, 8, c.half())  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"q has shape \(3, 12\); expected positions' shape followed by"):
        check("toy.rot", pos, torch.randn(3, 12), k, 8, c)  # type: ignore[operator]
    with pytest.raises(ValueError, match=r"pos has strides \(2,\); kernels need a dense vector"):
        check("toy.rot", torch.arange(6)[::2], q, k, 8, c)  # type: ignore[operator]
    assert view_form(decl.contract) is None  # type: ignore[attr-defined]
    lane = _ViewLane(decl.contract, decl).render()  # type: ignore[attr-defined]
    assert "if (!(heads_view(q, T, d, &q_h))) return refused();" in lane
    assert "const int64_t Hk = k_h.shape[1];" in lane
    assert "if (!(opt_tensor(k_arg, &k) && k)) return refused();" in lane
    assert "same_dtype(c.dtype(), q.dtype()) || is_dtype(c, kDLFloat, 32)" in lane
    assert "if (!(device_type != kDLCUDA || (Hq + Hk <= 8))) return refused();" in lane
    assert "kernel(pos, q_h.view(), k_h.view(), c);" in lane


def _norm_quant_like(scale_type: str = "Tensor") -> object:
    from opmux.kernels.ops._contract import FP8
    from opmux.kernels.ops._decl import declare

    c = Contract(
        "nq",
        (
            Arg("x", "*T, H", dtypes=FLOATS),
            Arg("r", "=x", like="x"),
            Rule("not _checks.same_address(x, r)", "x and r must be different tensors"),
            Arg("scale", "", dtypes=("float32",), device_of="x", layout="element"),
            Arg("out", "=x", dtypes=FP8, device_of="x", out=True, kernel_dtype="uint8"),
        ),
        kernel=("out", "x", "r", "scale"),
        result="out",
    )
    return declare(
        "toy.nq",
        f"(Tensor x, Tensor(a!) r, {scale_type} scale, Tensor(a!)? out=None) -> Tensor",
        contract=c,
        reference=test_required_element_fp8_output_and_addresses_in_the_cpp_lane,
        doc="toy",
        triton=False,
    )


def test_required_element_fp8_output_and_addresses_in_the_cpp_lane() -> None:
    """A required one-element input's lane form is the float32 [1] the kernel gets (others go to
    Python), an fp8 output reinterpreted as uint8 reaches the kernel as itself (the kernels take
    fp8 bytes), ``same_address`` is lane.h's, and a fresh output is checked against the written
    input before it (the static fp8 norms)."""
    from opmux.kernels.ops._contract_cpp import element_form, extended_form, lane_form, render_header

    decl = _norm_quant_like()
    c = decl.contract  # type: ignore[attr-defined]
    assert lane_form(c) is not None and extended_form(c, decl) is not None  # type: ignore[arg-type]
    assert element_form(c, decl) is None  # type: ignore[arg-type]
    text = render_header("toy", [decl])  # type: ignore[list-item]
    assert text is not None
    assert (
        "if (!(scale.ndim() == 1 && is_dtype(scale, kDLFloat, 32) && same_device(scale, x))) return refused();"
        in text
    )
    assert "if (!(scale.size(0) == 1)) return refused();" in text
    assert "if (!(!same_address(x, r))) return refused();" in text
    assert "if (!(r.size(0) == T && r.size(1) == H)) return refused();" in text
    assert "is_dtype((*out), kDLFloat8_e4m3fn, 8) && same_device((*out), x)" in text
    assert "may_share(*out, r, true)" in text
    assert "kernel(*out, x, r, scale);" in text
    assert "Tensor fresh = empty({T, H}, DLDataType{kDLFloat8_e4m3fn, 8, 1}, x.device());" in text
    optional = _norm_quant_like("Tensor?")  # an optional one: no lane form of its own here
    assert element_form(optional.contract, optional) == "scale's layout element"  # type: ignore[attr-defined, arg-type]
