"""Write an op group's serving lanes in C++ from its contracts (torch-free: it writes text).

A lane (``jit/include/opmux/lane.h``) is the native kernel's own check of the contract for the
op's serving form: when every rule holds it runs the kernel, else it returns None having done
nothing and the Python contract speaks. From each contract this writes, into
``jit/include/opmux/contracts/``:

* ``<group>.h``: one template per contract, ``contract::<name>(device_type, <the op's public
  arguments>, kernel)``, checking the serving form (one leading dim, the declared dtypes,
  shapes, layouts, devices, scalar ranges and rules, the caller's outputs or None) and the
  generic guard the signature implies (a written tensor holds its elements apart and overlaps
  no other argument, except as the very same view of a read one);
* ``<group>_<device>_lanes.inc``: the entries ``<op>_<device>_lane`` of every op declared with
  such a contract, calling the unit's kernel ``<op>_<device>`` (CUDA: with ``enable_pdl``), and
  their exports. The unit includes it after its own namespace closes.

A contract a lane cannot state exactly (a rule over tensor contents, a dtype argument,
reinterpreted tensors) gets no generated lane: ``lane_form`` (and the extended forms'
``extended_form``, ``view_form``, ``element_form``) say why, and such an op has none (the Python
contract then runs).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import replace

from ._contract import ANY, FLOATS, FP8, LITERALS, Arg, Contract, Forms, Rule, When
from ._decl import Decl

__all__ = ["element_form", "lane_form", "render_entries", "render_header"]

_DL = {
    "float32": "kDLFloat, 32",
    "float16": "kDLFloat, 16",
    "bfloat16": "kDLBfloat, 16",
    "float8_e4m3fn": "kDLFloat8_e4m3fn, 8",
    "int32": "kDLInt, 32",
    "int64": "kDLInt, 64",
    "int8": "kDLInt, 8",
    "uint8": "kDLUInt, 8",
}
_SCALAR = {
    "bool": ("bool", "bool_arg"),
    "positive": ("double", "positive_float"),
    "finite": ("double", "finite_float"),
}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
#: ``x is None`` / ``x is not None`` of an argument: what a rule may ask of a tensor in C++
_IS_NONE = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*) is (not )?None\b")
#: ``_checks.same_address(a, b)`` of two tensors: lane.h's ``same_address`` (``element_form``)
_SAME_ADDRESS = re.compile(r"\b_checks\.same_address\((\w+), (\w+)\)")
#: the layouts a lane checks, and their C++ predicates (opmux/lane.h; {t}: the tensor, {k}: where
#: its trailing E... dims start)
_LANE_LAYOUTS = {
    "rows": "",
    "matrix": "",
    "vector": "",
    "dense_last": "dense_last({t})",
    "contiguous": "contiguous({t})",
    "entries": "dense_from({t}, {k})",
    "paged": "dense_blocks({t})",
    "heads": "{t}.size({k}) <= 1 || {t}.stride({k}) == 1",  # [T, H, D] as is: a unit last stride
}
_LANE_LAYOUTS["rows_apart"] = "rows_apart({t})"


def lane_form(c: Contract | Forms) -> str | None:
    """None when the contract's serving form (a Forms: its default) can be checked in C++
    exactly, else why not."""
    if isinstance(c, Forms):
        return lane_form(c.default)
    for s in c.scalars:
        if s.kind not in _SCALAR:
            return f"scalar {s.name} of kind {s.kind}"
    for a in c.tensors:
        if a.layout not in _LANE_LAYOUTS:
            return f"{a.name}'s layout {a.layout}"
        if a.kernel_dtype or a.dtype_from:
            return f"{a.name} is reinterpreted or takes its dtype from an argument"
        if a.any_device:
            return f"{a.name} may be on another device"
        if a.dtypes != ANY and any(d not in _DL for d in a.dtypes):
            return f"{a.name}'s dtypes {a.dtypes}"
    symbols = {d.lstrip("*") for a in c.tensors for d in c.dims_of(a) if d.lstrip("*").isidentifier()}
    for r in c.rules:
        names = set(_NAME.findall(_IS_NONE.sub("", r.expr))) - {"and", "or", "not", "cdiv"}
        if not names <= symbols or "." in r.expr:
            return f"rule {r.expr!r} reads more than shapes"
    return None


#: a chained comparison of simple operands (``0 <= k <= V``): C++ would compare a bool with ``V``
_CHAIN = re.compile(r"([\w.]+) (<=|<|>=|>) ([\w.]+) (<=|<|>=|>) ([\w.]+)")


def _cpp_expr(expr: str) -> str:
    expr = _CHAIN.sub(r"(\1 \2 \3 and \3 \4 \5)", expr)
    out = _IS_NONE.sub(lambda m: f"{'!' if m.group(2) else ''}is_none({m.group(1)}_arg)", expr)
    out = _SAME_ADDRESS.sub(r"same_address(\1, \2)", out)
    out = re.sub(r"\b(\d+)\*\*(\d+)\b", lambda m: f"{int(m.group(1)) ** int(m.group(2))}LL", out)
    out = re.sub(r"\bprod\((\w+)\)", r"\1", out)  # the serving form's batch is one dim
    out = re.sub(r"\bmax\(", "std::max<int64_t>(", out)
    out = re.sub(r"\bmin\(", "std::min<int64_t>(", out)
    out = re.sub(r"\bnot\s+", "!", out)
    out = re.sub(r"\band\b", "&&", out)
    out = re.sub(r"\bor\b", "||", out)
    return out.replace("//", "/")


def _dims(c: Contract, a: Arg) -> tuple[str, ...]:
    """The serving form's dims: ``*T`` is one dim."""
    return tuple(d.lstrip("*") for d in c.dims_of(a))


def _lane_params(decl: Decl) -> list[tuple[str, str]]:
    """(C++ type, name) of a lane's parameters: tensors as views, optional ones (None or a
    tensor) and scalars as AnyView ``<name>_arg``."""
    return [
        ("const TensorView&", p.name) if p.type == "Tensor" else ("const AnyView&", f"{p.name}_arg")
        for p in decl.params
    ]


def _tail(dims: tuple[str, ...]) -> str:
    return dims[-1][:-3] if dims and dims[-1].endswith("...") else ""


class _Lane:
    def __init__(self, c: Contract, decl: Decl) -> None:
        self.c, self.decl = c, decl
        self.lines: list[str] = []
        #: the symbols of trailing E... dims: (the tensor, where they start)
        self.tails: dict[str, tuple[str, int]] = {}
        #: the optional tensors (``Tensor?``) the contract declares as inputs: ``(*name)`` here
        self.opt = {
            p.name
            for p in decl.params
            if p.type == "Tensor?" and any(a.name == p.name and not a.out for a in c.tensors)
        }

    def ref(self, name: str) -> str:
        """A tensor argument as C++ names it."""
        return f"(*{name})" if name in self.opt else name

    def emit(self, text: str, depth: int = 1) -> None:
        self.lines.append("  " * depth + text)

    def refuse_unless(self, cond: str, depth: int = 1) -> None:
        self.emit(f"if (!({cond})) return refused();", depth)

    def render(self) -> str:
        c, params = self.c, self.decl.params
        tensors = {a.name: a for a in c.tensors}
        args = [f"{t} {n}" for t, n in _lane_params(self.decl)]
        head = f"template <typename Kernel>\ninline Any {c.name}(int32_t device_type, {', '.join(args)}, Kernel&& kernel) {{"
        self.lines = [
            f"// {c.name}: {self.decl.name}'s contract (ops/{self.decl.name.partition('.')[0]}/op.py)",
            head,
        ]
        for s in c.scalars:
            ctype, reader = _SCALAR[s.kind]
            self.emit(f"{ctype} {s.name};")
            self.refuse_unless(f"{reader}({s.name}_arg, &{s.name})")
        for p in params:  # optional inputs: the declared ones given, the others None
            if p.type != "Tensor?" or (p.name in tensors and tensors[p.name].out):
                continue
            if p.name in self.opt:
                self.emit(f"std::optional<TensorView> {p.name};")
                self.refuse_unless(f"opt_tensor({p.name}_arg, &{p.name}) && {p.name}")
            else:
                self.refuse_unless(f"is_none({p.name}_arg)")
        outs = [a for a in c.tensors if a.out]
        for a in outs:
            self.emit(f"std::optional<TensorView> {a.name};")
            self.refuse_unless(f"opt_tensor({a.name}_arg, &{a.name})")
        bound: dict[str, str] = {}
        for a in c.tensors:
            if a.out:
                continue
            self.check_input(a, bound)
        for r in c.rules:
            cond = _cpp_expr(r.expr)
            if r.device:
                dev = {"cuda": "kDLCUDA", "cpu": "kDLCPU"}[r.device]
                cond = f"device_type != {dev} || ({cond})"
            self.refuse_unless(cond)
        for a in outs:
            self.emit(f"if ({a.name}) {{")
            self.check_tensor(a, bound, f"(*{a.name})", depth=2)
            self.emit("}")
        self.guard(outs)
        if c.values_cpp:  # the values hook's counterpart: refuses what Python's would raise on
            self.refuse_unless(c.values_cpp)
        self.call(outs)
        self.lines.append("}")
        return "\n".join(self.lines) + "\n"

    #: whether the first input's device was checked (the others are checked against it)
    device_checked = False

    def check_input(self, a: Arg, bound: dict[str, str]) -> None:
        first = not self.device_checked
        self.check_tensor(a, bound, self.ref(a.name), depth=1)
        if first:
            self.refuse_unless(f"{self.ref(a.name)}.device().device_type == device_type")
            self.device_checked = True

    def type_conds(self, a: Arg, t: str) -> list[str]:
        """The C++ conditions of ``a``'s dtype rule and device agreement, on the view ``t``."""
        conds = []
        if a.dtypes == ANY:
            conds.append(f"byte_dtype({t})")
        elif a.dtypes == FLOATS:
            conds.append(f"is_float({t}.dtype())")
        elif a.dtypes:
            conds.append(" || ".join(f"is_dtype({t}, {_DL[d]})" for d in a.dtypes))
        if a.like:
            conds.append(f"same_dtype({t}.dtype(), {self.ref(a.like)}.dtype())")
        ref = a.like or a.device_of
        if ref:
            conds.append(f"same_device({t}, {self.ref(ref)})")
        return conds

    def check_tensor(self, a: Arg, bound: dict[str, str], t: str, depth: int) -> None:
        dims = _dims(self.c, a)
        tail = _tail(dims)
        conds = [f"{t}.ndim() {'>=' if tail else '=='} {len(dims)}", *self.type_conds(a, t)]
        self.refuse_unless(" && ".join(f"({x})" if "||" in x else x for x in conds), depth)
        sizes = []
        for i, d in enumerate(dims):
            if d.endswith("..."):  # trailing dims: those of their first tensor
                if d[:-3] in self.tails:
                    other, j = self.tails[d[:-3]]
                    sizes.append(f"same_tail({t}, {i}, {other}, {j})")
                else:
                    self.tails[d[:-3]] = (t, i)
            elif d.isidentifier() and d not in bound:
                bound[d] = f"{t}.size({i})"
                self.emit(f"const int64_t {d} = {t}.size({i});", depth)
            elif a.at_least:  # a buffer of at least that many elements, indexed in int32
                sizes.append(f"{t}.size(0) >= {_cpp_expr(d)} && {t}.size(0) < 2147483648LL")
            else:
                sizes.append(f"{t}.size({i}) == {_cpp_expr(d)}")
        if sizes:
            self.refuse_unless(" && ".join(sizes), depth)
        n = len(dims)
        if a.layout in ("rows", "matrix") and n:
            self.refuse_unless(f"{t}.size({n - 1}) <= 1 || {t}.stride({n - 1}) == 1", depth)
        elif a.layout == "vector":
            self.refuse_unless(f"{t}.size(0) <= 1 || {t}.stride(0) == 1", depth)
        elif _LANE_LAYOUTS[a.layout]:
            self.refuse_unless(_LANE_LAYOUTS[a.layout].format(t=t, k=n - 1), depth)

    def guard(self, outs: list[Arg]) -> None:
        """The generic guard of the signature's written tensors (fused_op's, for the serving form)."""
        declared = {a.name for a in self.c.tensors}
        params = [p for p in self.decl.params if p.is_tensor and p.name in declared]  # the others are None
        fresh = {a.name for a in outs}
        written = [p for p in params if p.written]
        for i, w in enumerate(written):
            present = f"{w.name} && " if w.name in fresh else ""
            wt = f"*{w.name}" if w.name in fresh else self.ref(w.name)
            conds = [f"distinct({wt})"]
            for o in params:
                if o.name == w.name or (o.written and written.index(o) < i and w.name not in fresh):
                    continue  # (a fresh w: its pair with an earlier written o was left to here)
                if o.name in fresh:
                    continue  # two optional outputs: never both fresh and shared (none has two)
                conds.append(f"may_share({wt}, {self.ref(o.name)}, {'true' if o.written else 'false'})")
            cond = " && ".join(conds)
            if present:
                self.emit(f"if ({w.name} && !({cond})) return refused();")
            else:
                self.refuse_unless(cond)

    def call(self, outs: list[Arg]) -> None:
        kargs = []
        for k in self.c.kernel:
            kargs.append(k.lower() if k in LITERALS else f"*{k}" if k in self.opt else k)
        if not outs:
            self.emit(f"kernel({', '.join(kargs)});")
            self.emit("return ran();")
            return
        (o,) = outs  # one optional output (the contracts lanes take have at most one)
        self.emit(f"if ({o.name}) {{")
        self.emit(f"kernel({', '.join(f'*{k}' if k == o.name else k for k in kargs)});", 2)
        self.emit("return ran();", 2)
        self.emit("}")
        if o.same_as:
            ref = o.same_as
            dims = _dims(self.c, next(a for a in self.c.tensors if a.name == ref))
            # torch.empty_like(x) is dense [T, H] only for an x of strides (H, 1): others are Python's
            self.refuse_unless(
                f"{ref}.stride(0) == {ref}.size(1) && ({ref}.size(1) <= 1 || {ref}.stride(1) == 1)"
            )
        else:
            dims = _dims(self.c, o)
        dtype = f"{o.like}.dtype()" if o.like else f"DLDataType{{{_DL[o.dtypes[0]]}, 1}}"
        dev = o.like or o.device_of or next(a.name for a in self.c.tensors if not a.out)
        shape = ", ".join(_cpp_expr(d) for d in dims)
        self.emit(f"Tensor fresh = empty({{{shape}}}, {dtype}, {dev}.device());")
        self.emit(f"kernel({', '.join('TensorView(fresh)' if k == o.name else k for k in kargs)});")
        self.emit("return fresh;")


def _when_cpp(w: When) -> str:
    if w.given:
        return f"!is_none({w.arg}_arg)"
    if w.ndim >= 0:
        return f"{w.arg}.ndim() == {w.ndim}"
    return f"is_dtype({w.arg}, {_DL[w.dtype]})"


def _render_forms(f: Forms, decl: Decl) -> str:
    """The lane of an op with several forms: the form of the call picked as in Python, run
    through its own lane, or refused where that form has none (the Python contract runs)."""
    params = _lane_params(decl)
    names = ", ".join(n for _, n in params)
    lines = [
        f"// {f.name}: {decl.name}'s forms (ops/{decl.name.partition('.')[0]}): the call's, by its lane",
        "template <typename Kernel>",
        f"inline Any {f.name}(int32_t device_type, {', '.join(f'{t} {n}' for t, n in params)}, Kernel&& kernel) {{",
    ]
    for when, c in f.cases:
        cond = " && ".join(_when_cpp(w) for w in when)
        why = lane_form(c)
        run = "refused()" if why else f"{c.name}(device_type, {names}, kernel)"
        lines.append(f"  if ({cond}) return {run};{f'  // no lane: {why}' if why else ''}")
    lines.append(f"  return {f.default.name}(device_type, {names}, kernel);")
    return "\n".join([*lines, "}"]) + "\n"


def _lane_decls(decls: Iterable[Decl]) -> list[Decl]:
    return [
        d
        for d in decls
        if d.contract is not None
        and any(b.name in ("aot", "jit") for b in d.spec.backends)  # only native ops have lanes
        and (
            lane_form(d.contract) is None
            or extended_form(d.contract.default if isinstance(d.contract, Forms) else d.contract, d) is None
            or view_form(d.contract) is None
            or (isinstance(d.contract, Contract) and element_form(d.contract, d) is None)
        )
    ]


def _values_guard(d: Decl, c: Contract) -> None:
    """A lane of an op with a ``values=`` hook must carry the hook's C++ counterpart: without one
    the lane would run the kernel on contents (indices) that Python refuses."""
    if d.values is not None and not c.values_cpp:
        raise ValueError(
            f"{d.name}: contract {c.name!r} has a C++ lane but no values_cpp, while the op declares "
            f"values={getattr(d.values, '__name__', d.values)!r}: state the hook's C++ counterpart "
            "(it may refuse what Python accepts, never accept what it refuses)"
        )


def _render_lane(d: Decl) -> str:
    assert d.contract is not None
    if isinstance(d.contract, Contract):
        _values_guard(d, d.contract)
    if isinstance(d.contract, Contract) and view_form(d.contract) is None:
        return _ViewLane(d.contract, d).render()
    if lane_form(d.contract) is None:
        assert isinstance(d.contract, Contract)  # (a Forms has no single-contract lane)
        return _Lane(d.contract, d).render()
    assert isinstance(d.contract, Contract)  # (a Forms is lane_form's)
    if extended_form(d.contract, d) is not None:
        return _Lane(_lane_contract(d.contract, d), d).render()  # element_form holds
    return _ExtLane(d.contract, d).render()


def render_header(group: str, decls: Iterable[Decl]) -> str | None:
    """``contracts/<group>.h``, or None when no contract of the group has a C++ lane."""
    found = _lane_decls(decls)
    if not found:
        return None
    seen: dict[str, str] = {}
    headers: list[str] = []
    for d in found:
        assert d.contract is not None
        forms = d.contract.contracts if isinstance(d.contract, Forms) else (d.contract,)
        for c in forms:
            if c.name in seen:
                pass
            elif c is d.contract:
                seen[c.name] = _render_lane(d)
            elif lane_form(c) is None:
                _values_guard(d, c)
                seen[c.name] = _Lane(c, d).render()
            if c.values_header and c.values_header not in headers:
                headers.append(c.values_header)
        if isinstance(d.contract, Forms):
            seen.setdefault(d.contract.name, _render_forms(d.contract, d))
    includes = "".join(f'#include "{h}"\n' for h in ["opmux/lane.h", *headers])
    rules = _native_rules(
        c
        for d in found
        if d.contract is not None
        for c in (d.contract.contracts if isinstance(d.contract, Forms) else (d.contract,))
    )
    return (
        f"// Generated by tools/gen_contracts.py from ops/{group}/op.py's contracts: do not edit.\n"
        "// The serving lanes' checks (opmux/lane.h): each runs `kernel` on the caller's tensors or a\n"
        "// fresh output when the call is in the contract's serving form, else refuses (None).\n"
        f"#pragma once\n\n{includes}\nnamespace opmux {{\nnamespace lane {{\nnamespace contract {{\n\n"
        + "\n".join([*seen.values(), *rules])
        + "\n}  // namespace contract\n}  // namespace lane\n}  // namespace opmux\n"
    )


def render_entries(group: str, device: str, decls: Iterable[Decl]) -> str | None:
    """``contracts/<group>_<device>_lanes.inc``: the lane entries and their exports."""
    found = _lane_decls(decls)
    if not found:
        return None
    unit = f"{group}_{device}"
    pdl = device == "cuda"
    dev = "kDLCUDA" if pdl else "kDLCPU"
    lines = [
        f"// Generated by tools/gen_contracts.py from ops/{group}/op.py's contracts: do not edit.",
        f"// The serving lanes of {unit} (included by jit/csrc/{unit}.{'cu' if pdl else 'cpp'} after its namespace).",
        "",
        "namespace opmux {",
        f"namespace {unit} {{",
        "",
    ]
    exports = []
    for d in found:
        c = d.contract
        assert c is not None
        params = []
        names = []
        for p in d.params:
            params.append(f"{'TensorView' if p.type == 'Tensor' else 'lane::AnyView'} {p.name}")
            names.append(p.name)
        if pdl:
            params.append("bool enable_pdl")
        name = f"{d.short_name}_{device}"
        tail = ", enable_pdl" if pdl else ""
        cap = "[&]" if pdl else "[]"
        lines.append(f"lane::Any {name}_lane({', '.join(params)}) {{")
        lines.append(
            f"  return lane::contract::{c.name}({dev}, {', '.join(names)}, "
            f"{cap}(auto&&... a) {{ {name}(a...{tail}); }});"
        )
        lines.append("}")
        exports.append(f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}_lane, opmux::{unit}::{name}_lane);")
    lines += ["", f"}}  // namespace {unit}", "}  // namespace opmux", "", *exports, ""]
    return "\n".join(lines)


# -- the forms the quantization ops added: several outputs, optional inputs, flat / scales / blocks
_INT = {"positive_int": ("int64_t", "int_arg")}
#: the scalar kinds the moe ops added: their lane's reading and range
_MOE_SCALARS = {
    "int32": ("int64_t", "int_arg({v}_arg, &{v}) && {v} > -2147483648LL && {v} < 2147483648LL"),
    "off_or_positive": ("double", "float_arg({v}_arg, &{v}) && {v} >= 0.0 && {v} < HUGE_VAL"),
}


def _optional_input(decl: Decl, a: Arg) -> bool:
    p = next((p for p in decl.params if p.name == a.name), None)
    required = isinstance(decl.contract, Contract) and decl.contract.required(a.name)
    return not a.out and p is not None and p.type == "Tensor?" and not required


def extended_form(c: Contract, decl: Decl) -> str | None:
    """None when ``_ExtLane`` can check the contract's serving form exactly, else why not."""
    for s in c.scalars:
        if s.kind not in _SCALAR and s.kind not in _INT and s.kind not in _MOE_SCALARS:
            return f"scalar {s.name} of kind {s.kind}"
    for a in c.tensors:
        if a.layout in ("rows_apart", "contiguous"):
            continue
        if a.layout == "element" and not _optional_input(decl, a):
            return f"{a.name}: a required one-element tensor"
        if a.layout not in ("rows", "matrix", "vector", "flat", "scales", "blocks", "element"):
            return f"{a.name}'s layout {a.layout}"
        if a.dtype_from or a.same_as or (a.kernel_dtype and a.dtypes != ("float8_e4m3fn",)):
            return f"{a.name} takes its dtype or shape from another argument, or is reinterpreted"
        if any(d not in _DL for d in a.dtypes):
            return f"{a.name}'s dtypes {a.dtypes}"
    names = {d.lstrip("*") for a in c.tensors for d in c.dims_of(a) if d.lstrip("*").isidentifier()}
    names |= {s.name for s in c.scalars} | {"and", "or", "not", "cdiv", "prod", "max"}
    for expr in (*(r.expr for r in c.rules), *(k for k in c.kernel if not k.isidentifier())):
        if not set(_NAME.findall(_IS_NONE.sub("", expr))) <= names or "." in expr:
            return f"{expr!r} reads more than shapes and scalars"
    return None


class _ExtLane(_Lane):
    """A lane for the extended forms: the serving form has its optional inputs absent (the
    kernel gets empty views), outputs the caller's or allocated here (dense; a flag that would
    allocate one another way refuses), and returns ``ran_all`` of the fresh ones."""

    def render(self) -> str:
        c, d = self.c, self.decl
        tensors = {a.name: a for a in c.tensors}
        args = [
            f"const TensorView& {p.name}"
            if p.name in tensors and p.type != "Tensor?"
            else f"const AnyView& {p.name}_arg"
            for p in d.params
        ]
        self.lines = [
            f"// {c.name}: {d.name}'s contract (ops/{d.name.partition('.')[0]}/op.py)",
            f"template <typename Kernel>\ninline Any {c.name}(int32_t device_type, {', '.join(args)}, Kernel&& kernel) {{",
        ]
        for s in c.scalars:
            if s.kind in _MOE_SCALARS:
                ctype, reads = _MOE_SCALARS[s.kind]
                self.emit(f"{ctype} {s.name};")
                self.refuse_unless(reads.format(v=s.name))
            elif s.kind in _INT:
                self.emit(f"int64_t {s.name};")
                self.refuse_unless(f"int_arg({s.name}_arg, &{s.name}) && {s.name} > 0")
            else:
                ctype, reader = _SCALAR[s.kind]
                self.emit(f"{ctype} {s.name};")
                self.refuse_unless(f"{reader}({s.name}_arg, &{s.name})")
        outs = c.outputs
        given = self.given_inputs()
        for a in c.tensors:
            if a.name in given:  # taken when given (checked after the rules)
                self.emit(f"std::optional<TensorView> {a.name};")
                self.refuse_unless(f"opt_tensor({a.name}_arg, &{a.name})")
            elif _optional_input(d, a):  # the serving form: absent
                self.refuse_unless(f"{a.name}_arg.type_index() == TypeIndex::kTVMFFINone")
        for a in outs:
            self.emit(f"std::optional<TensorView> {a.name};")
            self.refuse_unless(f"opt_tensor({a.name}_arg, &{a.name})")
        ints = (*_INT, "int32")  # a shape may name an int scalar
        bound: dict[str, str] = {s.name: s.name for s in c.scalars if s.kind in ints}
        first = next(a.name for a in c.tensors if not a.out and not _optional_input(d, a))
        for a in c.tensors:
            if a.out or _optional_input(d, a):
                continue
            if a.layout == "blocks":
                self.blocks(a, bound)
            else:
                self.check_input(a, bound)
        for r in c.rules:
            cond = _cpp_expr(r.expr)
            if r.device:
                cond = f"device_type != {_DEVICE[r.device]} || ({cond})"
            self.refuse_unless(cond)
        for a in c.tensors:
            if a.name in given:
                self.emit(f"if ({a.name}) {{")
                self.check_tensor(a, bound, f"(*{a.name})", depth=2)
                self.emit("}")
        for a in outs:
            self.emit(f"if ({a.name}) {{")
            self.check_output(a, bound)
            self.emit("}")
            for flag, _ in a.alloc:  # allocated another way: Python's
                self.emit(f"if (!{a.name} && {flag}) return refused();")
        self.guard_all(outs)
        if c.values_cpp:  # the values hook's counterpart, before anything is written
            self.refuse_unless(c.values_cpp)
        self.call_all(outs, first)
        self.lines.append("}")
        return "\n".join(self.lines) + "\n"

    def blocks(self, a: Arg, bound: dict[str, str]) -> None:
        """``[Gm, Gn]`` as is, or one element as its [1, 1] block."""
        gm, gn = _dims(self.c, a)
        n = a.name
        ref = a.like or a.device_of
        conds = [" || ".join(f"is_dtype({n}, {_DL[t]})" for t in a.dtypes)] + (
            [f"same_device({n}, {ref})"] if ref else []
        )
        self.refuse_unless(" && ".join(f"({x})" for x in conds))
        self.refuse_unless(f"{n}.ndim() == 2 || ({n}.ndim() <= 1 && {n}.numel() == 1)")
        self.emit(f"const int64_t {gm} = {n}.ndim() == 2 ? {n}.size(0) : 1;")
        self.emit(f"const int64_t {gn} = {n}.ndim() == 2 ? {n}.size(1) : 1;")
        self.emit(f"View {n}_block = View::block({n});")
        self.emit(f"const TensorView {n}_k = {n}.ndim() == 2 ? {n} : {n}_block.view();")
        bound[gm], bound[gn] = gm, gn

    def given_inputs(self) -> set[str]:
        """The optional inputs a ``lane_optional`` contract takes when given."""
        if not self.c.lane_optional:
            return set()
        return {a.name for a in self.c.tensors if _optional_input(self.decl, a)}

    def check_output(self, a: Arg, bound: dict[str, str]) -> None:
        t = f"(*{a.name})"
        if a.layout in ("rows", "matrix", "vector", "rows_apart"):
            self.check_tensor(a, bound, t, depth=2)
            return
        dims = _dims(self.c, a)
        conds = [" || ".join(f"is_dtype({t}, {_DL[x]})" for x in a.dtypes)]
        ref = a.like or a.device_of
        if ref:
            conds.append(f"same_device({t}, {ref})")
        if a.layout == "flat":
            conds.append(f"flat_dense({t}, {' * '.join(_cpp_expr(x) for x in dims)})")
        else:  # scales: the [rows, C] view itself, each element at its own address
            conds.append(
                f"{t}.ndim() == 2 && {t}.size(0) == {_cpp_expr(dims[0])} && {t}.size(1) == {_cpp_expr(dims[1])}"
            )
            conds.append(f"distinct({t})")
        self.refuse_unless(" && ".join(f"({x})" if "||" in x else x for x in conds), 2)

    def guard_all(self, outs: tuple[Arg, ...]) -> None:
        """The generic guard: each written tensor holds its elements apart and overlaps no other
        argument (an output the caller gave: checked when given)."""
        d = self.decl
        fresh = {a.name for a in outs} | self.given_inputs()  # (std::optional views)
        absent = {a.name for a in self.c.tensors if _optional_input(d, a)} - fresh
        params = [p for p in d.params if p.is_tensor and p.name not in absent]
        written = [p for p in params if p.written]
        for i, w in enumerate(written):
            wt = f"*{w.name}" if w.name in fresh else w.name
            conds = [f"distinct({wt})"]
            for o in params:
                if o.name == w.name or (o.written and written.index(o) < i):
                    continue
                ot = f"*{o.name}" if o.name in fresh else o.name
                share = f"may_share({wt}, {ot}, {'true' if o.written else 'false'})"
                conds.append(f"(!{o.name} || {share})" if o.name in fresh else share)
            cond = " && ".join(conds)
            self.emit(
                f"if ({w.name} && !({cond})) return refused();"
                if w.name in fresh
                else f"if (!({cond})) return refused();"
            )

    def call_all(self, outs: tuple[Arg, ...], first: str) -> None:
        """Allocate the outputs the caller left out, run the kernel on the contract's views."""
        views: dict[str, str] = {}
        for a in outs:
            dims = [_cpp_expr(x) for x in (a.alloc_shape,) if x] or [_cpp_expr(x) for x in _dims(self.c, a)]
            dtype = f"{a.like}.dtype()" if a.like else f"DLDataType{{{_DL[a.dtypes[0]]}, 1}}"
            dev = a.like or a.device_of or first
            self.emit(
                f"Tensor {a.name}_fresh = {a.name} ? Tensor() : empty({{{', '.join(dims)}}}, {dtype}, {dev}.device());"
            )
            self.emit(f"const TensorView {a.name}_t = {a.name} ? *{a.name} : TensorView({a.name}_fresh);")
            views[a.name] = f"{a.name}_t"
            if a.layout == "flat":
                self.emit(f"View {a.name}_flat = View::flat({a.name}_t, {' * '.join(dims)});")
                views[a.name] = f"{a.name}_flat.view()"
        for a in self.c.tensors:
            if _optional_input(self.decl, a):
                self.emit(
                    f"View {a.name}_none = View::empty({first}.device(), DLDataType{{{_DL[a.dtypes[0]]}, 1}});"
                )
                views[a.name] = f"{a.name}_none.view()"
                if a.name in self.given_inputs():
                    views[a.name] = f"({a.name} ? *{a.name} : {a.name}_none.view())"
            elif a.layout == "blocks":
                views[a.name] = f"{a.name}_k"
        kargs = [views.get(k, k) if k.isidentifier() else _cpp_expr(k) for k in self.c.kernel]
        self.emit(f"kernel({', '.join(kargs)});")
        if len(outs) == 1:
            o = outs[0].name
            self.emit(f"if ({o}) return ran();")
            self.emit(f"return {o}_fresh;")
        else:
            self.emit(f"return ran_all({{{', '.join(f'&{a.name}_fresh' for a in outs)}}});")


_DEVICE = {"cuda": "kDLCUDA", "cpu": "kDLCPU"}


def _native_rules(contracts: Iterable[Contract]) -> list[str]:
    """``rule_<name>(op, <the values it reads>)`` of each named rule: a native entry point states
    the contract's limit (a direct call, the rule's own words; ValueError)."""
    out: dict[str, str] = {}
    for c in contracts:
        for r in c.rules:
            if not r.name or r.name in out:
                continue
            parts = re.split(r"\{([^{}]*)\}", r.message)
            said = " ".join(parts[1::2])  # the placeholders
            reads = sorted(
                set(_NAME.findall(f"{r.expr} {said}")) - {"and", "or", "not", "cdiv", "prod", "max"}
            )
            text = " << ".join(
                f'"{p}"' if i % 2 == 0 else _cpp_expr(p) for i, p in enumerate(parts) if p or i % 2
            )
            params = ", ".join(f"int64_t {n}" for n in reads)
            out[r.name] = (
                f"// {r.message}{f' ({r.device} only)' if r.device else ''}\n"
                f"inline void rule_{r.name}(const char* op, {params}) {{\n"
                f'  if (!({_cpp_expr(r.expr)})) TVM_FFI_THROW(ValueError) << op << ": " << {text};\n'
                "}\n"
            )
    return list(out.values())


# -- the escape hatch's views (``Arg.view``: rope's heads) and flat inputs -------------------------
def view_form(c: Contract | Forms) -> str | None:
    """None when ``_ViewLane`` can check the contract's serving form exactly (inputs only, some
    viewed through the escape hatch's C++ counterpart), else why not."""
    if isinstance(c, Forms) or not any(a.view for a in c.tensors):
        return "no escape hatch view"
    for s in c.scalars:
        if s.kind not in _SCALAR and s.kind not in _INT:
            return f"scalar {s.name} of kind {s.kind}"
    for a in c.tensors:
        if a.out or a.kernel_dtype or a.dtype_from or a.any_device or a.same_as:
            return f"{a.name}: an output, reinterpreted or shaped by another"
        if a.view and not a.view_cpp:
            return f"{a.name}'s view has no C++ counterpart"
        if not a.view and a.layout not in _LANE_LAYOUTS and a.layout != "flat":
            return f"{a.name}'s layout {a.layout}"
        if any(d not in _DL for d in (*a.dtypes, *a.or_dtypes)):
            return f"{a.name}'s dtypes {a.dtypes}"
    names = {d.lstrip("*") for a in c.tensors for d in c.dims_of(a) if d.lstrip("*").isidentifier()}
    names |= {s.name for s in c.scalars} | {"and", "or", "not", "cdiv", "prod", "max"}
    for r in c.rules:
        if not set(_NAME.findall(r.expr)) <= names or "." in r.expr:
            return f"rule {r.expr!r} reads more than shapes and scalars"
    return None


class _ViewLane(_Lane):
    """A lane whose serving form has tensors viewed by the escape hatch's C++ counterpart (a
    ``HeadsView``; it may only refuse), int scalars, and ``flat`` inputs as dense [T] vectors."""

    def render(self) -> str:
        c, d = self.c, self.decl
        args = [f"{t} {n}" for t, n in _lane_params(d)]
        self.lines = [
            f"// {c.name}: {d.name}'s contract (ops/{d.name.partition('.')[0]}/op.py)",
            f"template <typename Kernel>\ninline Any {c.name}(int32_t device_type, {', '.join(args)}, Kernel&& kernel) {{",
        ]
        for sc in c.scalars:
            ctype, reader = _SCALAR.get(sc.kind) or _INT[sc.kind]
            self.emit(f"{ctype} {sc.name};")
            self.refuse_unless(
                f"{reader}({sc.name}_arg, &{sc.name})"
                + (" && " + sc.name + " > 0" if sc.kind in _INT else "")
            )
        for name in sorted(self.opt):  # the serving form has them given
            self.emit(f"std::optional<TensorView> {name};")
            self.refuse_unless(f"opt_tensor({name}_arg, &{name}) && {name}")
        bound: dict[str, str] = {}
        for a in c.tensors:
            if a.view:
                self.heads(a, bound)
            else:
                self.check_input(replace(a, layout="vector") if a.layout == "flat" else a, bound)
        for r in c.rules:
            cond = _cpp_expr(r.expr)
            if r.device:
                cond = f"device_type != {_DEVICE[r.device]} || ({cond})"
            self.refuse_unless(cond)
        self.guard([])
        if c.values_cpp:  # the values hook's counterpart: refuses what Python's would raise on
            self.refuse_unless(c.values_cpp)
        views = {a.name: f"{a.name}_h.view()" for a in c.tensors if a.view}
        kargs = [
            k.lower() if k in LITERALS else views.get(k, self.ref(k) if k.isidentifier() else _cpp_expr(k))
            for k in c.kernel
        ]
        self.emit(f"kernel({', '.join(kargs)});")
        self.emit("return ran();")
        self.lines.append("}")
        return "\n".join(self.lines) + "\n"

    def heads(self, a: Arg, bound: dict[str, str]) -> None:
        """The tensor's dtype and device, then its view by the escape hatch's counterpart; the
        view's dims that name a new symbol are bound from it."""
        t = self.ref(a.name)
        conds = self.type_conds(a, t)
        if conds:
            self.refuse_unless(" && ".join(f"({x})" if "||" in x else x for x in conds))
        self.emit(f"HeadsView {a.name}_h;")
        self.refuse_unless(a.view_cpp.format(t=t, v=f"{a.name}_h"))
        scalars = {sc.name for sc in self.c.scalars}
        for i, dim in enumerate(_dims(self.c, a)):
            if dim.isidentifier() and dim not in bound and dim not in scalars:
                bound[dim] = f"{a.name}_h.shape[{i}]"
                self.emit(f"const int64_t {dim} = {a.name}_h.shape[{i}];")

    def check_tensor(self, a: Arg, bound: dict[str, str], t: str, depth: int) -> None:
        if not a.or_dtypes:
            super().check_tensor(a, bound, t, depth)
            return
        # like= or other dtypes: the dtype stated here, the rest as usual
        ok = " || ".join(
            [
                f"same_dtype({t}.dtype(), {self.ref(a.like)}.dtype())",
                *(f"is_dtype({t}, {_DL[x]})" for x in a.or_dtypes),
            ]
        )
        self.refuse_unless(ok, depth)
        super().check_tensor(replace(a, like="", device_of=a.like, dtypes=ANY), bound, t, depth)


# -- required one-element inputs, fp8 outputs and distinct addresses (the static fp8 norms) -------
def _lane_contract(c: Contract, decl: Decl) -> Contract:
    """The contract's serving form as ``_Lane`` states it: a required one-element input (a
    ``Tensor`` parameter) as the [1] vector the kernel gets (its other shapes: Python's), and an
    fp8 output reinterpreted as uint8 as itself (the kernels take an fp8 tensor for its bytes:
    ``check_fp8_bytes``)."""
    required = {p.name for p in decl.params if p.type == "Tensor"}
    items = []
    for i in c.items:
        if isinstance(i, Arg) and i.layout == "element" and i.name in required:
            i = replace(i, shape="1", layout="vector")
        elif isinstance(i, Arg) and i.out and i.kernel_dtype == "uint8" and i.dtypes == FP8:
            i = replace(i, kernel_dtype="")
        items.append(i)
    return replace(c, items=tuple(items))


def element_form(c: Contract, decl: Decl) -> str | None:
    """None when ``_Lane`` can check the contract as ``_lane_contract`` states it, its rules
    reading shapes or whether two required tensors start at one address (``same_address``),
    else why not."""
    required = {p.name for p in decl.params if p.type == "Tensor"}
    items = []
    for i in _lane_contract(c, decl).items:
        if isinstance(i, Rule):
            if any(not set(m.groups()) <= required for m in _SAME_ADDRESS.finditer(i.expr)):
                return f"rule {i.expr!r}: the address of an optional tensor"
            i = replace(i, expr=_SAME_ADDRESS.sub("", i.expr))
        items.append(i)
    return lane_form(replace(c, items=tuple(items)))
