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

A contract a lane cannot state exactly (a rule over tensor contents or addresses, a dtype
argument, one-element or reinterpreted tensors) gets no generated lane: ``lane_form`` says why,
and such an op keeps its hand-written lane or has none (the Python contract then runs).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from ._contract import FLOATS, Arg, Contract, Scalar
from ._decl import Decl

__all__ = ["lane_form", "render_header", "render_entries"]

_DL = {
    "float32": "kDLFloat, 32",
    "float16": "kDLFloat, 16",
    "bfloat16": "kDLBfloat, 16",
    "float8_e4m3fn": "kDLFloat8_e4m3fn, 8",
    "int32": "kDLInt, 32",
    "int64": "kDLInt, 64",
    "uint8": "kDLUInt, 8",
}
_SCALAR = {"bool": ("bool", "bool_arg"), "positive": ("double", "positive_float"), "finite": ("double", "finite_float")}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def lane_form(c: Contract) -> str | None:
    """None when the contract's serving form can be checked in C++ exactly, else why not."""
    for s in c.scalars:
        if s.kind not in _SCALAR:
            return f"scalar {s.name} of kind {s.kind}"
    for a in c.tensors:
        if a.layout not in ("rows", "matrix", "vector"):
            return f"{a.name}'s layout {a.layout}"
        if a.kernel_dtype or a.dtype_from:
            return f"{a.name} is reinterpreted or takes its dtype from an argument"
        if any(d not in _DL for d in a.dtypes):
            return f"{a.name}'s dtypes {a.dtypes}"
    symbols = {d.lstrip("*") for a in c.tensors for d in c.dims_of(a) if d.lstrip("*").isidentifier()}
    for r in c.rules:
        names = set(_NAME.findall(r.expr)) - {"and", "or", "not", "cdiv"}
        if not names <= symbols or "." in r.expr:
            return f"rule {r.expr!r} reads more than shapes"
    return None


def _cpp_expr(expr: str) -> str:
    out = re.sub(r"\bnot\s+", "!", expr)
    out = re.sub(r"\band\b", "&&", out)
    out = re.sub(r"\bor\b", "||", out)
    return out.replace("//", "/")


def _dims(c: Contract, a: Arg) -> tuple[str, ...]:
    """The serving form's dims: ``*T`` is one dim."""
    return tuple(d.lstrip("*") for d in c.dims_of(a))


class _Lane:
    def __init__(self, c: Contract, decl: Decl) -> None:
        self.c, self.decl = c, decl
        self.lines: list[str] = []

    def emit(self, text: str, depth: int = 1) -> None:
        self.lines.append("  " * depth + text)

    def refuse_unless(self, cond: str, depth: int = 1) -> None:
        self.emit(f"if (!({cond})) return refused();", depth)

    def render(self) -> str:
        c, params = self.c, self.decl.params
        tensors = {a.name: a for a in c.tensors}
        args = []
        for p in params:
            if p.name in tensors and not (tensors[p.name].out and p.type == "Tensor?"):
                args.append(f"const TensorView& {p.name}")
            else:
                args.append(f"const AnyView& {p.name}_arg")
        head = f"template <typename Kernel>\ninline Any {c.name}(int32_t device_type, {', '.join(args)}, Kernel&& kernel) {{"
        self.lines = [f"// {c.name}: {self.decl.name}'s contract (ops/{self.decl.name.partition('.')[0]}/op.py)", head]
        for s in c.scalars:
            ctype, reader = _SCALAR[s.kind]
            self.emit(f"{ctype} {s.name};")
            self.refuse_unless(f"{reader}({s.name}_arg, &{s.name})")
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
        self.call(outs)
        self.lines.append("}")
        return "\n".join(self.lines) + "\n"

    def check_input(self, a: Arg, bound: dict[str, str]) -> None:
        first = not bound
        self.check_tensor(a, bound, a.name, depth=1)
        if first:
            self.refuse_unless(f"{a.name}.device().device_type == device_type")

    def check_tensor(self, a: Arg, bound: dict[str, str], t: str, depth: int) -> None:
        dims = _dims(self.c, a)
        conds = [f"{t}.ndim() == {len(dims)}"]
        if a.dtypes:
            if a.dtypes == FLOATS:
                conds.append(f"is_float({t}.dtype())")
            else:
                conds.append(" || ".join(f"is_dtype({t}, {_DL[d]})" for d in a.dtypes))
        if a.like:
            conds.append(f"same_dtype({t}.dtype(), {a.like}.dtype())")
        ref = a.like or a.device_of
        if ref:
            conds.append(f"same_device({t}, {ref})")
        self.refuse_unless(" && ".join(f"({x})" if "||" in x else x for x in conds), depth)
        sizes = []
        for i, d in enumerate(dims):
            if d.isidentifier() and d not in bound:
                bound[d] = f"{t}.size({i})"
                self.emit(f"const int64_t {d} = {t}.size({i});", depth)
            else:
                sizes.append(f"{t}.size({i}) == {_cpp_expr(d)}")
        if sizes:
            self.refuse_unless(" && ".join(sizes), depth)
        n = len(dims)
        if a.layout in ("rows", "matrix") and n:
            self.refuse_unless(f"{t}.size({n - 1}) <= 1 || {t}.stride({n - 1}) == 1", depth)
        elif a.layout == "vector":
            self.refuse_unless(f"{t}.size(0) <= 1 || {t}.stride(0) == 1", depth)

    def guard(self, outs: list[Arg]) -> None:
        """The generic guard of the signature's written tensors (fused_op's, for the serving form)."""
        params = [p for p in self.decl.params if p.is_tensor]
        fresh = {a.name for a in outs}
        written = [p for p in params if p.written]
        for i, w in enumerate(written):
            present = f"{w.name} && " if w.name in fresh else ""
            wt = f"*{w.name}" if w.name in fresh else w.name
            conds = [f"distinct({wt})"]
            for o in params:
                if o.name == w.name or (o.written and written.index(o) < i):
                    continue
                if o.name in fresh:
                    continue  # two optional outputs: never both fresh and shared (none has two)
                conds.append(f"may_share({wt}, {o.name}, {'true' if o.written else 'false'})")
            cond = " && ".join(conds)
            if present:
                self.emit(f"if ({w.name} && !({cond})) return refused();")
            else:
                self.refuse_unless(cond)

    def call(self, outs: list[Arg]) -> None:
        kargs = []
        for k in self.c.kernel:
            kargs.append(k)
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
            self.refuse_unless(f"{ref}.stride(0) == {ref}.size(1) && ({ref}.size(1) <= 1 || {ref}.stride(1) == 1)")
        else:
            dims = _dims(self.c, o)
        dtype = f"{o.like}.dtype()" if o.like else f"DLDataType{{{_DL[o.dtypes[0]]}, 1}}"
        dev = o.like or o.device_of or next(a.name for a in self.c.tensors if not a.out)
        shape = ", ".join(_cpp_expr(d) for d in dims)
        self.emit(f"Tensor fresh = empty({{{shape}}}, {dtype}, {dev}.device());")
        self.emit(f"kernel({', '.join('TensorView(fresh)' if k == o.name else k for k in kargs)});")
        self.emit("return fresh;")


def _lane_decls(decls: Iterable[Decl]) -> list[Decl]:
    return [d for d in decls if d.contract is not None and lane_form(d.contract) is None and d.spec.backend_names and any(b.name in ("aot", "jit") for b in d.spec.backends)]


def render_header(group: str, decls: Iterable[Decl]) -> str | None:
    """``contracts/<group>.h``, or None when no contract of the group has a C++ lane."""
    found = _lane_decls(decls)
    if not found:
        return None
    seen: dict[str, str] = {}
    for d in found:
        assert d.contract is not None
        seen.setdefault(d.contract.name, _Lane(d.contract, d).render())
    return (
        f"// Generated by tools/gen_contracts.py from ops/{group}/op.py's contracts: do not edit.\n"
        "// The serving lanes' checks (opmux/lane.h): each runs `kernel` on the caller's tensors or a\n"
        "// fresh output when the call is in the contract's serving form, else refuses (None).\n"
        "#pragma once\n\n#include \"opmux/lane.h\"\n\nnamespace opmux {\nnamespace lane {\nnamespace contract {\n\n"
        + "\n".join(seen.values())
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
        tensors = {a.name: a for a in c.tensors}
        params = []
        names = []
        for p in d.params:
            if p.name in tensors and not (tensors[p.name].out and p.type == "Tensor?"):
                params.append(f"TensorView {p.name}")
            else:
                params.append(f"lane::AnyView {p.name}")
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
