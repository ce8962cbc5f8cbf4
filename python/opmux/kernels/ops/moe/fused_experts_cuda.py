"""Native CUDA backend of ``moe.fused_experts`` for the decode regime: GEMVs on the CUDA cores
in opmux's own unit ``moe_decode_cuda`` (``jit/csrc/moe_decode_cuda.cu``: the kernels, their
thread layout and their bounds guarantees).

At decode sizes the op is one read of the touched experts' weights. The Triton decode path
(``fused_experts_decode``) multiplies fp8 weights on the tensor cores with the token as column 0
of a 16-wide tile and reached 0.60 of the copy bandwidth on DeepSeek-V3 fp8 at one token (H200);
these kernels stream the weight rows 16 bytes a lane, several rows and chunks in flight, and
convert e4m3 to float32 exactly on the CUDA cores against the activation staged once per block
in shared memory:

1. fp8 only: ``hidden`` quantized per 1x128 group by ``quantization.per_token_group_quant_fp8``;
2. ``moe_decode_up_cuda``: per slot (token, expert) and output column, the gate and up rows of
   ``w1`` times the token's row (fp32; fp8: per group, times the block scale and the row's group
   scale), each rounded to ``hidden``'s dtype, the gated activation in fp32, one rounding into
   ``act [M * topk, N]``;
3. fp8 only: ``act`` quantized per 1x128 group (the same op);
4. ``moe_decode_down_cuda``: per token and output column, each slot's ``w2`` row times its
   ``act`` row, times the routed weight, rounded to the output dtype; the ``topk`` terms summed
   in fp32 in slot order and rounded once into ``out``.

The arithmetic is the definition's (``_experts.reference``) at the Triton paths' rounding points.
Allocated per call: ``act`` (``M * topk * N`` elements of ``hidden``'s dtype), and for fp8 the two
quantizations (``M * K`` and ``M * topk * N`` bytes plus one float32 per 128). A slot whose expert
is outside ``[0, E)`` or mapped to -1 contributes nothing and nothing is read through its id.

Where it runs (``supports``, the predicate, says why not otherwise): CUDA sm_80+, float16 or
bfloat16 hidden states (the unit instantiates the serving dtypes; Triton runs float32), at most
``MAX_TOKENS`` tokens (each slot reads its expert's weights: beyond a few tokens the grouped
backends share those reads), ``w1`` / ``w2`` float8_e4m3fn with block scales or ``hidden``'s
dtype, rows of whole 16-byte chunks (K and N multiples of 16 elements for fp8, 16 bytes
otherwise), 16-byte aligned weights (and ``hidden`` for the unquantized form), the staged rows
inside the GPU's shared memory (``K``, and ``topk * N``, float32 for fp8).

A vendor-style backend (named ``cuda``, its own ``Requirement``), as ``attention.paged_decode``'s:
the op has no CPU unit (``native=False``) and its own unit keeps this compile out of the
routing unit's. It loads from the wheel's AOT library when it has the functions, else
JIT-compiles the unit once (a failed build or a disabled JIT raises ``BackendUnavailable``:
dispatch falls back under ``OPMUX_FALLBACK``). Ordered after Triton and CUTLASS; a device's select
table (``benchmarks/bench_moe.py --forced cuda,triton,cutlass --select-out``) puts it first where it
was measured faster.

Measured (``docs/benchmarks/moe_decode_cuda_h100.md``, an H100, CUDA graphs): DeepSeek-V3 fp8 at
one token 130 us against the Triton path's 222 (0.90 of the copy bandwidth against 0.53), at two
tokens 243 against 283 with the tuned split (the unit's own choice ran 344); the bf16 shapes at 2
to 8 tokens 0.75-0.97x the Triton path's time; Triton ahead at one token on Qwen3's and
DeepSeek-V3's bf16 shapes and from 16 tokens on. The H100 select and split tables in the wheel
encode that.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ... import tuned
from ...errors import CallRefused

if TYPE_CHECKING:
    import torch
    from torch import Tensor
else:
    from .._torch import torch

OP, BACKEND = "moe.fused_experts", "cuda"
#: the most tokens the decode kernels take (each slot streams its expert's weights)
MAX_TOKENS = 64
#: the most slots per token the unit takes (a bound of its host checks; the token's topk rows must
#: also fit the shared memory, which refuses most calls far below it)
MAX_TOPK = 256
#: the activations' codes in the unit (the Triton kernels' ACT_CODES)
ACT_CODES = {"silu": 0, "gelu": 1, "swigluoai": 5}
#: swigluoai's alpha and limit (gpt-oss's, as the Triton decode path passes them)
OAI_ALPHA, OAI_LIMIT = 1.702, 7.0
_FUNCTIONS = ("moe_decode_up_cuda", "moe_decode_down_cuda")


def smem_bytes(*, fp8: bool, elem: int, k: int, n: int, topk: int) -> tuple[int, int]:
    """Shared memory of the up and down kernels (the unit's sizes): the staged token row (K), the
    token's ``topk`` activation rows (N each), float32 for fp8 (plus a scale per 128)."""
    groups_k, groups_n = -(-k // 128), -(-n // 128)
    up = k * 4 + groups_k * 4 if fp8 else k * elem
    down = topk * (n * 4 + groups_n * 4 if fp8 else n * elem)
    return up, down


def refusal(
    *,
    device: str,
    capability: tuple[int, int] | None,
    w1_dtype: str,
    hidden_dtype: str,
    tokens: int,
    topk: int,
    n: int,
    k: int,
    aligned: bool,
    smem_optin: int,
) -> str | None:
    """Why the backend cannot run a call with these facts (None: it can). Pure: the predicate
    gathers the facts, tests call this directly."""
    if device != "cuda":
        return f"the native CUDA decode kernels run on CUDA tensors, not {device}"
    if capability is None or capability < (8, 0):
        got = "unknown" if capability is None else f"sm_{capability[0]}{capability[1]}"
        return f"the native CUDA decode kernels need sm_80 or newer; this GPU is {got}"
    if hidden_dtype not in ("float16", "bfloat16"):
        return (
            f"the native CUDA decode kernels take float16 or bfloat16 hidden states, not {hidden_dtype} "
            "(the Triton backend runs float32)"
        )
    fp8 = w1_dtype == "float8_e4m3fn"
    if not fp8 and w1_dtype != hidden_dtype:
        return f"the native CUDA decode kernels take float8_e4m3fn weights or hidden's dtype {hidden_dtype}, not {w1_dtype}"
    if tokens > MAX_TOKENS:
        return (
            f"the native CUDA decode kernels take at most {MAX_TOKENS} tokens (each slot streams its expert's "
            f"weights); this call has {tokens}: the grouped backends share those reads"
        )
    if topk > MAX_TOPK:
        return f"the native CUDA decode kernels take topk up to {MAX_TOPK}, got {topk}"
    elem = 1 if fp8 else 2
    unit = 16 // elem
    if k % unit or n % unit:
        return (
            f"the native CUDA decode kernels read weight rows 16 bytes at a time: K and N must be multiples of "
            f"{unit} for {w1_dtype} weights (K={k}, N={n})"
        )
    if not aligned:
        return (
            "the native CUDA decode kernels read 16 bytes at a time: w1 and w2 (and hidden, unquantized) need "
            "16-byte aligned starts, unit last strides and other strides of whole 16-byte units"
        )
    up, down = smem_bytes(fp8=fp8, elem=elem, k=k, n=n, topk=topk)
    if max(up, down) > smem_optin:
        return (
            f"the native CUDA decode kernels stage the token's rows in shared memory: K={k}, topk={topk} x N={n} "
            f"need {max(up, down)} bytes, this GPU allows {smem_optin}"
        )
    return None


def _aligned(t: Any) -> bool:
    unit = 16 // t.element_size()
    last = t.dim() - 1
    return (
        t.data_ptr() % 16 == 0
        and (t.shape[last] <= 1 or t.stride(last) == 1)
        and all(t.shape[i] <= 1 or t.stride(i) % unit == 0 for i in range(last))
    )


def supports(
    hidden: Any,
    w1: Any,
    w2: Any,
    topk_weights: Any = None,
    topk_ids: Any = None,
    *_: Any,
    **__: Any,
) -> str | None:
    """The backend's predicate (the op's public arguments): None to run, else the reason. It runs
    on every call the dispatch considers: the GPU's facts are read once per device and the
    verdict once per set of facts."""
    try:
        device = hidden.device
    except AttributeError:  # not tensors: the contract names the problem
        return None
    capability, optin = None, 0
    if device.type == "cuda":
        try:
            index = device.index if device.index is not None else torch.cuda.current_device()
            capability, optin = _device_facts(index)
        except Exception as exc:  # a GPU whose properties cannot be read: say so, run nothing
            return f"the native CUDA decode kernels could not read the GPU's properties: {type(exc).__name__}: {exc}"
    try:
        fp8 = w1.dtype == torch.float8_e4m3fn
        aligned = _aligned(w1) and _aligned(w2) and (fp8 or _aligned(hidden))
        topk = int(topk_ids.shape[-1]) if topk_ids is not None else 1
        return _verdict(
            device.type, capability, w1.dtype, hidden.dtype, int(hidden.shape[0]), topk,
            int(w2.shape[-1]), int(hidden.shape[-1]), aligned, optin,
        )  # fmt: skip
    except Exception:  # not tensors, wrong ranks: the contract names the problem
        return None


@functools.cache
def _device_facts(index: int) -> tuple[tuple[int, int], int]:
    props = torch.cuda.get_device_properties(index)
    return (props.major, props.minor), int(getattr(props, "shared_memory_per_block_optin", 48 * 1024))


@functools.lru_cache(maxsize=256)
def _verdict(
    device: str,
    capability: tuple[int, int] | None,
    w1_dtype: Any,
    hidden_dtype: Any,
    tokens: int,
    topk: int,
    n: int,
    k: int,
    aligned: bool,
    smem_optin: int,
) -> str | None:
    return refusal(
        device=device,
        capability=capability,
        w1_dtype=str(w1_dtype).removeprefix("torch."),
        hidden_dtype=str(hidden_dtype).removeprefix("torch."),
        tokens=tokens,
        topk=topk,
        n=n,
        k=k,
        aligned=aligned,
        smem_optin=smem_optin,
    )


class _Library:
    """The unit's functions, from the AOT library when it has them, else the JIT module."""

    def __init__(self, get: Callable[[str], Any]) -> None:
        self.up = get("moe_decode_up_cuda")
        self.down = get("moe_decode_down_cuda")


@functools.cache
def library() -> _Library:
    """Load ``moe_decode_cuda`` once per process (``BackendUnavailable`` if it cannot be)."""
    from .._native import unit_functions

    return _Library(unit_functions("moe_decode_cuda", _FUNCTIONS, BACKEND).__getitem__)


def tuned_split(hidden: Tensor, w1: Tensor, w2: Tensor) -> tuple[int, int]:
    """(up, down) columns per warp for this call from the tuned table of its device, shape
    (E, N), M and form (a dict lookup after the first call of a key)."""
    schema = tuned.SCHEMAS[OP]  # the op's one statement of a call's table key (shape, M, form)
    assert schema.kernel_problem is not None and schema.kernel_tags is not None
    shape, m = schema.kernel_problem(None, hidden, w1, w2)
    config = tuned.lookup(
        OP, BACKEND, tuned.device_name(hidden.device), shape, m, schema.kernel_tags(None, hidden, w1)
    )
    return config["UP_ROWS"], config["DOWN_ROWS"]


def launch(
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
    *,
    vllm_rounding: bool = False,
    rows_per_warp: tuple[int, int] | None = None,
) -> None:
    """The unit's two kernels (and, fp8, the two quantizations) on the checked kernel arguments.
    The up / down kernels' columns per warp: ``rows_per_warp`` when given (0: the unit's own
    choice), else the device's tuned table for the shape and M (``UP_ROWS`` / ``DOWN_ROWS``:
    ``python -m opmux.kernels.tune moe.fused_experts --backend cuda`` writes it), else
    ``_decode_split.default_split``."""
    from .fused_experts_decode import quant_groups

    m = hidden.shape[0]
    if m == 0:
        return
    topk = topk_ids.shape[1]
    if topk == 0:  # no slots: every row sums no term
        out.zero_()
        return
    n = w1.shape[1] // 2
    fp8 = w1.dtype == torch.float8_e4m3fn  # the form, as ``supports`` and the unit tell it
    if rows_per_warp is None:
        rows_per_warp = tuned_split(hidden, w1, w2)
    lib = library()
    index = hidden.device.index if hidden.device.index is not None else torch.cuda.current_device()
    pdl = _device_facts(index)[0][0] >= 9  # the unit also checks the binary has griddepcontrol
    # unquantized: the unit reads no scales, the (empty) scale arguments stand in (no allocation)
    x, xs = quant_groups(hidden, vllm_rounding) if fp8 else (hidden, w1_scale)
    act = torch.empty((m * topk, n), dtype=hidden.dtype, device=hidden.device)
    lib.up(
        act, x, xs, w1, w1_scale, topk_weights, topk_ids, expert_map, ACT_CODES[activation],
        apply_router_weight_on_input, vllm_rounding, OAI_ALPHA, OAI_LIMIT, rows_per_warp[0], pdl,
    )  # fmt: skip
    a, as_ = quant_groups(act, vllm_rounding) if fp8 else (act, w2_scale)
    lib.down(
        out, a, as_, w2, w2_scale, topk_weights, topk_ids, expert_map,
        not apply_router_weight_on_input, rows_per_warp[1], pdl,
    )  # fmt: skip


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
    """``out = sum_j w_j * W2[e_j] act(W1[e_j] hidden)`` per the op's contract at decode sizes
    (the kernel arguments, already checked). A call the backend cannot run (forced onto it)
    raises ``CallRefused`` with the reason and computes nothing."""
    why = supports(hidden, w1, w2, topk_weights, topk_ids)
    if why:
        raise CallRefused(BACKEND, why)
    launch(
        out, hidden, w1, w2, topk_weights, topk_ids, w1_scale, w2_scale, expert_map, activation,
        apply_router_weight_on_input, vllm_rounding=vllm_rounding,
    )  # fmt: skip
