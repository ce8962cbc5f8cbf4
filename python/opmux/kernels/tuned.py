"""Tuned launch configurations: the config for (op, backend, device name, shape, M).

Torch-free. Tables are JSON files named and shaped as vLLM's and SGLang's tuned files, so
theirs work unchanged::

    N=7168,K=18432,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json
    {"1": {"BLOCK_SIZE_M": 16, "BLOCK_SIZE_N": 64, "BLOCK_SIZE_K": 128, "GROUP_SIZE_M": 1,
           "num_warps": 4, "num_stages": 4}, "64": {...}, ...}

A file name is a list of ``name=value`` components (:class:`TableKey`); the order is the
writer's, the match is by value (``[128, 128]``, SGLang's spelling, equals vLLM's
``[128,128]``). An op with several forms has a table per form, told apart by the components
after the device's (its ``tags``), as vLLM's fused-MoE files are: ``moe.fused_experts`` reads
``E=8,N=14336,device_name=NVIDIA_H200.json`` for bf16 / fp16 weights,
``...,dtype=float32.json`` for fp32, ``...,dtype=fp8_w8a8,block_shape=[128,128].json`` for
block fp8 (N = ``w2.shape[2]``, E the local experts); the caller passes its form's tags to
:func:`lookup` (``Schema.kernel_tags``).

The Triton backend's files carry no backend component (so they stay vLLM's files); every
other backend adds one, e.g. ``...,backend=cuda.json`` holding ``{"<M>": {"config_id": 3}}``
(the CUDA kernel's instantiation: ``jit/csrc/gemm_cuda.cu`` lists them; ``moe.fused_experts``'
native decode kernels: ``{"<M>": {"UP_ROWS": 4, "DOWN_ROWS": 8}}``, ``ops/moe/_decode_split``),
and ``...,backend=select.json`` holds ``{"<M>": {"backend": "triton"}}``: the backend
measured fastest for that shape and M on that device (``python -m opmux.kernels.tune ...
--backend select`` writes it), which dispatch tries first. A select table with ``N=0,K=0``
holds the size classes by M measured over all the tuned shapes: it applies to a shape with no
table of its own.

Search order for a table, first readable match wins:

1. ``$OPMUX_TUNED_CONFIG_DIR/<op>/``, then ``$OPMUX_TUNED_CONFIG_DIR/`` (a vLLM folder as is);
2. ``opmux/kernels/configs/<op>/`` shipped in the wheel;
3. none: :func:`default_config`, the op's tested heuristic.

A user file that cannot be used (bad JSON, an unknown key, a bad value) is skipped with a
:class:`TunedConfigWarning` naming it, and the search goes on. Within a table the entry of the
nearest M key is used (``min |M - key|``, the smaller key on a tie, as vLLM).

Cost of :func:`lookup` after the first call for a given (op, backend, device, shape, M): one
dict lookup. Tables are read once per key and the user directory once per process:
:func:`refresh` (also run when ``config.scope`` starts or ends) forgets both.
"""

from __future__ import annotations

import bisect
import json
import math
import os
import re
import tempfile
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, ClassVar

from opmux.kernels import _env
from opmux.kernels._warn import warn_at_caller

__all__ = [
    "FP8_BLOCK_TAGS",
    "SCHEMAS",
    "Config",
    "Schema",
    "Table",
    "TableError",
    "TableKey",
    "Tags",
    "TunedConfigWarning",
    "default_config",
    "device_name",
    "find_table",
    "lookup",
    "nearest",
    "on_refresh",
    "read_table",
    "refresh",
    "reject",
    "search_dirs",
    "shipped_dir",
    "shipped_tables",
    "source",
    "table_key",
    "validate_entry",
    "write_table",
]

Config = Mapping[str, Any]
Table = Mapping[int, Config]
#: the ``name=value`` components of a file name after the device's (a form: ``dtype=fp8_w8a8``)
Tags = tuple[tuple[str, str], ...]

#: The backend whose files carry no ``backend=`` component (vLLM's and SGLang's files).
UNMARKED_BACKEND = "triton"
_COMPONENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=(\[[^\]]*\]|[^,]*)(?:,|$)")


class TunedConfigWarning(UserWarning):
    """A tuned-config file was skipped; the message names it and says why."""


class TableError(ValueError):
    """A tuned-config file that cannot be used: ``path`` and the ``reason``."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.path, self.reason))


@dataclass(frozen=True)
class TableKey:
    """The identity of one table file: op, backend, device and the named components.

    >>> key = table_key("gemm.w8a8_block_fp8_matmul", "triton", "NVIDIA_H200", (4096, 7168))
    >>> key.file_name()
    'N=4096,K=7168,device_name=NVIDIA_H200,dtype=fp8_w8a8,block_shape=[128,128].json'
    >>> TableKey.parse(key.op, key.file_name()) == key
    True
    """

    op: str
    backend: str
    device_name: str
    shape: tuple[tuple[str, int], ...]
    tags: Tags

    def file_name(self) -> str:
        parts = [f"{name}={value}" for name, value in self.shape]
        parts.append(f"device_name={self.device_name}")
        parts += [f"{name}={value}" for name, value in self.tags]
        if self.backend != UNMARKED_BACKEND:
            parts.append(f"backend={self.backend}")
        return ",".join(parts) + ".json"

    @classmethod
    def parse(cls, op: str, file_name: str) -> TableKey:
        """The key of a file name of ``op``'s tables; ValueError when it is not one."""
        schema = _schema_for(op)
        stem = file_name[:-5] if file_name.endswith(".json") else file_name
        fields: dict[str, str] = {}
        pos = 0
        while pos < len(stem):
            match = _COMPONENT.match(stem, pos)
            if match is None or match.group(1) in fields:
                raise ValueError(f"{file_name!r} is not a list of name=value components")
            fields[match.group(1)] = match.group(2)
            pos = match.end()
        backend = fields.pop("backend", UNMARKED_BACKEND)
        device = fields.pop("device_name", None)
        try:
            shape = tuple((name, int(fields.pop(name))) for name in schema.shape)
        except (KeyError, ValueError):
            raise ValueError(f"{file_name!r} lacks integer {', '.join(schema.shape)}") from None
        tags = tuple((name, _norm(fields.pop(name))) for name in schema.tag_names() if name in fields)
        if device is None or fields:
            extra = ", ".join(fields) or "device_name missing"
            raise ValueError(f"{file_name!r} does not name a {op} table ({extra})")
        return cls(op, backend, device, shape, tags)


def _norm(value: str) -> str:
    return re.sub(r"\s+", "", value)


@dataclass(frozen=True)
class Schema:
    """What an op's tables look like: shape components, tags, entry checks per backend
    (``check(entry, tags) -> problems``), and the default heuristic ``default(m, shape, tags) ->
    config`` per backend.

    ``tags`` are the components after the device's of the op's one form; an op whose tables
    differ by form (vLLM's fused MoE: none for bf16 weights, ``dtype=fp8_w8a8,block_shape=[128,128]``
    for block fp8) lists every tag name a file may carry in ``form_tags`` and passes the call's
    tags to :func:`lookup` (``kernel_tags``: from the kernel's arguments); ``tags`` is then the
    default form's."""

    shape: tuple[str, ...]
    tags: Tags
    entries: Mapping[str, Callable[[Mapping[str, Any], Tags], list[str]]]
    defaults: Mapping[str, Callable[[int, tuple[int, ...], Tags], dict[str, Any]]]
    #: (shape, M) of a call from the kernel's arguments (a native kernel's tuned-config lookup)
    kernel_problem: Callable[..., tuple[tuple[int, ...], int]] | None = None
    #: (shape, M) of a call from the public function's arguments (the measured selection)
    call_problem: Callable[..., tuple[tuple[int, ...], int]] | None = None
    #: the tag names of every form, in file-name order (empty: ``tags``' names, one form)
    form_tags: tuple[str, ...] = ()
    #: the tags of a call from the kernel's arguments (ops with several forms)
    kernel_tags: Callable[..., Tags] | None = None
    #: the tags of a call from the public function's arguments (the measured selection of an
    #: op with several forms: each form has its own ``select`` tables)
    call_tags: Callable[..., Tags] | None = None

    def tag_names(self) -> tuple[str, ...]:
        """The tag names a file of this op may carry, in file-name order."""
        return self.form_tags or tuple(name for name, _ in self.tags)


def _pow2(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


_TRITON_GEMM_KEYS = (
    "BLOCK_SIZE_M",
    "BLOCK_SIZE_N",
    "BLOCK_SIZE_K",
    "GROUP_SIZE_M",
    "num_warps",
    "num_stages",
)


def _tile_problems(
    entry: Mapping[str, Any], tiles: tuple[str, ...] = ("BLOCK_SIZE_M", "BLOCK_SIZE_N")
) -> list[str]:
    """Problems with the tiles, warps, stages and grouping (where the entry has one) of a Triton
    entry (a GEMM's, the MoE's, paged prefill's)."""
    problems: list[str] = []
    for key in tiles:
        if not (_pow2(entry[key]) and 16 <= entry[key] <= 256):
            problems.append(f"{key}={entry[key]} (a power of two in 16..256)")
    if not (_pow2(entry["num_warps"]) and entry["num_warps"] <= 16):
        problems.append(f"num_warps={entry['num_warps']} (1, 2, 4, 8 or 16)")
    if not 1 <= entry["num_stages"] <= 8:
        problems.append(f"num_stages={entry['num_stages']} (1..8)")
    if entry.get("GROUP_SIZE_M", 1) < 1:
        problems.append(f"GROUP_SIZE_M={entry['GROUP_SIZE_M']} (>= 1)")
    return problems


def _key_problems(
    entry: Mapping[str, Any], required: tuple[str, ...], optional: tuple[str, ...]
) -> list[str]:
    """Missing and unknown keys and non-integer values of an entry whose values are all integers."""
    problems = [f"missing {key}" for key in required if key not in entry]
    unknown = sorted(set(entry) - set(required) - set(optional))
    if unknown:
        problems.append(f"unknown key(s) {', '.join(unknown)} (known: {', '.join((*required, *optional))})")
    for key, value in entry.items():
        if not isinstance(value, int) or isinstance(value, bool):
            problems.append(f"{key}={value!r} is not an integer")
    return problems


def _check_triton_block_fp8(entry: Mapping[str, Any], tags: Tags = ()) -> list[str]:
    """Problems with one entry of a Triton block-fp8 GEMM table (empty: usable)."""
    problems = _key_problems(entry, _TRITON_GEMM_KEYS, ("SPLIT_K",))
    if problems:
        return problems
    if entry["BLOCK_SIZE_K"] != 128:
        problems.append(f"BLOCK_SIZE_K={entry['BLOCK_SIZE_K']} (must be 128: one K step per scale block)")
    problems += _tile_problems(entry)
    if not 1 <= entry.get("SPLIT_K", 1) <= 64:
        problems.append(f"SPLIT_K={entry['SPLIT_K']} (1..64)")
    return problems


def _check_config_id(entry: Mapping[str, Any], tags: Tags = ()) -> list[str]:
    value = entry.get("config_id")
    if set(entry) != {"config_id"} or not isinstance(value, int) or isinstance(value, bool) or value < 0:
        return [f"expected {{'config_id': <int >= 0>}}, got {dict(entry)!r}"]
    return []


def _default_triton_block_fp8(m: int, shape: tuple[int, ...], tags: Tags = ()) -> dict[str, int]:
    """Used when no table matches. Small M (decode) is weight-bound: a thin M tile and narrow N
    tiles give more programs over N; large M is compute-bound: 128x128 tiles, 8 warps."""
    if m <= 16:
        bm, bn, group, warps, stages = 16, 64, 1, 4, 4
    elif m <= 32:
        bm, bn, group, warps, stages = 32, 64, 1, 4, 4
    elif m <= 64:
        bm, bn, group, warps, stages = 64, 64, 8, 4, 3
    elif m <= 256:
        bm, bn, group, warps, stages = 64, 128, 8, 4, 3
    else:
        bm, bn, group, warps, stages = 128, 128, 8, 8, 3
    return {
        "BLOCK_SIZE_M": bm,
        "BLOCK_SIZE_N": bn,
        "BLOCK_SIZE_K": 128,
        "GROUP_SIZE_M": group,
        "num_warps": warps,
        "num_stages": stages,
    }


#: a CUDA entry's id meaning "the kernel's own heuristic" (only ever a default, never in a file)
KERNEL_HEURISTIC = -1


def _cuda_kernel_heuristic(m: int, shape: tuple[int, ...], tags: Tags = ()) -> dict[str, int]:
    """No table: the CUDA kernel picks by its tested heuristic (``default_config`` in its unit)."""
    return {"config_id": KERNEL_HEURISTIC}


def _check_select(entry: Mapping[str, Any], tags: Tags = ()) -> list[str]:
    value = entry.get("backend")
    if set(entry) != {"backend"} or not isinstance(value, str) or not re.fullmatch(r"[a-z][a-z0-9_]*", value):
        return [f"expected {{'backend': '<backend name>'}}, got {dict(entry)!r}"]
    return []


def _check_skinny(entry: Mapping[str, Any], tags: Tags = ()) -> list[str]:
    """Problems with one entry of the skinny-M GEMM kernel's table (``ops/gemm/_skinny_launch``)."""
    from .ops.gemm._skinny_launch import problems  # plain Python

    return problems(entry)


def _default_skinny(m: int, shape: tuple[int, ...], tags: Tags = ()) -> dict[str, int]:
    """The skinny-M kernel's launch without a table (``_skinny_launch.default_launch``)."""
    from .ops.gemm._skinny_launch import default_launch  # plain Python

    return default_launch(m)


def _no_preference(m: int, shape: tuple[int, ...], tags: Tags = ()) -> dict[str, Any]:
    """No measurement for this shape: the device's declared priority decides."""
    return {}


#: the shape of a select table measured over every tuned shape (size classes by M alone)
ANY_SHAPE = 0


#: the tags of the block-fp8 form of vLLM's fused-MoE tables (and of every block-fp8 GEMM table)
FP8_BLOCK_TAGS: Tags = (("dtype", "fp8_w8a8"), ("block_shape", "[128,128]"))
#: keys vLLM's / SGLang's fused-MoE files may carry that this kernel has no use for (split-K,
#: ROCm compiler hints, SGLang's TMA switch), each with its type: read and ignored
IGNORED_MOE_KEYS: Mapping[str, type] = MappingProxyType(
    {"SPLIT_K": int, "kpack": int, "matrix_instr_nonkdim": int, "waves_per_eu": int, "USE_TMA": bool}
)


def _moe_fp8(tags: Tags) -> bool:
    return dict(tags).get("dtype") == "fp8_w8a8"


#: opmux's own key of a fused-MoE entry: 1 runs the decode path (``fused_experts_decode``: a
#: program per slot and block of weight rows, BLOCK_SIZE_N / BLOCK_SIZE_M its up / down rows)
_MOE_DECODE = "DECODE"


def _check_triton_moe(entry: Mapping[str, Any], tags: Tags = ()) -> list[str]:
    """Problems with one entry of a Triton fused-MoE table (empty: usable); ``tags`` name the
    form (block fp8: ``BLOCK_SIZE_K`` must be 128)."""
    problems = [f"missing {key}" for key in _TRITON_GEMM_KEYS if key not in entry]
    known = (*_TRITON_GEMM_KEYS, _MOE_DECODE)
    unknown = sorted(set(entry) - set(known) - set(IGNORED_MOE_KEYS))
    if unknown:
        problems.append(
            f"unknown key(s) {', '.join(unknown)} (known: {', '.join(known)}; "
            f"read and ignored: {', '.join(IGNORED_MOE_KEYS)})"
        )
    for key, value in entry.items():
        if IGNORED_MOE_KEYS.get(key) is bool:
            if not isinstance(value, bool):
                problems.append(f"{key}={value!r} is not a bool")
        elif key not in unknown and (not isinstance(value, int) or isinstance(value, bool)):
            problems.append(f"{key}={value!r} is not an integer")
    if problems:
        return problems
    block_k = entry["BLOCK_SIZE_K"]
    decode = entry.get(_MOE_DECODE, 0)
    max_k = 1024 if decode else 256  # the decode path's K step is a GEMV's: wider steps pay
    if _moe_fp8(tags):
        if decode and block_k not in (128, 256, 512):
            problems.append(f"BLOCK_SIZE_K={block_k} (128, 256 or 512 for fp8 weights: whole scale blocks)")
        elif not decode and block_k != 128:
            problems.append(
                f"BLOCK_SIZE_K={block_k} (must be 128 for fp8 weights: one K step per scale block)"
            )
    elif not (_pow2(block_k) and 16 <= block_k <= max_k):
        problems.append(f"BLOCK_SIZE_K={block_k} (a power of two in 16..{max_k})")
    if decode not in (0, 1):
        problems.append(f"{_MOE_DECODE}={decode} (0: the grouped path, 1: the decode path)")
    if not decode:
        return problems + _tile_problems(entry)
    # the decode path's row blocks may be thinner than a tensor-core tile (a GEMV per slot);
    # its fp32 partial sums are rows x K step per program (the up kernel keeps two such tiles)
    for key, most in (("BLOCK_SIZE_M", 16384), ("BLOCK_SIZE_N", 8192)):
        if not (_pow2(entry[key]) and 1 <= entry[key] <= 256):
            problems.append(f"{key}={entry[key]} (a power of two in 1..256 on the decode path)")
        elif entry[key] * min(block_k, 128 if _moe_fp8(tags) else block_k) > most:
            problems.append(
                f"{key}={entry[key]} x BLOCK_SIZE_K={block_k}: more than {most} fp32 partial sums per "
                "program on the decode path (registers)"
            )
    if _moe_fp8(tags) and entry["BLOCK_SIZE_N"] < 16:
        problems.append(
            f"BLOCK_SIZE_N={entry['BLOCK_SIZE_N']} (at least 16 for fp8 weights on the decode path: "
            "its products are tensor-core tiles)"
        )
    return problems + [p for p in _tile_problems(entry) if not p.startswith("BLOCK_SIZE_")]


def _default_triton_moe(m: int, shape: tuple[int, ...], tags: Tags = ()) -> dict[str, int]:
    """Used when no table matches (vLLM's ``get_default_config`` in spirit). The tiles cover the
    rows routed to ONE expert (about M * topk / E of them): at decode M those are a few, so a
    16-row M tile and 64-wide N tiles (more programs over N); large M is compute-bound: 64 / 128
    tiles, 8 warps for 128 x 128. K steps: 128 for fp8 (one scale block), else 64 (32 for fp32,
    whose tiles take twice the shared memory). One token: the decode path (a GEMV per slot)."""
    if m <= 32:
        bm, bn, group, warps, stages = 16, 64, 1, 4, 4
    elif m <= 128:
        bm, bn, group, warps, stages = 32, 64, 8, 4, 4
    elif m <= 1024:
        bm, bn, group, warps, stages = 64, 128, 8, 4, 3
    else:
        bm, bn, group, warps, stages = 128, 128, 8, 8, 3
    dtype = dict(tags).get("dtype")
    if m == 1:  # one token: its topk experts' weights read once, two launches (the decode path)
        bk = 128 if _moe_fp8(tags) or dtype == "float32" else 256
        return {
            "BLOCK_SIZE_M": 8,
            "BLOCK_SIZE_N": 16,
            "BLOCK_SIZE_K": bk,
            "GROUP_SIZE_M": 1,
            "num_warps": 4,
            "num_stages": 3,
            _MOE_DECODE: 1,
        }
    bk = 128 if _moe_fp8(tags) else 32 if dtype == "float32" else 64
    return {
        "BLOCK_SIZE_M": bm,
        "BLOCK_SIZE_N": bn,
        "BLOCK_SIZE_K": bk,
        "GROUP_SIZE_M": group,
        "num_warps": warps,
        "num_stages": stages,
    }


def _check_cuda_moe(entry: Mapping[str, Any], tags: Tags = ()) -> list[str]:
    """Problems with one entry of the native decode kernels' table (``ops/moe/_decode_split``)."""
    from .ops.moe._decode_split import problems  # plain Python

    return problems(entry)


def _default_cuda_moe(m: int, shape: tuple[int, ...], tags: Tags = ()) -> dict[str, int]:
    """The native decode kernels' columns per warp without a table (``_decode_split.default_split``)."""
    from .ops.moe._decode_split import KEYS, default_split  # plain Python

    return dict(zip(KEYS, default_split(m), strict=True))


def _moe_kernel_problem(out: Any, hidden: Any, w1: Any, w2: Any, *rest: Any) -> tuple[tuple[int, ...], int]:
    """(E, N) and M: E the local experts, N = w2.shape[2] (the intermediate size per shard)."""
    return (w1.shape[0], w2.shape[2]), hidden.shape[0]


def _moe_kernel_tags(out: Any, hidden: Any, w1: Any, *rest: Any) -> Tags:
    """vLLM's file-name form: fp8 block weights ``dtype=fp8_w8a8,block_shape=[128,128]``, fp32
    ``dtype=float32``, bf16 / fp16 none."""
    if str(w1.dtype) == "torch.float8_e4m3fn":
        return FP8_BLOCK_TAGS
    return (("dtype", "float32"),) if str(hidden.dtype) == "torch.float32" else ()


def _moe_call_problem(
    hidden: Any, w1: Any, w2: Any, *rest: Any, **kwargs: Any
) -> tuple[tuple[int, ...], int]:
    """(E, N) and M of a public call (the measured selection's key)."""
    return (w1.shape[0], w2.shape[2]), hidden.shape[0]


def _moe_call_tags(hidden: Any, w1: Any, *rest: Any, **kwargs: Any) -> Tags:
    """The form's tags of a public call (as ``_moe_kernel_tags``)."""
    return _moe_kernel_tags(None, hidden, w1)


def _gemm_kernel_problem(out: Any, a: Any, b: Any, *rest: Any) -> tuple[tuple[int, ...], int]:
    return (b.shape[0], a.shape[1]), a.shape[0]


def _gemm_call_problem(a: Any, b: Any, *rest: Any, **kwargs: Any) -> tuple[tuple[int, ...], int]:
    k = a.shape[-1]
    return (b.shape[0], k), a.numel() // k if k else 0


#: a paged-prefill Triton launch: query x key tile, warps, stages, and SPLIT (the key tiles below
#: the diagonal unmasked: _prefill_triton's kernel)
_PREFILL_KEYS = ("BLOCK_M", "BLOCK_N", "num_warps", "num_stages")


def _check_triton_prefill(entry: Mapping[str, Any], tags: Tags = ()) -> list[str]:
    """Problems with one entry of a paged-prefill Triton table (empty: usable)."""
    problems = _key_problems(entry, _PREFILL_KEYS, ("SPLIT",))
    if problems:
        return problems
    problems = _tile_problems(entry, ("BLOCK_M", "BLOCK_N"))
    if entry.get("SPLIT", 0) not in (0, 1):
        problems.append(f"SPLIT={entry['SPLIT']} (0 or 1)")
    return problems


def _default_triton_prefill(m: int, shape: tuple[int, ...], tags: Tags = ()) -> dict[str, int]:
    """``_prefill_triton.tile_config``'s 16-bit tile for (padded value head dim, GQA group)."""
    from .ops.attention._prefill_tile_config import tile_config  # plain Python

    bm, bn, warps, stages = tile_config(shape[0], shape[1])
    return {"BLOCK_M": bm, "BLOCK_N": bn, "num_warps": warps, "num_stages": stages, "SPLIT": 0}


def _attention_problem(query: Any, key_cache: Any, value_cache: Any) -> tuple[tuple[int, ...], int]:
    """((the value head dim padded to a power of two >= 16, the GQA group), query rows): the
    caches' logical shape is [blocks, page, Hkv, D] in either memory layout."""
    dv, g = value_cache.shape[3], query.shape[1] // key_cache.shape[2]
    return (max(16, 1 << max(dv - 1, 0).bit_length()), g), query.shape[0]


def _prefill_kernel_problem(
    out: Any, lse: Any, has_lse: Any, query: Any, key_cache: Any, value_cache: Any, *rest: Any
) -> tuple[tuple[int, ...], int]:
    return _attention_problem(query, key_cache, value_cache)


def _attention_call_problem(
    query: Any, key_cache: Any, value_cache: Any, *rest: Any, **kwargs: Any
) -> tuple[tuple[int, ...], int]:
    """A call's problem for its ``select`` table: M the query rows (prefill: the new tokens;
    decode: the batch, the one size a CUDA graph fixes: the contexts live on the GPU)."""
    return _attention_problem(query, key_cache, value_cache)


#: a paged-decode Triton launch: key tile rows, warps, stages; PREFETCH (the register double
#: buffer, 0 / 1) and WAVES (the split count's wave target: ``_decode_tile_config.num_splits``)
_DECODE_KEYS = ("BLOCK_N", "num_warps", "num_stages")
_DECODE_OPTIONAL = ("PREFETCH", "WAVES")


def _check_triton_decode(entry: Mapping[str, Any], tags: Tags = ()) -> list[str]:
    """Problems with one entry of a paged-decode Triton table (empty: usable)."""
    problems = _key_problems(entry, _DECODE_KEYS, _DECODE_OPTIONAL)
    if problems:
        return problems
    problems = _tile_problems(entry, ("BLOCK_N",))
    if entry.get("PREFETCH", 0) not in (0, 1):
        problems.append(f"PREFETCH={entry['PREFETCH']} (0 or 1)")
    if not 1 <= entry.get("WAVES", 1) <= 16:
        problems.append(f"WAVES={entry['WAVES']} (1..16 programs an SM)")
    return problems


def _default_triton_decode(m: int, shape: tuple[int, ...], tags: Tags = ()) -> dict[str, int]:
    """``triton_kernels.tile_config``'s plain tile for the padded value head dim; no ``WAVES``:
    the launch's split rule then (``wave_target``'s programs an SM, over the device's SM count,
    which a torch-free default cannot know), as without a table."""
    from .ops.attention._decode_tile_config import tile_config  # plain Python

    block_n, warps, stages, prefetch = tile_config(shape[0])
    return {"BLOCK_N": block_n, "num_warps": warps, "num_stages": stages, "PREFETCH": int(prefetch)}


def _decode_kernel_problem(
    out: Any, lse: Any, has_lse: Any, query: Any, key_cache: Any, value_cache: Any, *rest: Any
) -> tuple[tuple[int, ...], int]:
    """((the value head dim padded to a power of two >= 16, the GQA group), the programs of one
    split: sequences x KV head chunks). M is the split rule's own input (the programs an SM
    holds, split by M), and the best split count followed it: on an H100 the count that fills one
    round of resident programs was within 2.2% of the best in 9 cases from 512 to 32k positions
    (docs/benchmarks/attention_decode_splits_h100_s34.json); the context, which M leaves out,
    moved it less."""
    from .ops.attention._decode_tile_config import programs  # plain Python

    dv, g = value_cache.shape[3], query.shape[1] // key_cache.shape[2]
    block_dv = max(16, 1 << max(dv - 1, 0).bit_length())
    return (block_dv, g), programs(query.shape[0], key_cache.shape[2], g, block_dv)


def _sampling_call_problem(rows: Any, *rest: Any, **kwargs: Any) -> tuple[tuple[int, ...], int]:
    """((V,), B) of a sampling call: the vocabulary and the batch (the one size a CUDA graph fixes;
    the per-row k / p live on the GPU)."""
    return (rows.shape[1],), rows.shape[0]


#: every sampling op's tables: select only, per vocabulary
_SAMPLING_SCHEMA = Schema(
    shape=("V",),
    tags=(),
    entries={"select": _check_select},
    defaults={"select": _no_preference},
    call_problem=_sampling_call_problem,
)


#: Each op with tuned tables. A new op or backend adds its entry here.
SCHEMAS: Mapping[str, Schema] = {
    "gemm.w8a8_block_fp8_matmul": Schema(
        shape=("N", "K"),
        tags=FP8_BLOCK_TAGS,
        entries={
            "triton": _check_triton_block_fp8,
            "cuda": _check_config_id,
            "skinny": _check_skinny,
            "select": _check_select,
        },
        defaults={
            "triton": _default_triton_block_fp8,
            "cuda": _cuda_kernel_heuristic,
            "skinny": _default_skinny,
            "select": _no_preference,
        },
        kernel_problem=_gemm_kernel_problem,
        call_problem=_gemm_call_problem,
    ),
    "moe.fused_experts": Schema(
        shape=("E", "N"),
        tags=(),
        entries={"triton": _check_triton_moe, "cuda": _check_cuda_moe, "select": _check_select},
        defaults={"triton": _default_triton_moe, "cuda": _default_cuda_moe, "select": _no_preference},
        kernel_problem=_moe_kernel_problem,
        call_problem=_moe_call_problem,
        form_tags=("dtype", "block_shape"),
        kernel_tags=_moe_kernel_tags,
        call_tags=_moe_call_tags,
    ),
    # the Triton launch of 16-bit queries (fp32 ones keep tile_config's correctness tile); the
    # backend measured fastest per (DV, G) and new tokens (benchmarks/bench_attention_prefill.py
    # --select-out: FlashInfer's batch prefill where it wins)
    "attention.paged_prefill": Schema(
        shape=("DV", "G"),
        tags=(),
        entries={"triton": _check_triton_prefill, "select": _check_select},
        defaults={"triton": _default_triton_prefill, "select": _no_preference},
        kernel_problem=_prefill_kernel_problem,
        call_problem=_attention_call_problem,
    ),
    # the Triton split kernel of 16-bit caches and queries, value head dims <= 128, no key tail
    # (the forms the H200 sweep timed; the others keep tile_config and the wave rule); the backend
    # measured fastest per (DV, G) and batch (benchmarks/bench_attention_decode.py --select-out:
    # the native unit where it beats Triton in CUDA graphs)
    "attention.paged_decode": Schema(
        shape=("DV", "G"),
        tags=(),
        entries={"triton": _check_triton_decode, "select": _check_select},
        defaults={"triton": _default_triton_decode, "select": _no_preference},
        kernel_problem=_decode_kernel_problem,
        call_problem=_attention_call_problem,
    ),
    # the backend measured fastest per vocabulary and batch (benchmarks/bench_sampling.py
    # --select-out: the native unit where it beats FlashInfer's samplers in CUDA graphs)
    **{
        f"sampling.{name}": _SAMPLING_SCHEMA
        for name in (
            "top_k_renorm_probs",
            "top_p_renorm_probs",
            "top_k_mask_logits",
            "top_k_top_p_sampling_from_probs",
        )
    },
}


def _schema_for(op: str) -> Schema:
    try:
        return SCHEMAS[op]
    except KeyError:
        raise ValueError(
            f"no tuned-config schema for op {op!r}; ops with one: {', '.join(SCHEMAS)}"
        ) from None


def _entry_check(op: str, backend: str) -> Callable[[Mapping[str, Any], Tags], list[str]]:
    schema = _schema_for(op)
    try:
        return schema.entries[backend]
    except KeyError:
        raise ValueError(
            f"no tuned-config schema for {op} backend {backend!r}; backends: {', '.join(schema.entries)}"
        ) from None


def table_key(
    op: str, backend: str, device_name: str, shape: tuple[int, ...], tags: Tags | None = None
) -> TableKey:
    """The key of ``op``'s table for ``shape`` (in the schema's order, e.g. ``(N, K)``) and form
    (``tags``; None: the schema's ``tags``)."""
    schema = _schema_for(op)
    _entry_check(op, backend)
    if len(shape) != len(schema.shape):
        raise ValueError(f"{op}: shape {shape} does not match ({', '.join(schema.shape)})")
    tags = schema.tags if tags is None else tags
    unknown = [name for name, _ in tags if name not in schema.tag_names()]
    if unknown:
        raise ValueError(f"{op}: tag(s) {', '.join(unknown)} not among {', '.join(schema.tag_names())}")
    return TableKey(op, backend, device_name, tuple(zip(schema.shape, shape, strict=True)), tags)


def validate_entry(op: str, backend: str, entry: Any, tags: Tags | None = None) -> list[str]:
    """Problems with one table entry of the form ``tags`` (None: the schema's; empty when usable)."""
    if not isinstance(entry, Mapping):
        return [f"entry {entry!r} is not an object"]
    check = _entry_check(op, backend)
    return check(entry, _schema_for(op).tags if tags is None else tags)


def read_table(path: Path, key: TableKey) -> dict[int, Config]:
    """Read and validate one table file; :class:`TableError` naming the file when unusable."""
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise TableError(str(path), f"unreadable ({err})") from None
    if not isinstance(raw, dict) or not raw:
        raise TableError(str(path), 'expected a non-empty object {"<M>": {...}, ...}')
    table: dict[int, Config] = {}
    for m_text, entry in raw.items():
        try:
            m = int(m_text)
        except ValueError:
            m = -1
        if m < 0:
            raise TableError(str(path), f"key {m_text!r} is not a batch size M >= 0")
        problems = validate_entry(key.op, key.backend, entry, key.tags)
        if problems:
            raise TableError(str(path), f"M={m_text}: " + "; ".join(problems))
        table[m] = MappingProxyType(dict(entry))
    return dict(sorted(table.items()))


def write_table(path: Path, table: Mapping[int, Mapping[str, int]]) -> None:
    """Write a table atomically (a private temp file, then ``os.replace``), keys ascending."""
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps({str(m): dict(table[m]) for m in sorted(table)}, indent=4) + "\n"
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def shipped_dir(op: str) -> Path:
    """Where the wheel's tables of ``op`` live."""
    return Path(__file__).resolve().parent / "configs" / op


def search_dirs(op: str) -> list[tuple[Path, bool]]:
    """The directories searched for ``op``'s tables, in order, each with whether it is the
    user's (a bad user file warns; a bad shipped file is a bug the tests catch)."""
    dirs: list[tuple[Path, bool]] = []
    user = _user_dir()
    if user is not None:
        dirs += [(user / op, True), (user, True)]
    dirs.append((shipped_dir(op), False))
    return dirs


class _State:
    # the user dir is read once (hot path); refresh() forgets it, the tables and the results
    user_dir: Path | None = None
    user_dir_read = False
    index: ClassVar[dict[tuple[str, Path], dict[TableKey, Path]]] = {}
    # a table's entries; None where reject() took one out
    tables: ClassVar[dict[TableKey, tuple[list[int], list[Config | None]] | None]] = {}
    results: ClassVar[dict[tuple[str, str, str, tuple[int, ...], int, Tags | None], Config]] = {}
    memos: ClassVar[list[dict[Any, Any]]] = []


_MAX_RESULTS = 1 << 16


def refresh() -> None:
    """Forget the user directory, the tables read and the lookups made (reread on next use), and
    tell the listeners (dispatch: a choice cached where no select table spoke may be stale)."""
    _State.user_dir = None
    _State.user_dir_read = False
    _State.index = {}
    _State.tables = {}
    _State.results = {}
    for memo in _State.memos:
        memo.clear()
    for listener in _REFRESH_LISTENERS:
        listener()


_REFRESH_LISTENERS: list[Callable[[], None]] = []


def on_refresh(listener: Callable[[], None]) -> None:
    """Call ``listener`` after every :func:`refresh`."""
    _REFRESH_LISTENERS.append(listener)


def memo() -> dict[Any, Any]:
    """A dict for a reader's results derived from the tables: emptied by :func:`refresh`."""
    table: dict[Any, Any] = {}
    _State.memos.append(table)
    return table


_env.on_change(refresh)


def _user_dir() -> Path | None:
    if not _State.user_dir_read:
        _State.user_dir = _env.get(_env.TUNED_CONFIG_DIR)
        _State.user_dir_read = True
    return _State.user_dir


def _dir_index(op: str, directory: Path) -> dict[TableKey, Path]:
    # per op: a vLLM folder holds several ops' files (MoE and GEMM tables side by side)
    index = _State.index.get((op, directory))
    if index is None:
        index = {}
        try:
            names = sorted(os.listdir(directory))
        except OSError:
            names = []
        for name in names:
            if not name.endswith(".json"):
                continue
            try:
                index.setdefault(TableKey.parse(op, name), directory / name)
            except ValueError:
                continue  # another op's file (vLLM's folders mix MoE and GEMM tables)
        _State.index[(op, directory)] = index
    return index


_HAS_TABLES: dict[tuple[str, str, str], bool] = memo()


def has_tables(op: str, backend: str, device_name: str) -> bool:
    """Whether any directory along :func:`search_dirs` holds a ``backend`` table of ``op`` for
    this device (memoised until :func:`refresh`): the readers' fast exit where none exists."""
    memo_key = (op, backend, device_name)
    found = _HAS_TABLES.get(memo_key)
    if found is None:
        found = any(
            k.backend == backend and k.device_name == device_name
            for directory, _ in search_dirs(op)
            for k in _dir_index(op, directory)
        )
        _HAS_TABLES[memo_key] = found
    return found


def find_table(key: TableKey) -> tuple[Path, dict[int, Config]] | None:
    """The first usable table for ``key`` along :func:`search_dirs` (warning for each skipped
    user file), or None."""
    for directory, user in search_dirs(key.op):
        path = _dir_index(key.op, directory).get(key)
        if path is None:
            continue
        try:
            return path, read_table(path, key)
        except TableError as err:
            if not user:
                raise
            warnings.warn(
                f"opmux: ignoring tuned config {err.path}: {err.reason}; "
                f"looking further ({', '.join(str(d) for d, _ in search_dirs(key.op))}), "
                "then the default heuristic",
                TunedConfigWarning,
                stacklevel=3,
            )
    return None


def table_entries(key: TableKey, m: int) -> list[Config]:
    """The entry for ``m`` of every usable table for ``key`` along :func:`search_dirs` (the
    user's first, then the shipped one; each the nearest M within reach): what a retune times
    before its own space, so that it never keeps a configuration slower than one it could read
    (a user's copy of vLLM's files, the wheel's own)."""
    found: list[Config] = []
    for directory, _user in search_dirs(key.op):
        path = _dir_index(key.op, directory).get(key)
        if path is None:
            continue
        try:
            table = read_table(path, key)
        except TableError:
            continue  # find_table warns about it on the hot path
        keys = sorted(table)
        entry = _config_entry((keys, [table[k] for k in keys]), m)
        if entry is not None and entry not in found:
            found.append(entry)
    return found


def nearest(keys: list[int], m: int) -> int:
    """Index of the key nearest ``m`` in ascending ``keys`` (the smaller one on a tie)."""
    i = bisect.bisect_left(keys, m)
    if i == 0:
        return 0
    if i == len(keys):
        return i - 1
    return i - 1 if m - keys[i - 1] <= keys[i] - m else i


def nearest_ratio(keys: list[int], m: int) -> int:
    """Index of the key nearest ``m`` by ratio (|log(key / m)|, M = 0 counted as 1; the smaller
    key on a tie): how far a measured backend choice carries (:data:`SELECT_REACH`) is a ratio,
    so the entry that speaks for ``m`` is the nearest one by ratio too. Launch configurations
    keep vLLM's absolute nearest M (:func:`nearest`), so its tables read the same here."""
    want = max(m, 1)
    return min(range(len(keys)), key=lambda i: (abs(math.log(max(keys[i], 1) / want)), keys[i]))


def default_config(
    op: str, backend: str, m: int, shape: tuple[int, ...], tags: Tags | None = None
) -> dict[str, Any]:
    """The op's heuristic configuration when no table matches (for the form ``tags``; None: the
    schema's)."""
    _entry_check(op, backend)
    schema = _schema_for(op)
    return schema.defaults[backend](m, shape, schema.tags if tags is None else tags)


def lookup(
    op: str, backend: str, device_name: str, shape: tuple[int, ...], m: int, tags: Tags | None = None
) -> Config:
    """The launch configuration of ``op`` on ``backend`` for ``shape`` (schema order, e.g.
    ``(N, K)``), batch size ``m`` and form ``tags`` (None: the schema's ``tags``; an op with
    several forms passes its call's, ``Schema.kernel_tags``): a tuned table's nearest-M entry,
    else the default. Read-only; the same object for the same arguments."""
    memo = (op, backend, device_name, shape, m, tags)
    config = _State.results.get(memo)
    if config is not None:
        return config
    if backend == "select":
        found = _select_table(op, device_name, shape, m, tags)
        entry = None if found is None else found[1][1][nearest_ratio(found[1][0], m)]
    else:
        entry = _config_entry(_table(table_key(op, backend, device_name, shape, tags)), m)
    config = MappingProxyType(default_config(op, backend, m, shape, tags)) if entry is None else entry
    if len(_State.results) >= _MAX_RESULTS:
        _State.results.clear()
    _State.results[memo] = config
    return config


def reject(
    op: str,
    backend: str,
    device_name: str,
    shape: tuple[int, ...],
    m: int,
    tags: Tags | None,
    config: Mapping[str, Any],
    error: BaseException,
) -> Config:
    """A tuned entry the compiler refused on this device (shared memory, registers: a table
    checks its keys, not the chip's limits): warn once, and take the entry out of its table until
    :func:`refresh` (every M it served gets the default for its M), so a bad entry costs one
    failed compile, never a call. Returns the default for ``m``; the caller launches it (and
    raises where the default itself was refused)."""
    default: Config = MappingProxyType(default_config(op, backend, m, shape, tags))
    if dict(default) == dict(config):
        return default  # the default itself refused: nothing to fall back to
    where = source(op, backend, device_name, shape, m, tags)
    table = _table(table_key(op, backend, device_name, shape, tags))
    if table is not None:
        table[1][:] = [None if e is not None and dict(e) == dict(config) else e for e in table[1]]
    _State.results.clear()
    for derived in _State.memos:  # readers' results built on the refused entry
        derived.clear()
    warn_at_caller(
        f"{op} ({backend}) on {device_name}: the tuned entry {dict(config)} for shape {shape}, "
        f"M={m} ({where}) does not compile here "
        f"({type(error).__name__}: {str(error)[:200]}); running the default {dict(default)}",
        TunedConfigWarning,
    )
    return default


#: a measurement (a backend choice, a launch configuration) stands for batch sizes within this
#: factor of the M it was measured at: a table tuned only in part never carries a decode
#: measurement to prefill (the size classes, the default heuristic or the declared priority
#: decide there). vLLM's tables (M = 1 .. 4096, neighbours at most 2x apart) are read as vLLM
#: reads them up to M = 16384.
SELECT_REACH = 4


def _within_reach(key: int, m: int) -> bool:
    k, want = max(key, 1), max(m, 1)
    return k <= SELECT_REACH * want and want <= SELECT_REACH * k


def _config_entry(table: tuple[list[int], list[Config | None]] | None, m: int) -> Config | None:
    """A launch-configuration table's entry for ``m``: vLLM's nearest M (absolute distance),
    if within reach; None (the default heuristic) otherwise."""
    if table is None:
        return None
    i = nearest(table[0], m)
    return table[1][i] if _within_reach(table[0][i], m) else None


def _select_table(
    op: str, device_name: str, shape: tuple[int, ...], m: int, tags: Tags | None = None
) -> tuple[TableKey, tuple[list[int], list[Config | None]]] | None:
    """The ``select`` table of the form ``tags`` that speaks for ``m``: the shape's, else the
    size classes over every shape, each only where its nearest M is within
    :data:`SELECT_REACH` of ``m``."""
    for key in (
        table_key(op, "select", device_name, shape, tags),
        table_key(op, "select", device_name, (ANY_SHAPE,) * len(shape), tags),
    ):
        table = _table(key)
        if table is not None and _within_reach(table[0][nearest_ratio(table[0], m)], m):
            return key, table
    return None


def _table(key: TableKey) -> tuple[list[int], list[Config | None]] | None:
    if key not in _State.tables:
        found = find_table(key)
        _State.tables[key] = None if found is None else (list(found[1]), list(found[1].values()))
    return _State.tables[key]


def source(
    op: str,
    backend: str,
    device_name: str,
    shape: tuple[int, ...],
    m: int | None = None,
    tags: Tags | None = None,
) -> str:
    """Where :func:`lookup` takes ``op``'s entries for ``shape`` (and batch size ``m`` when
    given; form ``tags`` as there) from: a file's path, or ``"default"`` (for ``explain``).
    Without ``m``: the file that would speak for some M (select: the shape's table, else the
    size classes)."""
    if backend == "select" and m is not None:
        picked = _select_table(op, device_name, shape, m, tags)
        keys = [] if picked is None else [picked[0]]
    elif m is not None and _config_entry(_table(table_key(op, backend, device_name, shape, tags)), m) is None:
        keys = []
    else:
        keys = [table_key(op, backend, device_name, shape, tags)]
        if backend == "select":
            keys.append(table_key(op, backend, device_name, (ANY_SHAPE,) * len(shape), tags))
    for key in keys:
        found = find_table(key)
        if found is not None:
            return str(found[0])
    return "default"


_DEVICE_NAMES: dict[tuple[str, int | None], str] = {}


def device_name(device: Any) -> str:
    """The name tables are keyed by for a torch device: vLLM's
    ``torch.cuda.get_device_name().replace(" ", "_")`` (``NVIDIA_H200``), ``cpu`` for the host.
    Memoized per device (the driver query is not free); torch is imported only by a caller."""
    memo = (device.type, device.index)
    name = _DEVICE_NAMES.get(memo)
    if name is None:
        if device.type == "cpu":
            name = "cpu"
        else:
            import torch

            name = torch.cuda.get_device_name(device).replace(" ", "_")
        _DEVICE_NAMES[memo] = name
    return name


def shipped_tables() -> Iterable[tuple[Path, TableKey]]:
    """Every file under the shipped ``configs/`` with its parsed key (ValueError if a name is
    not a table of its folder's op): for the test that validates what ships."""
    root = Path(__file__).resolve().parent / "configs"
    if not root.is_dir():
        return
    for op_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for path in sorted(op_dir.iterdir()):
            yield path, TableKey.parse(op_dir.name, path.name)
