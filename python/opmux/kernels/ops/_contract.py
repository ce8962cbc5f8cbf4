"""An op's argument contract stated once, as data (torch-free).

A :class:`Contract` lists, in the order they are checked, the op's tensors (:class:`Arg`: dtype
set or ``like=`` another tensor, a symbolic shape such as ``"*T, H"`` or ``"cdiv(N, 128), cdiv(K, 128)"``,
a layout), its scalars (:class:`Scalar`: a kind with its range), named relations between them
(:class:`Rule`: an expression over the shape symbols and scalars, with its message; a rule may
be tagged with the device type it binds on), the outputs it allocates when the caller passes
none, and the kernel arguments as views of the checked arguments. From that one statement
``_contract_codegen`` writes the op's ``check`` (a fast path for the serving form and the full
checks with their messages) into ``ops/<group>/_contracts.py``, a committed file a reader can open
and a traceback can point at (``python tools/gen_contracts.py`` rewrites it; a test fails when
it is stale). What cannot be declared (index ranges read from tensor contents, ...) stays in the
declaration's ``values=`` hook, whose Python side is authoritative.

Shapes: ``"=x"`` is x's whole shape; otherwise comma-separated dims; ``*T`` is any number of leading dims (at most one, first), a name
binds a symbol at its first use and is compared at later ones, anything else is a Python
expression over bound symbols (``H // 2``, ``cdiv(K, 128)``). Layouts (what a kernel may assume):

* ``rows``: a ``[rows, last]`` view with unit last stride; the kernel gets that view
  (``[*T, H]`` tensors; never a copy: a layout that cannot be viewed is an error);
* ``matrix``: exactly the declared (2-d) shape with unit last stride; the kernel gets it as is;
* ``vector``: a dense 1-d tensor;
* ``strided``: any strides (the kernel takes them); with ``*T`` the leading dims are flattened
  (a view) as for ``rows``;
* ``strided_unit``: any strides, but one of the dims has unit stride (TMA-friendly scales);
* ``element``: one element of any shape (a per-tensor scale); the kernel gets a [1] view;
* ``flat``: (an output) allocated in its declared shape; a caller's may have any shape of as many
  elements that views as a dense vector; the kernel gets that [n] view (per-row scales). An
  input ``[*T]`` reaches the kernel as its [tokens] reshape, which must be dense (rope's positions);
* ``scales``: (an output) allocated ``[*T, C]``; a caller's may have any leading dims holding the
  rows and any strides with each element at its own address (``distinct``); the kernel gets the
  ``[rows, C]`` view (group scales: row-major, column-major, TMA-aligned);
* ``blocks``: a ``[Gm, Gn]`` tensor of any strides, or one element (rank <= 1) standing for
  ``[1, 1]``, the kernel getting that [1, 1] view (static block scales).
* ``dense_last``: the declared rank, a unit last stride, no stride negative (KV caches' rows);
* ``contiguous``: C-contiguous (size-1 dims aside), or empty;
* ``entries``: the trailing ``E...`` dims C-contiguous, no stride negative (a cache's entries);
* ``paged``: each ``t[b]`` one dense region (its dims a permutation of a contiguous layout),
  blocks apart, no stride negative (paged caches copied block by block).
* ``heads``: ``[*T, H, D]`` with a unit last stride, any token and head strides (q / k views of
  one qkv buffer); the kernel gets the ``[tokens, H, D]`` view (never a copy).

An output may be allocated in another layout when a bool scalar says so (``alloc=``, the first
flag set wins: column-major or TMA-aligned scales), and may take a packed form (``packed=``:
another dtype and last dim, allowed only when its flag is set; a contract without that flag
refuses it with the same words). A tensor optional in the signature (``Tensor?``, not written)
is checked only when given; the kernel then gets an empty tensor of its dtype instead. Rule,
shape and kernel expressions may use ``prod(T)`` (the rows of a ``*T`` batch) and ``cdiv``,
``max``; a kernel argument that is not a declared name is such an expression.

The cache layouts (``dense_last`` .. ``paged``) keep the tensor as is for the kernel; their
message is the declaration's ``layout_hint`` (an f-string after "<name> "), or the layout's own. A shape may end in ``E...``:
one or more trailing dims, bound as a tuple (one dim in the serving form of the fast path). Caches
copied as bytes take any dtype (``dtypes=ANY``). An op with several forms (a cache of another
dtype or layout) is a :class:`Forms`: one contract per form, chosen by the arguments' ranks,
dtypes or presence (:class:`When`).

An output's kernel view may be reinterpreted (``kernel_dtype="uint8"``: fp8 buffers, which
kernels write as bytes).

Index buffers (the moe align ops): an output or a written ``Tensor?`` input may be ``at_least=True``,
a dense int32-indexed vector of at least the declared length (a caller's may be longer; the op's
own is ``alloc_shape`` long when that differs). An output's ``dtypes`` may name several (the
caller's may be any; the op's own is the first), with the dtype message ``dtype_hint``. A shape may
name an int scalar declared before it (``"num_experts"``). A kernel argument may ask ``x is None`` of
an output (whether the caller passed it, read before the op allocates its own). A contract with
``lane_optional=True`` takes its optional inputs in its serving lane too (checked when given).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["ANY", "FLOATS", "FP8", "Arg", "Contract", "Forms", "Packed", "Rule", "Scalar", "When"]

FLOATS = ("float32", "float16", "bfloat16")
FP8 = ("float8_e4m3fn",)
LAYOUTS: tuple[str, ...] = (
    "rows",
    "matrix",
    "vector",
    "strided",
    "strided_unit",
    "element",
    "flat",
    "scales",
    "blocks",
)
LAYOUTS += ("dense_last", "contiguous", "entries", "paged")
#: a [T, k] matrix with a unit last stride whose rows do not overlap (routing outputs)
LAYOUTS += ("rows_apart",)
LAYOUTS += ("heads",)
#: how an output may be allocated instead of densely (``Arg.alloc``): a ``[rows, C]`` view of a
#: column-major ``[C, rows]`` buffer, or of a ``[C, cdiv(rows, 4) * 4]`` one (TMA-aligned)
ALLOCS = ("columns", "tma_columns")
#: any dtype (caches copied as bytes): no dtype check in Python, whole-byte elements in C++
ANY = ("any",)
SCALAR_KINDS = {
    "bool": "a bool",
    "positive": "a finite number > 0",
    "finite": "a finite number",
    "positive_int": "a positive int",
    "dtype": "a torch.dtype",
}
SCALAR_KINDS |= {
    "int32": "an int in (-2^31, 2^31)",
    "off_or_positive": "a finite float >= 0 (0: off)",
    #: a str naming one of ``choices`` (an activation)
    "choice": "one of the names in choices",
    #: any int64 (a Philox seed or offset)
    "int64": "an int in [-2^63, 2^63)",
    #: a torch.distributed process group's name (``ProcessGroup.group_name``, as torch's
    #: functional collectives take it); the kernel gets the resolved ``ProcessGroup``
    "group": "the name of a live torch.distributed process group",
}
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def split_dims(shape: str) -> tuple[str, ...]:
    """``"*T, cdiv(K, 128)"`` -> ``("*T", "cdiv(K, 128)")``: commas inside parentheses stay."""
    dims, depth, cur = [], 0, ""
    for ch in shape:
        depth += (ch == "(") - (ch == ")")
        if ch == "," and not depth:
            dims.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        dims.append(cur.strip())
    return tuple(dims)


@dataclass(frozen=True)
class Packed:
    """An output's packed form: ``dtype`` elements, ``last`` of them per row (an expression over
    the symbols), allowed only when the bool scalar ``flag`` is set; ``name`` names it in the
    dtype message, ``what`` in the shape one (sgl-kernel's UE8M0 group scales: four exponent
    bytes per int32)."""

    dtype: str
    flag: str
    last: str
    name: str
    what: str


@dataclass(frozen=True)
class Arg:
    """One tensor argument. ``out=True``: an output the op allocates when the caller passes
    None (its dtype ``like=`` a tensor, or from ``dtype_from=``, a dtype scalar, or the first of
    ``dtypes=``: a caller's may be any of them)."""

    name: str
    shape: str
    dtypes: tuple[str, ...] = ()
    like: str = ""
    device_of: str = ""  # on this tensor's device (when ``like`` does not already say so)
    layout: str = "rows"
    out: bool = False
    dtype_from: str = ""
    #: the message's tail when the shape is wrong, after "<name> has shape (..); " (default: the
    #: expected shape)
    shape_hint: str = ""
    #: appended to the expected shape in that message (e.g. ``" (x's last dim)"``)
    note: str = ""
    #: the dtype the kernel sees the checked view as (``"uint8"`` for fp8 outputs), or ""
    kernel_dtype: str = ""
    #: (bool scalar, one of ``ALLOCS``) pairs: an output allocated that way when its flag is set
    alloc: tuple[tuple[str, str], ...] = ()
    #: an output's packed form (``scales`` layout only)
    packed: Packed | None = None
    #: the expected shape as a shape message states it (an f-string), replacing the generated one
    expect: str = ""
    #: the message's tail, after "<name> ", when the layout does not hold (the new layouts)
    layout_hint: str = ""
    #: with ``like=``: its dtype only, on any device (swaps between devices)
    any_device: bool = False
    #: a dense int32-indexed vector of at least the declared length (index buffers)
    at_least: bool = False
    #: the shape of the op's own output when it is not the declared one (``at_least`` buffers)
    alloc_shape: str = ""
    #: the message's tail, after "<name> ", when the dtype is wrong (an f-string; ``{dtype}``: its dtype)
    dtype_hint: str = ""
    #: with ``like=``: these dtypes too (rope's cache: float32 or query's)
    or_dtypes: tuple[str, ...] = ()
    #: an optional input's stand-in when None (an expression over the checked views, e.g. an
    #: empty view of another); such an input is given in the serving form
    none_as: str = ""
    #: the escape hatch for a kernel view a shape cannot state (rope's head count, read from a
    #: hidden size [H * D] or [H, D]): a function of the group's ``_views`` module, called as
    #: ``view(op, name, t, *view_args)`` at the tensor's place in the check order; it returns the
    #: view (the shape names its dims, bound from it) or raises the contract's message (Python is
    #: authoritative). ``view_cpp``: its C++ counterpart for the lane, a bool call filling a
    #: ``lane::HeadsView`` ({t}: the tensor, {v}: the view), which may only refuse
    view: str = ""
    view_args: tuple[str, ...] = ()
    view_cpp: str = ""

    def __post_init__(self) -> None:
        if self.layout not in LAYOUTS:
            raise ValueError(f"Arg {self.name!r}: layout {self.layout!r}; valid: {', '.join(LAYOUTS)}")
        if bool(self.dtypes) + bool(self.like) + bool(self.dtype_from) != 1:
            raise ValueError(f"Arg {self.name!r}: give exactly one of dtypes=, like= or dtype_from=")
        if self.dtype_from and not self.out:
            raise ValueError(f"Arg {self.name!r}: dtype_from= is for outputs")
        if self.at_least and self.layout != "vector":
            raise ValueError(f"Arg {self.name!r}: at_least= is for vectors")
        if (self.layout == "element") != (self.shape == ""):
            raise ValueError(f"Arg {self.name!r}: layout='element' goes with shape='' (one element)")
        if self.none_as and not self.view:
            raise ValueError(f"Arg {self.name!r}: none_as= goes with view=")
        if self.layout == "scales" and not self.out:
            raise ValueError(f"Arg {self.name!r}: layout {self.layout!r} is for outputs")
        if (self.alloc or self.packed) and self.layout != "scales":
            raise ValueError(f"Arg {self.name!r}: alloc= and packed= go with layout='scales'")
        for _, form in self.alloc:
            if form not in ALLOCS:
                raise ValueError(f"Arg {self.name!r}: alloc {form!r}; valid: {', '.join(ALLOCS)}")
        if self.layout == "blocks" and len(split_dims(self.shape)) != 2:
            raise ValueError(f"Arg {self.name!r}: layout='blocks' is a 2-d shape ('Gm, Gn')")

    @property
    def same_as(self) -> str:
        """The tensor whose whole shape this one has (``shape="=x"``), or ""."""
        return self.shape[1:].strip() if self.shape.startswith("=") else ""

    @property
    def dims(self) -> tuple[str, ...]:
        return () if self.same_as else split_dims(self.shape)

    @property
    def batched(self) -> bool:
        return bool(self.dims) and self.dims[0].startswith("*")

    @property
    def tail(self) -> str:
        """The symbol of trailing ``E...`` dims, or ""."""
        return self.dims[-1][:-3] if self.dims and self.dims[-1].endswith("...") else ""


@dataclass(frozen=True)
class Scalar:
    """One scalar argument and its range (``SCALAR_KINDS``)."""

    name: str
    kind: str
    #: for ``dtype``: the dtype names it may be (None: the default, given by ``default``); for
    #: ``choice``: the names a str argument may be
    choices: tuple[str, ...] = ()
    default: str = ""

    def __post_init__(self) -> None:
        if self.kind not in SCALAR_KINDS:
            raise ValueError(f"Scalar {self.name!r}: kind {self.kind!r}; valid: {', '.join(SCALAR_KINDS)}")
        if (self.kind == "choice" and not self.choices) or (
            self.choices and self.kind not in ("choice", "dtype")
        ):
            raise ValueError(
                f"Scalar {self.name!r}: kind 'choice' takes its names in choices= (so may 'dtype')"
            )


@dataclass(frozen=True)
class Rule:
    """A relation the arguments must satisfy: ``expr`` (over shape symbols and scalars) or a
    ``ValueError`` with ``message`` (a format string over the same names, plus ``op``). A rule
    tagged with ``device`` (``"cuda"``) binds only on that device type: device limits (int32
    sizes, shared memory) are stated here too, once."""

    expr: str
    message: str
    device: str = ""
    #: a named rule is also stated by the native entry points (``rule_<name>`` in
    #: ``contracts/<group>.h``: a direct native call refuses with the same words)
    name: str = ""


Item = Arg | Scalar | Rule
#: kernel arguments that are constants (a form's flag), not declared names
LITERALS = ("True", "False")


@dataclass(frozen=True)
class Contract:
    """The contract: ``items`` in check order, ``kernel`` the kernel arguments (tensor names
    stand for their checked views), ``result`` what the op returns (an output's name or
    ``None``). ``name`` names the generated check function (``check_<name>``)."""

    name: str
    items: tuple[Item, ...]
    kernel: tuple[str, ...]
    #: an output's name, several (a tuple of results), or ``"None"``
    result: str | tuple[str, ...] = "None"
    #: the values hook's C++ counterpart for the lane: a bool expression over the lane's checked
    #: arguments (and ``device_type``), declared in ``values_header``; false refuses the call to the
    #: Python path (it may refuse what Python accepts, never accept what it refuses)
    values_cpp: str = ""
    values_header: str = ""
    #: the serving lane also takes the optional inputs (``Tensor?``) when given, checked as here
    lane_optional: bool = False

    def __post_init__(self) -> None:
        names = [i.name for i in self.items if not isinstance(i, Rule)]
        for k in self.kernel:
            if k.isidentifier() and k not in names and k not in LITERALS:
                raise ValueError(f"contract {self.name!r}: kernel argument {k!r} is not declared")
        for r in self.results:
            if r not in names:
                raise ValueError(f"contract {self.name!r}: result {r!r} is not declared")
        bools = {s.name for s in self.scalars if s.kind == "bool"}
        for a in self.tensors:
            for flag, _ in a.alloc:
                if flag not in bools:
                    raise ValueError(
                        f"contract {self.name!r}: {a.name} is allocated by {flag!r}, not a bool scalar"
                    )
        for a in self.tensors:
            for i, d in enumerate(a.dims):
                if d.startswith("*") and i:
                    raise ValueError(f"contract {self.name!r}: {a.name}: '*' only on the first dim")
                if d.endswith("...") and (i != len(a.dims) - 1 or a.batched or not d[:-3].isidentifier()):
                    raise ValueError(
                        f"contract {self.name!r}: {a.name}: 'E...' only on the last dim, without '*'"
                    )
            if a.same_as and a.same_as not in names[: names.index(a.name)]:
                raise ValueError(
                    f"contract {self.name!r}: {a.name} refers to {a.same_as!r} before it is declared"
                )
            ref = a.like or a.device_of
            if ref and ref not in names[: names.index(a.name)]:
                raise ValueError(f"contract {self.name!r}: {a.name} refers to {ref!r} before it is declared")

    def required(self, name: str) -> bool:
        """Whether a rule makes the optional input ``name`` required (an and-ed ``name is not
        None``): this contract (a form of a :class:`Forms`) checks it as given, never as absent."""
        return any(f"{name} is not None" in (t.strip() for t in r.expr.split(" and ")) for r in self.rules)

    @property
    def results(self) -> tuple[str, ...]:
        """The names the op returns, in order."""
        if isinstance(self.result, tuple):
            return self.result
        return () if self.result == "None" else (self.result,)

    @property
    def outputs(self) -> tuple[Arg, ...]:
        return tuple(a for a in self.tensors if a.out)

    @property
    def tensors(self) -> tuple[Arg, ...]:
        return tuple(i for i in self.items if isinstance(i, Arg))

    @property
    def scalars(self) -> tuple[Scalar, ...]:
        return tuple(i for i in self.items if isinstance(i, Scalar))

    def dims_of(self, a: Arg) -> tuple[str, ...]:
        """``a``'s dims, those of the tensor it is shaped like for ``shape="=x"``."""
        while a.same_as:
            a = next(t for t in self.tensors if t.name == a.same_as)
        return a.dims

    @property
    def rules(self) -> tuple[Rule, ...]:
        return tuple(i for i in self.items if isinstance(i, Rule))


@dataclass(frozen=True)
class When:
    """A condition on one argument that picks a form: its rank (``ndim``), its dtype, or whether
    it is given (``given``: a ``Tensor?`` argument not None)."""

    arg: str
    ndim: int = -1
    dtype: str = ""
    given: bool = False


@dataclass(frozen=True)
class Forms:
    """An op's contract in several forms (e.g. a cache of key's dtype, or fp8 with scales; NHD or
    vLLM's paged layout): ``cases`` in order, each ``(conditions, contract)``, the first whose
    conditions all hold applies; else ``default`` (the serving form). Each form is a whole
    contract (shared items are shared Python values); its check is ``check_<its name>``."""

    name: str
    cases: tuple[tuple[tuple[When, ...], Contract], ...]
    default: Contract

    def __post_init__(self) -> None:
        names = [self.name, self.default.name, *(c.name for _, c in self.cases)]
        if len(set(names)) != len(names):
            raise ValueError(f"forms {self.name!r}: each form needs a name of its own")
        for when, _ in self.cases:
            if not when:
                raise ValueError(f"forms {self.name!r}: a case needs a condition (the default has none)")

    @property
    def contracts(self) -> tuple[Contract, ...]:
        return (*(c for _, c in self.cases), self.default)
