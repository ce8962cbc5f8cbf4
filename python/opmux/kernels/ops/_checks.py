"""The pieces every op's argument contract is made of (one contract, every backend).

Each raises TypeError (wrong type or dtype) or ValueError (shape, device, layout, value) with
the op name, the argument, the bad value and what is valid, so a bad call never reaches a
kernel and fails the same way whichever backend would have run. Importing this module does
not import torch (the op declarations that use it are read by the torch-free registry).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
else:
    from ._torch import torch

FLOATS = ("float32", "float16", "bfloat16")
#: the torch dtypes of FLOATS, filled at the first check (torch loads lazily)
FLOAT_DTYPES: tuple[Any, ...] = ()


#: device -> {dtype: a 0-element tensor there}: ``PROTOS[device][dtype].new_empty(*size)`` is
#: ``torch.empty(*size, dtype=dtype, device=device)`` for about 0.25 us less on the CPU (no
#: keyword arguments to parse), which is a small output's whole cost. Filled by ``protos``.
PROTOS: dict[Any, dict[Any, Any]] = {}


def protos(device: Any) -> dict[Any, Any]:
    """``PROTOS[device]``, made on first use. For plain tensors only: a contract run on fake
    tensors (torch.compile's fake kernels) allocates with ``torch.empty``; prototypes are made
    outside inference mode and never cached when a mode made them something else."""
    p = PROTOS.get(device)
    if p is None:
        ints = (torch.int32, torch.int64, torch.uint8, torch.int8)
        fp8 = tuple(getattr(torch, n) for n in ("float8_e4m3fn",) if hasattr(torch, n))
        dtypes = (torch.float32, torch.float16, torch.bfloat16, *ints, *fp8, torch.bool)
        with torch.inference_mode(False):
            p = {dt: torch.empty(0, dtype=dt, device=device) for dt in dtypes}
        if all(type(t) is torch.Tensor for t in p.values()):
            PROTOS[device] = p
    return p


def _dt(dtype: Any) -> str:
    return str(dtype).removeprefix("torch.")


def tensor(op: str, name: str, t: object) -> torch.Tensor:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    return t


def float_dtype(op: str, name: str, t: torch.Tensor) -> None:
    global FLOAT_DTYPES
    if t.dtype in FLOAT_DTYPES:
        return
    FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(f"{op}: {name} has dtype {_dt(t.dtype)}; supported: {', '.join(FLOATS)}")


def same_dtype(op: str, ref_name: str, ref: torch.Tensor, **others: torch.Tensor) -> None:
    for name, t in others.items():
        if t.dtype != ref.dtype:
            raise TypeError(
                f"{op}: {name} has dtype {_dt(t.dtype)}, expected {_dt(ref.dtype)} like {ref_name}"
            )


def exact_dtype(op: str, name: str, t: torch.Tensor, dtype: torch.dtype) -> None:
    """``t`` has exactly ``dtype`` (index tensors, scales)."""
    if t.dtype != dtype:
        raise TypeError(f"{op}: {name} has dtype {_dt(t.dtype)}, expected {_dt(dtype)}")


def like(op: str, ref_name: str, ref: torch.Tensor, name: str, t: torch.Tensor) -> None:
    """``t`` has ``ref``'s dtype and device (same messages as ``same_dtype`` / ``same_device``)."""
    if t.dtype != ref.dtype:
        raise TypeError(f"{op}: {name} has dtype {_dt(t.dtype)}, expected {_dt(ref.dtype)} like {ref_name}")
    if t.device != ref.device:
        raise ValueError(
            f"{op}: {name} is on {t.device} but {ref_name} is on {ref.device}; move them to one device"
        )


def like_or(
    op: str, ref_name: str, ref: torch.Tensor, name: str, t: torch.Tensor, dtypes: tuple[str, ...]
) -> None:
    """``t`` has one of ``dtypes`` or ``ref``'s dtype, and ``ref``'s device (rope's cache)."""
    if t.dtype != ref.dtype and _dt(t.dtype) not in dtypes:
        allowed = " or ".join(f"torch.{d}" for d in dtypes)
        raise TypeError(f"{op}: {name} has dtype {t.dtype}; expected {allowed} or {ref.dtype} ({ref_name}'s)")
    same_device(op, ref_name, ref, **{name: t})


def same_device(op: str, ref_name: str, ref: torch.Tensor, **others: torch.Tensor) -> None:
    for name, t in others.items():
        if t.device != ref.device:
            raise ValueError(
                f"{op}: {name} is on {t.device} but {ref_name} is on {ref.device}; move them to one device"
            )


def rows(op: str, name: str, t: torch.Tensor, hidden: int) -> torch.Tensor:
    """``t`` as a [rows, hidden] view with a contiguous last dim, never a copy."""
    if t.dim() == 2 and t.shape[1] == hidden and (t.stride(1) == 1 or hidden <= 1):
        return t  # the serving case: no view to build (a view costs about a microsecond)
    if t.dim() < 1 or t.shape[-1] != hidden:
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}, expected [..., {hidden}]")
    if hidden > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{op}: {name} has a non-contiguous last dimension (stride {t.stride(-1)}); "
            "kernels need stride 1 there: pass x.contiguous()"
        )
    try:
        return t.view(-1, hidden)
    except RuntimeError:
        raise ValueError(
            f"{op}: {name} with shape {tuple(t.shape)} and strides {t.stride()} cannot be viewed as "
            f"[rows, {hidden}]; pass a tensor whose leading dims are contiguous (x.contiguous())"
        ) from None


def vector(op: str, name: str, t: torch.Tensor, n: int, what: str) -> None:
    """``t`` is a dense [n] vector (weights: kernels read n consecutive elements)."""
    if t.shape != (n,):
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}, expected [{n}] ({what})")
    if n > 1 and t.stride(0) != 1:
        raise ValueError(
            f"{op}: {name} has stride {t.stride(0)}; kernels need a dense vector: pass {name}.contiguous()"
        )


def positive_int(op: str, name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v <= 0:
        raise ValueError(f"{op}: {name} must be a positive int, got {v!r}")
    return v


def positive_float(op: str, name: str, v: object) -> float:
    """A finite number > 0 (e.g. eps)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (0 < v < math.inf):
        raise ValueError(f"{op}: {name} must be a finite number > 0, got {v!r}")
    return float(v)


def heads(op: str, name: str, t: torch.Tensor, tokens: int, num_heads: int, head_dim: int) -> torch.Tensor:
    """``t`` as a [tokens, num_heads, head_dim] view with a dense last dim, never a copy (for
    per-head ops: q / k of [..., H, D] or [..., H * D]; token and head strides stay free)."""
    if head_dim > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{op}: {name} has a non-contiguous last dimension (stride {t.stride(-1)}); "
            "kernels need stride 1 there: pass x.contiguous()"
        )
    try:
        return t.view(tokens, num_heads, head_dim)
    except RuntimeError:
        raise ValueError(
            f"{op}: {name} with shape {tuple(t.shape)} and strides {t.stride()} cannot be viewed as "
            f"[{tokens}, {num_heads}, {head_dim}]; pass a tensor whose leading dims are contiguous"
        ) from None


def heads_of(op: str, name: str, t: torch.Tensor) -> torch.Tensor:
    """``t`` ([..., H, D], at least 2-d) as its [tokens, H, D] view (``heads``)."""
    n, d = t.shape[-2], t.shape[-1]
    return heads(op, name, t, t.shape[:-2].numel(), n, d)


#: index tensors up to this many elements are range-checked as a Python list (tolist: one C
#: call, ~0.15 us) rather than with aminmax and two item reads (~1.5 us)
SMALL = 64


def in_range(t: torch.Tensor, lo: int, hi: int) -> bool:
    """Whether every element of the (CPU) integer tensor ``t`` is in ``[lo, hi)``. A decode-sized
    one (at most SMALL elements, 0-2 dims) is read as a Python list; the rest with aminmax."""
    s = t.shape
    d = len(s)
    if d == 1 and s[0] <= SMALL:
        if not s[0]:
            return True
        v = t.tolist()
        return lo <= min(v) and max(v) < hi  # type: ignore[no-any-return]
    if d == 2 and s[0] * s[1] <= SMALL:
        if not s[0] * s[1]:
            return True
        rows = t.tolist()
        v = rows[0] if s[0] == 1 else [e for row in rows for e in row]  # one token's ids: its row
        return lo <= min(v) and max(v) < hi  # type: ignore[no-any-return]
    if d == 0:
        return lo <= t.item() < hi
    if not t.numel():
        return True
    a, b = torch.aminmax(t)  # one pass
    return lo <= int(a) and int(b) < hi


# -- the generic part of the contract (called from the entry points _entry_codegen writes) --
def no_grad(op: str, *named: tuple[str, torch.Tensor | None]) -> None:
    """In grad mode, an input that requires grad is an error: the ops have no autograd formula."""
    for name, t in named:
        if t is not None and t.requires_grad:
            raise ValueError(
                f"{op}: {name} requires grad, but opmux ops are inference-only (no autograd formula): "
                f"call it under torch.no_grad() or torch.inference_mode(), or pass {name}.detach()"
            )


def bump_versions(*written: torch.Tensor | None) -> None:
    """In grad mode, tell autograd that these tensors changed (a saved one then fails loudly)."""
    for t in written:
        if t is not None and not t.is_inference():
            torch.autograd.graph.increment_version(t)


def alias(op: str, a_name: str, a: torch.Tensor, b_name: str, b: torch.Tensor, both_written: bool) -> None:
    """Called when ``a`` (written) and ``b`` share memory ranges: allowed only when they are
    disjoint after all (interleaved views, e.g. q and k of one qkv tensor) or, for a read
    ``b``, the very same view (in place, e.g. ``out=x``)."""
    if not a.numel() or not b.numel():
        return
    same = (  # the stride of a dimension of size 1 addresses nothing
        a.data_ptr() == b.data_ptr()
        and a.dtype == b.dtype
        and a.shape == b.shape
        and all(sa == sb for sa, sb, n in zip(a.stride(), b.stride(), a.shape, strict=True) if n > 1)
    )
    if same and not both_written:
        return
    if not same and (_apart(a, b) or _disjoint(a, b)):
        return
    need = (
        "arguments written in place must be distinct tensors"
        if both_written
        else f"pass a separate {a_name}, or {b_name} itself to work in place"
    )
    raise ValueError(f"{op}: {a_name} and {b_name} overlap in memory; {need}")


#: (shape, strides) -> whether a view of that layout has no two elements at one address
_LAYOUTS: dict[tuple[Any, Any], bool] = {}


def self_overlap(op: str, name: str, t: torch.Tensor) -> None:
    """A tensor the op writes must hold each element at its own address: an ``expand()``ed or
    windowed (``as_strided``) view would have several kernel threads write one location, and
    torch refuses such outputs too. Called for non-contiguous written tensors (q / k views of a
    qkv buffer, HND caches: fine), the answer cached per layout."""
    key = (t.shape, t.stride())
    try:
        ok = _LAYOUTS.get(key)
        if ok is None:
            if len(_LAYOUTS) > 4096:
                _LAYOUTS.clear()
            ok = _LAYOUTS[key] = _distinct_addresses(*key)
    except TypeError:  # symbolic sizes (unhashable): no cache
        ok = _distinct_addresses(*key)
    if not ok:
        raise ValueError(
            f"{op}: {name} has elements that share memory (shape {tuple(t.shape)}, strides "
            f"{tuple(t.stride())}, e.g. an expand()ed view); a tensor the op writes needs one memory "
            f"location per element: pass a dense one (e.g. {name}.contiguous(), then copy it back)"
        )


def _distinct_addresses(shape: Any, strides: Any) -> bool:
    """Sufficient (and for every layout made by views of a dense tensor, exact): with the dims
    of size > 1 by increasing |stride|, each stride clears the span of the smaller ones."""
    if 0 in shape:
        return True
    span = 1
    for st, n in sorted((abs(st), n) for st, n in zip(strides, shape, strict=True) if n > 1):
        if st < span:
            return False
        span = st * (n - 1) + span
    return True


def _extent(t: torch.Tensor) -> tuple[int, int]:
    """The [lo, hi) bytes a (non-empty) view can touch."""
    neg = pos = 0
    for st, n in zip(t.stride(), t.shape, strict=True):
        reach = st * (n - 1)
        if reach < 0:
            neg += reach
        else:
            pos += reach
    size, base = t.element_size(), t.data_ptr()
    return base + neg * size, base + (pos + 1) * size


def _apart(a: torch.Tensor, b: torch.Tensor) -> bool:
    """No byte in common (torch's overlap test gives up on non-dense views: "too hard")."""
    (alo, ahi), (blo, bhi) = _extent(a), _extent(b)
    return ahi <= blo or bhi <= alo


def _disjoint(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether two views with the same strides touch no common element (False when unsure). The
    stride of a dimension of size 1 is never used, so only the others must agree (q and k views
    of one qkv buffer at one token differ in the token stride)."""
    size = a.element_size()
    if size != b.element_size() or a.dim() != b.dim():
        return False
    strides = []
    for sa, sb, na, nb in zip(a.stride(), b.stride(), a.shape, b.shape, strict=True):
        if na > 1 and nb > 1 and sa != sb:
            return False
        strides.append(sa if na > 1 else sb)
    delta, rem = divmod(b.data_ptr() - a.data_ptr(), size)
    if rem:
        return False
    dims = sorted(
        ((s, na, nb) for s, na, nb in zip(strides, a.shape, b.shape, strict=True) if s), reverse=True
    )
    return not _reachable(delta, dims)


def _reachable(delta: int, dims: list[tuple[int, int, int]]) -> bool:
    """Is ``delta`` = sum(k_i * stride_i) with -(nb_i - 1) <= k_i <= na_i - 1?"""
    if not dims:
        return delta == 0
    (s, na, nb), rest = dims[0], dims[1:]
    reach = sum((max(x, y) - 1) * st for st, x, y in rest)
    lo, hi = max(-(nb - 1), -((reach - delta) // s)), min(na - 1, (delta + reach) // s)
    if hi - lo > 64:
        return True  # strides that do not nest: assume the worst
    return any(_reachable(delta - k * s, rest) for k in range(lo, hi + 1))


def is_fake(t: torch.Tensor) -> bool:
    """A torch.compile fake tensor: it has no data pointer, so identity checks wait for the real call."""
    fake = getattr(getattr(torch, "_subclasses", None), "FakeTensor", None)
    return fake is not None and isinstance(t, fake)


def no_caller_outputs_when_compiling(op: str, names: str, *bufs: torch.Tensor | None) -> None:
    """Caller's output buffers are refused on fake tensors (torch.compile): the library op would
    return aliases of its inputs, which torch.compile does not support (wrong results seen)."""
    if any(b is not None and is_fake(b) for b in bufs):
        raise NotImplementedError(
            f"{op}: {names} are not supported under torch.compile yet; call without them and use "
            "the returned tensors"
        )


# -- the pieces the generated contract checks use (ops/_contract_codegen.py) -----------------
INF = math.inf


def dtype_in(op: str, name: str, t: torch.Tensor, names: tuple[str, ...]) -> None:
    """``t``'s dtype is one of ``names`` (torch dtype names)."""
    if _dt(t.dtype) not in names:
        if len(names) == 1:
            raise TypeError(f"{op}: {name} has dtype {_dt(t.dtype)}, expected {names[0]}")
        raise TypeError(f"{op}: {name} has dtype {_dt(t.dtype)}; supported: {', '.join(names)}")


def finite_float(op: str, name: str, v: object) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise ValueError(f"{op}: {name} must be a finite number, got {v!r}")
    return float(v)


#: process-group name -> the ``ProcessGroup`` it resolved to (``process_group``): the serving
#: form's check (``cached_group``) is two dict lookups
GROUPS: dict[str, Any] = {}


def cached_group(v: str) -> bool:
    """``v`` names a group resolved before (``GROUPS``) that is still live under that name: a
    group destroyed since, or a name reused by a new group (the default group is ``'0'`` again
    after ``destroy_process_group`` + ``init_process_group``), is not (the full check resolves
    it again or names the live groups)."""
    pg = GROUPS.get(v)
    return pg is not None and is_live_group(pg, v)


def is_live_group(pg: Any, name: str) -> bool:
    """Whether ``pg`` is still the live torch.distributed group named ``name``."""
    from torch.distributed import distributed_c10d as c10d

    return bool(c10d._world.pg_names.get(pg) == name)


def live_group_names() -> list[str]:
    """The names of this process's live torch.distributed groups (for messages)."""
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return []
    from torch.distributed import distributed_c10d as c10d

    return sorted(str(n) for n in c10d._world.pg_names.values())


def process_group(op: str, name: str, v: object) -> Any:
    """A process group given by its name (``ProcessGroup.group_name``, as torch's functional
    collectives take it): the group, or a ValueError naming the live groups."""
    if type(v) is not str:
        raise TypeError(f"{op}: {name} must be a process group's name (ProcessGroup.group_name), got {v!r}")
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        raise ValueError(
            f"{op}: {name} {v!r} names no process group: torch.distributed is not initialized in this "
            "process (call torch.distributed.init_process_group first; opmux never creates groups)"
        )
    from torch.distributed import distributed_c10d

    c10d: Any = distributed_c10d  # its private resolver: the one torch's functional collectives use
    try:
        pg = c10d._resolve_process_group(v)
    except (KeyError, ValueError, RuntimeError):
        pg = None
    if pg is None or pg not in c10d._world.pg_names:
        GROUPS.pop(v, None)
        live = ", ".join(map(repr, live_group_names())) or "none"
        raise ValueError(f"{op}: {name} {v!r} names no live process group; live groups: {live}")
    GROUPS[v] = pg
    return pg


def str_choice(op: str, name: str, v: object, names: tuple[str, ...]) -> None:
    """A str argument naming one of ``names`` (an activation)."""
    if type(v) is str and v in names:
        return
    raise ValueError(f"{op}: {name} must be one of {', '.join(map(repr, names))}, got {v!r}")


def dtype_choice(op: str, name: str, v: object, names: tuple[str, ...]) -> None:
    """A dtype argument: None (the default) or one of ``names``."""
    if v is None or (isinstance(v, torch.dtype) and _dt(v) in names):
        return
    raise TypeError(
        f"{op}: {name} must be None or one of {', '.join('torch.' + n for n in names)}, got {v!r}"
    )


def out_dtype(op: str, name: str, t: torch.Tensor, arg: str, v: Any, names: tuple[str, ...]) -> Any:
    """A caller's output whose dtype the op could also be told (``arg``): it must be a valid
    one and agree with ``arg`` when both are given. Returns the dtype."""
    if _dt(t.dtype) not in names:
        raise TypeError(f"{op}: {name} has dtype {_dt(t.dtype)}; supported: {', '.join(names)}")
    if v is not None and t.dtype != v:
        raise TypeError(f"{op}: {name} has dtype {_dt(t.dtype)} but {arg} is {_dt(v)}; make them agree")
    return t.dtype


def unit_last_stride(op: str, name: str, t: torch.Tensor) -> None:
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{op}: {name} has a non-contiguous last dimension (stride {t.stride(-1)}); "
            f"kernels need stride 1 there: pass {name}.contiguous()"
        )


def dense_vector(op: str, name: str, t: torch.Tensor) -> None:
    if t.shape[0] > 1 and t.stride(0) != 1:
        raise ValueError(
            f"{op}: {name} has stride {t.stride(0)}; kernels need a dense vector: pass {name}.contiguous()"
        )


def has_unit_stride(t: torch.Tensor) -> bool:
    """Some dim of ``t`` has unit stride (or ``t`` has at most one element per dim but one)."""
    return any(st == 1 or n <= 1 for st, n in zip(t.stride(), t.shape, strict=True)) or t.dim() == 0


def unit_stride_somewhere(op: str, name: str, t: torch.Tensor) -> None:
    if not has_unit_stride(t):
        raise ValueError(
            f"{op}: {name} has strides {tuple(t.stride())}; kernels need unit stride in one of its "
            f"dims (row-major, or the transposed view of a column-major buffer): pass {name}.contiguous()"
        )


def flat_rows(op: str, name: str, t: torch.Tensor, last: int) -> torch.Tensor:
    """``t`` ([*T, last], any strides) as a [rows, last] view, never a copy."""
    if t.dim() == 2:
        return t
    try:
        return t.view(-1, last)
    except RuntimeError:
        raise ValueError(
            f"{op}: {name} with shape {tuple(t.shape)} and strides {t.stride()} cannot be viewed as "
            f"[rows, {last}]; pass a tensor whose leading dims are contiguous ({name}.contiguous())"
        ) from None


def same_address(a: torch.Tensor, b: torch.Tensor) -> bool:
    """``a`` and ``b`` start at one address (both non-empty; fakes have none: checked at the real call)."""
    return bool(a.numel()) and not is_fake(a) and a.data_ptr() == b.data_ptr()


def one_element(op: str, name: str, t: torch.Tensor, note: str) -> torch.Tensor:
    """A tensor of one element (any shape) as a [1] view."""
    if t.numel() != 1:
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}, expected one element{note}")
    return t.reshape(1)


# -- the quantization ops' forms (outputs of several layouts, packed scales) ----------------
def distinct(op: str, name: str, t: torch.Tensor) -> None:
    """A written tensor of any strides holds each element at its own address (the one rule:
    ``_distinct_addresses``; lane.h ``distinct`` in C++)."""
    if not _distinct_addresses(t.shape, t.stride()) or min(t.stride(), default=0) < 0:
        raise ValueError(
            f"{op}: {name} has overlapping or negative strides {t.stride()} for shape {tuple(t.shape)}"
        )


def flat_vector(op: str, name: str, t: torch.Tensor, n: int, note: str) -> torch.Tensor:
    """A caller's output of ``n`` elements (any shape) as a dense [n] view (per-row scales)."""
    if t.numel() != n:
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}, expected {n} element(s){note}")
    try:
        v = t.view(n)
        if n > 1 and v.stride(0) != 1:
            raise RuntimeError
        return v
    except RuntimeError:
        raise ValueError(
            f"{op}: {name} with shape {tuple(t.shape)} and strides {t.stride()} cannot be viewed as "
            f"a dense [{n}] vector"
        ) from None


def scale_rows(op: str, name: str, t: torch.Tensor, rows: int, cols: int, note: str) -> torch.Tensor:
    """Group scales ``[..., cols]`` holding ``rows`` rows, any strides, as a [rows, cols] view."""
    if t.dim() == 2 and t.shape == (rows, cols):
        v = t
    elif t.dim() >= 1 and t.shape[-1] == cols and t.numel() == rows * cols:
        try:
            v = t.view(rows, cols)
        except RuntimeError:
            raise ValueError(
                f"{op}: {name} with shape {tuple(t.shape)} and strides {t.stride()} cannot be viewed as "
                f"[{rows}, {cols}]"
            ) from None
    else:
        raise ValueError(
            f"{op}: {name} has shape {tuple(t.shape)}, expected [..., {cols}]{note} for {rows} rows"
        )
    distinct(op, name, v)
    return v


def packed_dtype(
    op: str,
    name: str,
    t: torch.Tensor,
    names: tuple[str, ...],
    packed: str,
    flag: bool,
    flag_name: str,
    what: str,
) -> bool:
    """Whether ``t`` is an output's packed form (dtype ``packed``, allowed by ``flag``), else of
    ``names``."""
    if _dt(t.dtype) == packed:
        if not flag:
            raise TypeError(f"{op}: {name} has dtype {packed} ({what}), which needs {flag_name}=True")
        return True
    dtype_in(op, name, t, names)
    return False


def column_major(rows: int, cols: int, align: int, dtype: Any, device: Any) -> torch.Tensor:
    """A fresh [rows, cols] view of a column-major buffer whose columns hold ``rows`` rounded up
    to ``align`` (TMA-aligned scales: 4)."""
    m = -(-rows // align) * align
    return torch.empty((cols, m), dtype=dtype, device=device).t()[:rows]


# -- the layouts of caches (ops/_contract.py: dense_last, contiguous, entries, blocks) -------------
def dense_last(t: torch.Tensor) -> bool:
    """A unit last stride (or at most one element there) and no stride negative."""
    st = t.stride()
    return (not st or st[-1] == 1 or t.shape[-1] <= 1) and min(st, default=0) >= 0


def dense_from(t: torch.Tensor, first: int) -> bool:
    """Dims ``first..`` C-contiguous (size-1 dims aside) and no stride negative."""
    expect = 1
    for s, n in reversed(list(zip(t.stride()[first:], t.shape[first:], strict=True))):
        if n > 1 and s != expect:
            return False
        expect *= n
    return min(t.stride(), default=0) >= 0


def dense_blocks(t: torch.Tensor) -> bool:
    """Each block ``t[b]`` one dense region (inner strides a permutation of a contiguous
    layout, none negative) and blocks apart."""
    st, sh = t.stride(), t.shape
    if min(st) < 0:
        return False
    if 0 in sh:
        return True
    expect = 1
    for s, n in sorted((s, n) for s, n in zip(st[1:], sh[1:], strict=True) if n > 1):
        if s != expect:
            return False
        expect *= n
    return sh[0] <= 1 or st[0] >= expect


# -- the pieces of the moe ops' contracts (index buffers, routing outputs, int32 scalars) ------
def at_least(op: str, name: str, t: torch.Tensor, n: int, note: str) -> None:
    """A buffer the kernels index in int32 and write whole: a dense vector of at least ``n``
    elements and fewer than 2^31."""
    if t.dim() != 1 or t.shape[0] < n:
        raise ValueError(f"{op}: {name} has shape {tuple(t.shape)}, expected a vector of at least {n}{note}")
    if t.shape[0] > 1 and t.stride(0) != 1:
        raise ValueError(f"{op}: {name} has stride {t.stride(0)}; it must be dense")
    if t.shape[0] >= 2**31:
        raise ValueError(f"{op}: {name} has {t.shape[0]} elements; at most {2**31 - 1}")


def rows_apart(op: str, name: str, t: torch.Tensor) -> None:
    """A [T, k] matrix with a unit last stride whose rows do not overlap (each row written whole)."""
    if t.shape[1] > 1 and t.stride(1) != 1:
        raise ValueError(f"{op}: {name} has a non-contiguous last dimension (stride {t.stride(1)})")
    if t.shape[0] > 1 and t.stride(0) < t.shape[1]:
        raise ValueError(f"{op}: {name} rows overlap (strides {t.stride()})")


def int32(op: str, name: str, v: object) -> int:
    """An int the kernels take as int32 (a fill value)."""
    if isinstance(v, bool) or not isinstance(v, int) or abs(v) >= 2**31:
        raise ValueError(f"{op}: {name} must be an int32, got {v!r}")
    return v


def int64(op: str, name: str, v: object) -> int:
    """An int the kernels take as int64 (a Philox seed or offset)."""
    if isinstance(v, bool) or not isinstance(v, int) or not (-(2**63) <= v < 2**63):
        raise ValueError(f"{op}: {name} must be an int64, got {v!r}")
    return v


def off_or_positive(op: str, name: str, v: object) -> float:
    """A finite float >= 0 whose 0 turns a feature off (a softcap)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise TypeError(f"{op}: {name} must be a float, got {v!r}")
    if not (0.0 <= v < math.inf):
        raise ValueError(f"{op}: {name} must be finite and >= 0 (0: off), got {v!r}")
    return float(v)
