"""CUTLASS backend of ``moe.fused_experts``: the fp8 block-scaled form on sm_90a (Hopper).

The grouped GEMMs are CUTLASS's sm90 ptr-array kernel with blockwise fp8 scaling, one group per
local expert (``jit/csrc/moe_grouped_cuda.cu`` lists its two tile configs and the layouts it
needs); the steps between them are opmux's own ops, so the arithmetic is the Triton backend's:

1. ``quantization.per_token_group_quant_fp8(hidden, 128)``: e4m3 rows, 1x128 scales;
2. ``moe_grouped_route_cuda``: from ``topk_ids`` (and ``expert_map``) the rows of each local
   expert, compact (``R`` valid slots of ``M * topk``, no padding), on the device: per-expert
   exclusive offsets and each slot's row (-1 for an id outside its range or mapped to -1: it
   goes nowhere and nothing reads out of bounds). No host synchronisation: CUDA-graph safe;
3. ``moe_grouped_gather_cuda``: each slot's quantized token row and its scales into expert order;
4. the first grouped GEMM, ``[R, K] x w1[e]^T -> [R, 2N]`` in ``hidden``'s dtype (one rounding);
5. ``activation.<act>_and_mul`` (fp32, one rounding), then step 1's quantization of its rows;
6. the second grouped GEMM, ``[R, N] x w2[e]^T``, in column chunks of width ``<= 2N`` written
   into step 4's buffer, each chunk summed into ``out``'s columns by ``moe_grouped_reduce_cuda``
   (the ``topk`` terms of a token in fp32, in order, rounded once; 0 where none).

The routed weight multiplies the fp32 accumulator before its one rounding, as the definition
says (``_experts.reference``): it is folded into the activation scales of the weighted product
(``moe_grouped_scale_cuda``: ``a_scale[r, :] *= w``; with ``apply_router_weight_on_input``
the gather folds it into the first product's). ``acc * (s_a w) * s_b`` equals ``(acc * s_a *
s_b) * w`` up to fp32 rounding, far below one step of the output dtype.

Allocated per call (``S = M * topk``; sizes in bytes, ``d`` = 2 for bf16 / fp16):
``M K + 4 M K / 128`` (hidden quantized, freed after the gather), ``4 (E + 1 + S)`` (routing),
``S K + 4 S K / 128`` (gathered rows, freed after the first product), ``d S 2N`` (the first
product, then every chunk of the second: the largest intermediate, the reference's
``[M * topk, 2N]``), ``d S N`` (the activation, freed once quantized), ``S N + 4 S N / 128``
(its quantization); per GEMM a workspace of about ``200 E`` bytes plus CUTLASS's TMA descriptors
(3 x 128 bytes per SM). The gathered rows are the largest fp8 buffer: ``S K <= d S 2N`` is why
``K <= 4N`` is required (2-byte dtypes).

Where it runs (``supports``, the backend's predicate, says why not otherwise): CUDA sm_90 with
the sm_90a image, ``w1`` float8_e4m3fn (the bf16 / fp16 form is refused: the next backend runs
it), ``hidden`` bf16 or fp16, ``K`` and ``N`` multiples of 128, ``K <= 4N``, at most 4096 local
experts, contiguous weights.

Why a vendor-style backend (``"cutlass"``, with a ``Requirement`` like the gemm's
``scaled_mm``) and not the op's native one: the native backend is by convention the function
``fused_experts_cuda`` of the group's unit ``moe_cuda``; putting CUTLASS there would add minutes
to the compile of every moe kernel (routing included) and tie the fp8 form's library to it.
This backend loads its own unit, ``moe_grouped_cuda``: from the wheel's AOT library when it has
the functions, else JIT-compiled once (a failed build or a disabled JIT raises
``BackendUnavailable``: dispatch falls back to the next backend under ``OPMUX_FALLBACK``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from ...errors import BackendUnavailable, CallRefused

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

BACKEND = "cutlass"
#: the weight-block edge and activation group size of the fp8 form
BLOCK = 128
#: the route kernel's shared memory: two counters per local expert
MAX_EXPERTS = 4096
#: GEMM configs of the unit (``moe_grouped_cuda.cu``): 0 cooperative 128x128 (many rows per
#: expert), 1 swap-AB ping-pong 128x32 (few)
COOPERATIVE, SWAP_AB = 0, 1
#: rows per local expert (on average) up to which the swap-AB config is the default: its
#: 32-row tiles read each weight tile once per 32 rows where the 128-row tiles would waste 3/4
#: of their MMAs (SGLang switches at 2048 rows in all, i.e. 8 per expert for E = 256; to be
#: measured: benchmarks/check_moe_cutlass.py times both)
SWAP_AB_MAX_ROWS = 48
_FUNCTIONS = ("route", "gather", "scale", "gemm", "reduce")


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def chunk_plan(k: int, n2: int) -> tuple[tuple[int, int], ...]:
    """The second product's column chunks ``(start, width)``: as few as fit a ``[rows, 2N]``
    buffer (``width <= n2``), of near-equal widths in whole 128-blocks (K = 7168, 2N = 4096:
    two of 3584). ``k`` and ``n2`` are multiples of 128."""
    if k <= 0 or n2 <= 0 or k % BLOCK or n2 % BLOCK:
        raise ValueError(f"chunk_plan: K={k} and 2N={n2} must be positive multiples of {BLOCK}")
    count = _cdiv(k, n2)
    width = _cdiv(_cdiv(k, count), BLOCK) * BLOCK
    return tuple((c0, min(width, k - c0)) for c0 in range(0, k, width))


def default_config(rows: int, experts: int) -> int:
    """The GEMM config for ``rows`` slots over ``experts`` local experts (both products)."""
    return SWAP_AB if rows <= SWAP_AB_MAX_ROWS * experts else COOPERATIVE


def refusal(
    *,
    device: str,
    capability: tuple[int, int] | None,
    w1_dtype: str,
    hidden_dtype: str,
    experts: int,
    n: int,
    k: int,
    contiguous: bool,
) -> str | None:
    """Why the backend cannot run a call with these facts (None: it can). Pure: the predicate
    gathers the facts, tests call this directly."""
    if device != "cuda":
        return f"the CUTLASS grouped GEMM runs on CUDA tensors, not {device}"
    if capability != (9, 0):
        got = "unknown" if capability is None else f"sm_{capability[0]}{capability[1]}"
        return f"the CUTLASS grouped GEMM is built for sm_90a (Hopper) only; this GPU is {got}"
    if w1_dtype != "float8_e4m3fn":
        return (
            f"the CUTLASS backend runs the fp8 block-scaled form only (w1 float8_e4m3fn with 128x128 "
            f"scales); w1 has dtype {w1_dtype}: the next backend runs it"
        )
    if hidden_dtype not in ("bfloat16", "float16"):
        return f"the CUTLASS grouped GEMM writes bfloat16 or float16; hidden has dtype {hidden_dtype}"
    if k % BLOCK or n % BLOCK:
        return f"the CUTLASS grouped GEMM needs K and N multiples of {BLOCK} (K={k}, N={n})"
    if k > 4 * n:
        return (
            f"K={k} > 4N={4 * n}: the gathered fp8 rows [M * topk, K] would outgrow the [M * topk, 2N] "
            f"activation buffer, the op's largest intermediate"
        )
    if experts > MAX_EXPERTS:
        return f"the CUTLASS backend's routing takes at most {MAX_EXPERTS} local experts, got {experts}"
    if not contiguous:
        return "the CUTLASS grouped GEMM needs contiguous w1, w2, w1_scale and w2_scale"
    return None


def supports(
    hidden: Any,
    w1: Any,
    w2: Any,
    topk_weights: Any = None,
    topk_ids: Any = None,
    activation: Any = "silu",
    apply_router_weight_on_input: Any = False,
    expert_map: Any = None,
    w1_scale: Any = None,
    w2_scale: Any = None,
    vllm_rounding: Any = False,
    out: Any = None,
) -> str | None:
    """The backend's predicate (the op's public arguments): None to run, else the reason. It runs
    on every call (the dispatch asks it): the GPU's capability is read once per device and the
    verdict once per set of facts."""
    try:
        device = hidden.device
        capability = None
        if device.type == "cuda":
            capability = _capability(
                device.index if device.index is not None else torch.cuda.current_device()
            )
        contiguous = all(t is None or t.is_contiguous() for t in (w1, w2, w1_scale, w2_scale))
        return _verdict(
            device.type, capability, w1.dtype, hidden.dtype, int(w1.shape[0]), int(w2.shape[-1]),
            int(hidden.shape[-1]), contiguous,
        )  # fmt: skip
    except Exception:  # not tensors, wrong ranks: the contract names the problem
        return None


@functools.cache
def _capability(index: int) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


@functools.lru_cache(maxsize=256)
def _verdict(
    device: str,
    capability: tuple[int, int] | None,
    w1_dtype: Any,
    hidden_dtype: Any,
    experts: int,
    n: int,
    k: int,
    contiguous: bool,
) -> str | None:
    return refusal(
        device=device,
        capability=capability,
        w1_dtype=str(w1_dtype).removeprefix("torch."),
        hidden_dtype=str(hidden_dtype).removeprefix("torch."),
        experts=experts,
        n=n,
        k=k,
        contiguous=contiguous,
    )


class _Library:
    """The unit's functions, from the AOT library when it has them, else the JIT module."""

    route: Any
    gather: Any
    scale: Any
    gemm: Any
    reduce: Any

    def __init__(self, get: Callable[[str], Any]) -> None:
        for name in _FUNCTIONS:
            setattr(self, name, get(f"moe_grouped_{name}_cuda"))


@functools.cache
def library() -> _Library:
    """Load ``moe_grouped_cuda`` once per process (``BackendUnavailable`` if it cannot be)."""
    from .._native import unit_functions

    names = tuple(f"moe_grouped_{n}_cuda" for n in _FUNCTIONS)
    return _Library(unit_functions("moe_grouped_cuda", names, BACKEND).__getitem__)


def _activate(activation: str, h: Tensor, out: Tensor, vllm_rounding: bool) -> None:
    from opmux.kernels import ops

    from ._experts import gated_op

    name, kw = gated_op(activation, vllm_rounding)
    getattr(ops.activation, name)(h, out=out, **kw)


def launch_fused_experts(
    out: Tensor,
    hidden: Tensor,
    w1: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    w1_scale: Tensor,
    w2_scale: Tensor,
    expert_map: Tensor,
    activation: str,
    apply_router_weight_on_input: bool,
    configs: Sequence[int] | None = None,
    *,
    vllm_rounding: bool = False,
) -> None:
    """Run the op with explicit GEMM configs ``(first, second)`` (None: ``default_config``);
    arguments as the contract's kernel arguments (already checked). The benchmark's entry."""
    from opmux.kernels import ops

    m, k = hidden.shape
    if m == 0:
        return
    experts, n2, _ = w1.shape
    n = n2 // 2
    topk = topk_ids.shape[1]
    slots = m * topk
    dev, dt = hidden.device, hidden.dtype
    lib = library()
    pdl = True  # sm_90 only: every kernel of the chain waits for its predecessor first
    cfg1, cfg2 = configs if configs is not None else (default_config(slots, experts),) * 2

    ids = topk_ids if topk_ids.stride(-1) == 1 else topk_ids.contiguous()
    tw = topk_weights if topk_weights.stride(-1) == 1 else topk_weights.contiguous()
    offsets = torch.empty(experts + 1, dtype=torch.int32, device=dev)
    inv = torch.empty(slots, dtype=torch.int32, device=dev)
    lib.route(offsets, inv, ids, expert_map, pdl)

    q, qs = ops.quantization.per_token_group_quant_fp8(hidden, BLOCK, divide_by_scale=vllm_rounding)
    a1 = torch.empty((slots, k), dtype=torch.float8_e4m3fn, device=dev)
    sa1 = torch.empty((slots, k // BLOCK), dtype=torch.float32, device=dev)
    lib.gather(a1, sa1, q, qs, inv, tw, apply_router_weight_on_input, pdl)
    del q, qs

    buf = torch.empty(slots * n2, dtype=dt, device=dev)
    h = buf.view(slots, n2)
    lib.gemm(h, a1, sa1, w1, w1_scale, offsets, 0, n2, cfg1, pdl)
    del a1, sa1

    act = torch.empty((slots, n), dtype=dt, device=dev)
    _activate(activation, h, act, vllm_rounding)
    a2, sa2 = ops.quantization.per_token_group_quant_fp8(act, BLOCK, divide_by_scale=vllm_rounding)
    del act
    if not apply_router_weight_on_input:
        lib.scale(sa2, inv, tw, pdl)

    for c0, width in chunk_plan(k, n2):
        y = buf[: slots * width].view(slots, width)
        lib.gemm(y, a2, sa2, w2, w2_scale, offsets, c0, width, cfg2, pdl)
        lib.reduce(out, y, inv, c0, pdl)


def fused_experts(
    out: Tensor,
    hidden: Tensor,
    w1: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    w1_scale: Tensor,
    w2_scale: Tensor,
    expert_map: Tensor,
    activation: str,
    apply_router_weight_on_input: bool,
    vllm_rounding: bool,
) -> None:
    """``out = sum_j w_j * W2[e_j] act(W1[e_j] hidden)`` per the op's contract, fp8 form on
    sm_90a (the kernel arguments, already checked). A call the backend cannot run (forced onto
    it) raises ``CallRefused`` with the reason and computes nothing."""
    why = supports(hidden, w1, w2, w1_scale=w1_scale, w2_scale=w2_scale)
    if why:
        raise CallRefused(BACKEND, why)
    try:
        launch_fused_experts(
            out, hidden, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, expert_map,
            activation, apply_router_weight_on_input, vllm_rounding=vllm_rounding,
        )  # fmt: skip
    except RuntimeError as exc:
        # a library built without an sm_90a image (OPMUX_CUDA_ARCHS=sm_90, an AOT build for
        # other archs): the unit refuses before its first GEMM, so out is untouched and the
        # dispatch may run the next backend
        if _NO_IMAGE in str(exc):
            raise BackendUnavailable(BACKEND, str(exc).splitlines()[0]) from exc
        raise


#: the unit's words when its sm_90a kernels are absent from the loaded image
_NO_IMAGE = "needs sm_90a"
