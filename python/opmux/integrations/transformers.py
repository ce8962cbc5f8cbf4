"""Swap the RMSNorm, gated-MLP activation, sparse MoE blocks and rotary embedding of Hugging Face
Llama-family models (Llama, Qwen2/3, Mistral, Gemma with its own norm, Mixtral, Qwen3-MoE) for
opmux ops, reversibly.

    from opmux.integrations.transformers import kernelize
    result = kernelize(model)     # says what it swapped (print(result))
    ...
    result.revert()               # the model's own forwards again

Each swap is checked before it is made: the module's own forward and the opmux replacement run
on a probe input and must agree, else the module is left alone and the result says why. The
replacements fall back to the module's own code for calls opmux does not take (grad mode with
trainable weights, dtypes that differ from the weights').

* RMSNorm modules (``*RMSNorm`` with ``weight`` and ``variance_epsilon`` / ``eps``):
  ``layernorm.rmsnorm``, or ``layernorm.gemma_rmsnorm`` where the module scales by
  ``1 + weight`` (found by the probe, not by the name).
* Gated MLPs (``gate_proj``, ``up_proj``, ``down_proj`` without bias, an ``act_fn`` the probe
  identifies as silu, tanh-gelu or erf-gelu): one projection onto ``[gate; up]`` (the two
  weights become views of one tensor: no extra memory) and ``activation.*_and_mul``.
* Sparse MoE blocks (Mixtral, Qwen3-MoE): ``moe.topk_softmax`` (the router's softmax top-k,
  renormalized as the probe finds) and ``moe.fused_experts`` on the experts' ``[E, 2N, K]`` /
  ``[E, K, N]`` weights (transformers 5's 3-d parameters as they are; older per-expert lists
  stacked once). The router logits stay the block's / router's output (aux loss).
* Rotary embedding: the modeling module's ``apply_rotary_pos_emb`` (rotate_half layout) runs
  ``rope.rotary_embedding`` on copies of q and k with the call's cos/sin as the cache.

Attention is not swapped by kernelize: ``register_paged_attention()`` adds an ``"opmux"``
implementation to transformers' attention interface (``model.set_attn_implementation("opmux")``)
that runs over an opmux-owned paged KV cache (``opmux.integrations.paged_cache``); the model is
then called on one packed row of new tokens with the step's cache view (``opmux_step=``), as
examples/generate_paged.py does.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

__all__ = [
    "PAGED_ATTENTION",
    "KernelizeResult",
    "Swap",
    "kernelize",
    "paged_attention_forward",
    "register_paged_attention",
]


@dataclass(frozen=True)
class Swap:
    module: str  # the submodule's name in the model, or the modeling module for rope
    kind: str  # "rmsnorm", "gemma_rmsnorm", "silu_and_mul", ..., "rotary_embedding"
    op: str  # the opmux op now running


@dataclass
class KernelizeResult:
    swaps: list[Swap] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)  # (module, why)
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def revert(self) -> None:
        """Restore every forward (and ``apply_rotary_pos_emb``) this swapped."""
        while self._undo:
            self._undo.pop()()

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for s in self.swaps:
            out[s.kind] = out.get(s.kind, 0) + 1
        return out

    def __str__(self) -> str:
        lines = [f"opmux kernelize: {len(self.swaps)} swaps"]
        lines += [f"  {kind}: {n}" for kind, n in sorted(self.counts().items())]
        lines += [f"  skipped {name}: {why}" for name, why in self.skipped]
        return "\n".join(lines)


def _torch() -> Any:
    import torch

    return torch


# -- RMSNorm ------------------------------------------------------------------------------------
def _eps(module: Any) -> float | None:
    for attr in ("variance_epsilon", "eps", "epsilon"):
        v = getattr(module, attr, None)
        if isinstance(v, float):
            return v
    return None


def _norm_swap(name: str, module: Any, result: KernelizeResult) -> None:
    torch = _torch()
    from opmux.kernels.ops import layernorm

    w = getattr(module, "weight", None)
    eps = _eps(module)
    if not isinstance(w, torch.Tensor) or w.dim() != 1 or eps is None or eps <= 0:
        result.skipped.append((name, "not an RMSNorm with a 1-d weight and a positive eps"))
        return
    original = module.forward
    probe = torch.randn(3, w.shape[0], generator=torch.Generator().manual_seed(0)).to(w.device, w.dtype)
    with torch.no_grad():
        want = original(probe)
        kind = None
        for cand in ("rmsnorm", "gemma_rmsnorm"):
            got = getattr(layernorm, cand)(probe, w.detach(), eps)
            if got.dtype == want.dtype and torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2):
                kind = cand
                break
    if kind is None:
        result.skipped.append((name, "its forward matches neither rmsnorm nor gemma_rmsnorm on a probe"))
        return
    op = getattr(layernorm, kind)

    def forward(self: Any, hidden_states: Tensor) -> Any:
        weight = self.weight
        if hidden_states.dtype != weight.dtype or (
            torch.is_grad_enabled() and (weight.requires_grad or hidden_states.requires_grad)
        ):
            return original(hidden_states)
        return op(hidden_states, weight, eps)

    module.forward = types.MethodType(forward, module)
    result._undo.append(lambda: module.__dict__.pop("forward", None))
    result.swaps.append(Swap(name, kind, f"layernorm.{kind}"))


# -- gated MLP ----------------------------------------------------------------------------------
def _which_act(act: Any) -> str | None:
    torch = _torch()
    F = torch.nn.functional
    t = torch.linspace(-6.0, 6.0, 241, dtype=torch.float64)
    try:
        with torch.no_grad():
            y = act(t)
    except Exception:
        return None
    for name, ref in (
        ("silu_and_mul", F.silu(t)),
        ("gelu_tanh_and_mul", F.gelu(t, approximate="tanh")),
        ("gelu_and_mul", F.gelu(t)),
    ):
        if isinstance(y, torch.Tensor) and y.shape == t.shape and torch.allclose(y.double(), ref, atol=1e-7):
            return name
    return None


def _mlp_swap(name: str, module: Any, result: KernelizeResult) -> None:
    torch = _torch()
    from opmux.kernels.ops import activation

    g: Any = getattr(module, "gate_proj", None)
    u: Any = getattr(module, "up_proj", None)
    d: Any = getattr(module, "down_proj", None)
    linear = torch.nn.Linear
    if not all(isinstance(p, linear) for p in (g, u, d)) or g.bias is not None or u.bias is not None:
        result.skipped.append((name, "not a bias-free gate_proj/up_proj/down_proj MLP"))
        return
    kind = _which_act(getattr(module, "act_fn", None))
    if kind is None:
        result.skipped.append((name, "act_fn is not silu, tanh-gelu or erf-gelu"))
        return
    if g.weight.shape != u.weight.shape:
        result.skipped.append((name, "gate_proj and up_proj differ in shape"))
        return
    inter = g.weight.shape[0]
    # one [2I, H] tensor; the two projections become views of it (same values, no extra memory)
    fused = torch.cat([g.weight.detach(), u.weight.detach()], 0)
    old = (g.weight, u.weight)
    g.weight = torch.nn.Parameter(fused[:inter], requires_grad=old[0].requires_grad)
    u.weight = torch.nn.Parameter(fused[inter:], requires_grad=old[1].requires_grad)
    original = module.forward
    op = getattr(activation, kind)

    def forward(self: Any, x: Tensor) -> Any:
        if x.dtype != fused.dtype or (
            torch.is_grad_enabled() and (x.requires_grad or g.weight.requires_grad)
        ):
            return original(x)
        return self.down_proj(op(torch.nn.functional.linear(x, fused)))

    module.forward = types.MethodType(forward, module)

    def undo() -> None:
        module.__dict__.pop("forward", None)
        g.weight, u.weight = old

    result._undo.append(undo)
    result.swaps.append(Swap(name, kind, f"activation.{kind}"))


# -- sparse MoE blocks ------------------------------------------------------------------------------
#: the gated activations of ``moe.fused_experts``, by the act_fn the probe identifies
_MOE_ACTS = {"silu_and_mul": "silu", "gelu_and_mul": "gelu"}


def _grad(*tensors: Any) -> bool:
    torch = _torch()
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def _route(logits: Tensor, k: int, renormalize: bool) -> tuple[Tensor, Tensor]:
    """Softmax over the logits in fp32, top-k, renormalized or not: ``moe.topk_softmax`` into
    float32 weights and int64 ids (what the modeling code's ``torch.topk`` gives its experts)."""
    torch = _torch()
    from opmux.kernels.ops import moe

    t = logits.shape[0]
    w = torch.empty(t, k, dtype=torch.float32, device=logits.device)
    ids = torch.empty(t, k, dtype=torch.int64, device=logits.device)
    moe.topk_softmax(logits, k, renormalize, topk_weights=w, topk_ids=ids)
    return w, ids


def _close(got: Any, want: Any) -> bool:
    torch = _torch()
    return bool(
        got.shape == want.shape
        and got.dtype == want.dtype
        and torch.allclose(got.float(), want.float(), atol=2e-2, rtol=2e-2)
    )


def _moe_swap(name: str, module: Any, result: KernelizeResult) -> bool:
    """A sparse MoE block: the fused layout (a router module returning ``(logits, weights, ids)``
    and an experts module with 3-d ``gate_up_proj`` / ``down_proj``, transformers 5) or the
    per-expert one (a linear ``gate`` and a ModuleList of gated MLPs, transformers 4). Returns
    whether it swapped."""
    experts = getattr(module, "experts", None)
    if isinstance(getattr(experts, "gate_up_proj", None), _torch().Tensor):
        return _moe_fused_swap(name, module, result)
    if isinstance(experts, _torch().nn.ModuleList):
        return _moe_list_swap(name, module, result)
    result.skipped.append((name, "a MoE block with neither 3-d expert weights nor a list of experts"))
    return False


def _moe_fused_swap(name: str, module: Any, result: KernelizeResult) -> bool:
    import copy

    torch = _torch()
    F = torch.nn.functional
    from opmux.kernels.ops import moe

    gate, experts = module.gate, module.experts
    w13, w2 = experts.gate_up_proj, experts.down_proj
    rw = getattr(gate, "weight", None)
    k = getattr(gate, "top_k", None)
    if not (
        isinstance(rw, torch.Tensor)
        and rw.dim() == 2
        and isinstance(k, int)
        and w13.dim() == 3
        and w2.dim() == 3
        and w13.shape[0] == w2.shape[0] == rw.shape[0]
        and w13.shape[1] == 2 * w2.shape[2]
        and w13.shape[2] == w2.shape[1] == rw.shape[1]
        and w13.dtype == w2.dtype
        and w13.stride(-1) == 1
        and w2.stride(-1) == 1
        and getattr(experts, "has_bias", False) is False
    ):
        result.skipped.append(
            (name, "router / experts not of the [E, 2N, K] / [E, K, N] form moe.fused_experts takes")
        )
        return False
    act = _MOE_ACTS.get(_which_act(getattr(experts, "act_fn", None)) or "")
    if act is None:
        result.skipped.append((name, "the experts' act_fn is not silu or erf-gelu"))
        return False
    gate_original, experts_original = gate.forward, experts.forward
    # the router's own rule, found by a probe in bf16 (fp32 weights would hide a cast): is the
    # top-k renormalized, are the weights handed on in fp32 or in the logits' dtype. The probe's
    # logits are scaled to a unit spread: a peaked softmax (large router weights) puts nearly all
    # the weight on one expert, where plain and renormalized top-k weights agree within the
    # tolerance; of the rules that match, the closer wins
    probe = torch.randn(5, rw.shape[1], generator=torch.Generator().manual_seed(0)).to(rw.device)
    g16 = copy.deepcopy(gate).to(torch.bfloat16)
    with torch.no_grad():
        spread = float(F.linear(probe, rw.detach().float()).std())
        probe = probe / spread if spread > 0 else probe
        logits, want_w, want_ids = g16(probe.bfloat16())
        rule, best = None, float("inf")
        for renorm in (True, False):
            w, ids = _route(logits, k, renorm)
            w = w.to(want_w.dtype)
            err = float((w.float() - want_w.float()).abs().max())
            if torch.equal(ids, want_ids.long()) and _close(w, want_w) and err < best:
                rule, best = (renorm, want_w.dtype != torch.float32), err
    if rule is None:
        result.skipped.append((name, "its router is not softmax top-k on a probe"))
        return False
    renorm, cast = rule

    def gate_forward(self: Any, hidden_states: Tensor) -> Any:
        x = hidden_states.reshape(-1, self.weight.shape[1])
        if x.dtype != self.weight.dtype or _grad(x, self.weight):
            return gate_original(hidden_states)
        logits = F.linear(x, self.weight)
        w, ids = _route(logits, k, renorm)
        return logits, (w.to(logits.dtype) if cast else w), ids

    def experts_forward(self: Any, hidden_states: Tensor, top_k_index: Tensor, top_k_weights: Tensor) -> Any:
        w1, w2 = self.gate_up_proj, self.down_proj
        if hidden_states.dim() != 2 or hidden_states.dtype != w1.dtype or _grad(hidden_states, w1, w2):
            return experts_original(hidden_states, top_k_index, top_k_weights)
        weights = top_k_weights if top_k_weights.dtype == torch.float32 else top_k_weights.float()
        return moe.fused_experts(hidden_states, w1, w2, weights, top_k_index, act)

    # the experts' probe: the op on the module's own weights agrees with its forward
    x = torch.randn(4, w13.shape[2], generator=torch.Generator().manual_seed(1)).to(w13.device, w13.dtype)
    ids = torch.stack([torch.arange(4) % w13.shape[0], (torch.arange(4) + 1) % w13.shape[0]], 1).to(x.device)
    tw = torch.full((4, 2), 0.5, device=x.device)
    with torch.no_grad():
        want = experts_original(x, ids, tw)
        got = moe.fused_experts(x, w13.detach(), w2.detach(), tw, ids, act)
    scale = float(want.abs().max()) or 1.0
    if not _close(got / scale, want / scale):
        result.skipped.append(
            (name, "its experts do not match moe.fused_experts on a probe (weight layout?)")
        )
        return False
    gate.forward = types.MethodType(gate_forward, gate)
    experts.forward = types.MethodType(experts_forward, experts)

    def undo() -> None:
        gate.__dict__.pop("forward", None)
        experts.__dict__.pop("forward", None)

    result._undo.append(undo)
    result.swaps.append(Swap(name, "moe", f"moe.topk_softmax + moe.fused_experts ({act})"))
    return True


def _expert_projections(expert: Any) -> tuple[Any, Any, Any] | None:
    """(gate, up, down) linears of one expert MLP: ``gate_proj / up_proj / down_proj``, or
    Mixtral's ``w1 / w3 / w2``."""
    for names in (("gate_proj", "up_proj", "down_proj"), ("w1", "w3", "w2")):
        lin = tuple(getattr(expert, n, None) for n in names)
        if all(isinstance(p, _torch().nn.Linear) and p.bias is None for p in lin):
            return lin  # type: ignore[return-value]
    return None


def _moe_list_swap(name: str, module: Any, result: KernelizeResult) -> bool:
    torch = _torch()
    from opmux.kernels.ops import moe

    gate, experts = getattr(module, "gate", None), module.experts
    k = getattr(module, "top_k", None)
    projs = [_expert_projections(e) for e in experts]
    if (
        not isinstance(gate, torch.nn.Linear)
        or gate.bias is not None
        or not isinstance(k, int)
        or None in projs
    ):
        result.skipped.append((name, "not a linear router over a list of bias-free gated expert MLPs"))
        return False
    act = _MOE_ACTS.get(_which_act(getattr(experts[0], "act_fn", None)) or "")
    if act is None:
        result.skipped.append((name, "the experts' act_fn is not silu or erf-gelu"))
        return False
    # stacked once: w1 [E, 2N, K] (each expert's gate rows, then its up rows), w2 [E, K, N]
    with torch.no_grad():
        w1 = torch.stack([torch.cat([g.weight, u.weight], 0) for g, u, _ in projs])  # type: ignore[misc]
        w2 = torch.stack([d.weight for _, _, d in projs])  # type: ignore[misc]
    renorm = bool(getattr(module, "norm_topk_prob", True))
    original = module.forward

    def forward(self: Any, hidden_states: Tensor) -> Any:
        if (
            self.training
            or hidden_states.dim() != 3
            or hidden_states.dtype != w1.dtype
            or _grad(hidden_states, gate.weight, *(p.weight for lin in projs for p in lin))  # type: ignore[union-attr]
        ):
            return original(hidden_states)
        b, s, h = hidden_states.shape
        x = hidden_states.reshape(-1, h)
        logits = self.gate(x)
        w, ids = _route(logits, k, renorm)
        w = w.to(x.dtype).float()  # these blocks hand on the weights in the activations' dtype
        return moe.fused_experts(x, w1, w2, w, ids, act).view(b, s, h), logits

    probe = torch.randn(1, 5, w1.shape[2], generator=torch.Generator().manual_seed(0))
    probe = probe.to(w1.device, w1.dtype)
    with torch.no_grad():
        want = original(probe)
        got = forward(module, probe)
    ok = isinstance(want, tuple) and len(want) == 2 and _close(got[1], want[1])
    if ok:
        scale = float(want[0].abs().max()) or 1.0
        ok = _close(got[0] / scale, want[0] / scale)
    if not ok:
        result.skipped.append(
            (name, "its forward does not match softmax top-k + moe.fused_experts on a probe")
        )
        return False
    module.forward = types.MethodType(forward, module)
    result._undo.append(lambda: module.__dict__.pop("forward", None))
    result.swaps.append(Swap(name, "moe", f"moe.topk_softmax + moe.fused_experts ({act})"))
    return True


# -- rotary embedding -----------------------------------------------------------------------------
def _rope_swap(modeling: types.ModuleType, result: KernelizeResult) -> None:
    torch = _torch()
    from opmux.kernels.ops import rope

    original = modeling.apply_rotary_pos_emb

    def apply_rotary_pos_emb(
        q: Tensor, k: Tensor, cos: Tensor, sin: Tensor, *args: Any, **kwargs: Any
    ) -> Any:
        unsqueeze_dim = kwargs.get("unsqueeze_dim", args[-1] if args and isinstance(args[-1], int) else 1)
        rot = cos.shape[-1]
        if (
            unsqueeze_dim != 1
            or q.dim() != 4
            or k.dim() != 4
            or cos.dim() != 3
            or cos.shape != sin.shape
            or rot % 2
            or rot > q.shape[-1]
            or q.dtype != k.dtype
            or (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad))
        ):
            return original(q, k, cos, sin, *args, **kwargs)
        cb, t = cos.shape[:2]  # cos/sin: [B, T, rot], or [1, T, rot] shared by the batch
        b = q.shape[0]
        if cb not in (1, b) or q.shape[2] != t or k.shape[0] != b or k.shape[2] != t:
            return original(q, k, cos, sin, *args, **kwargs)
        half = rot // 2
        # one cache row per (batch row of cos, token): [cos | sin] of its first half (rotate_half
        # duplicates the halves); token (i, j) of q reads row (i if cb == b else 0) * T + j
        cache = torch.cat([cos[..., :half], sin[..., :half]], -1).reshape(cb * t, rot)
        if cache.dtype not in (torch.float32, q.dtype):
            cache = cache.float()
        pos = torch.arange(cb * t, device=q.device)
        if cb != b:
            pos = pos.repeat(b)
        qo = q.transpose(1, 2).contiguous()  # [B, T, H, D]: HF returns new tensors too
        ko = k.transpose(1, 2).contiguous()
        rope.rotary_embedding(pos, qo.view(b * t, -1, q.shape[-1]), ko.view(b * t, -1, k.shape[-1]),
                              q.shape[-1], cache.contiguous(), True)  # fmt: skip
        return qo.transpose(1, 2), ko.transpose(1, 2)

    setattr(modeling, "apply_rotary_pos_emb", apply_rotary_pos_emb)  # noqa: B010
    result._undo.append(lambda: setattr(modeling, "apply_rotary_pos_emb", original))
    result.swaps.append(Swap(modeling.__name__, "rotary_embedding", "rope.rotary_embedding"))


def kernelize(
    model: Any, *, norms: bool = True, mlp: bool = True, rope: bool = True, moe: bool = True
) -> KernelizeResult:
    """Swap ``model``'s RMSNorms, gated MLPs, sparse MoE blocks and rotary embedding for opmux ops (see the module
    docstring); returns what was swapped and skipped, with ``revert()``. Kernelizing a model
    twice returns the first result."""
    done = getattr(model, "_opmux_kernelize", None)
    if isinstance(done, KernelizeResult) and (done.swaps or done.skipped):
        return done
    result = KernelizeResult()
    modeling_modules: dict[str, types.ModuleType] = {}
    moe_blocks: list[str] = []  # swapped MoE blocks: their experts are theirs, not MLP swaps
    for name, module in model.named_modules():
        cls = type(module).__name__
        if any(name.startswith(f"{b}.") for b in moe_blocks):
            continue
        if norms and cls.endswith("RMSNorm"):
            _norm_swap(name, module, result)
        elif mlp and cls.endswith("MLP") and hasattr(module, "gate_proj"):
            _mlp_swap(name, module, result)
        elif moe and cls.endswith("SparseMoeBlock") and hasattr(module, "experts"):
            if _moe_swap(name, module, result):
                moe_blocks.append(name)
        if rope and cls.endswith("Attention"):
            mod = sys.modules.get(type(module).__module__)
            if mod is not None and callable(getattr(mod, "apply_rotary_pos_emb", None)):
                modeling_modules[mod.__name__] = mod
    for mod in modeling_modules.values():
        _rope_swap(mod, result)
    model._opmux_kernelize = result

    def forget() -> None:
        model.__dict__.pop("_opmux_kernelize", None)

    result._undo.insert(0, forget)
    return result


# -- paged attention ------------------------------------------------------------------------------
#: the attention implementation's name in transformers' AttentionInterface
PAGED_ATTENTION = "opmux"


def paged_attention_forward(
    module: Any,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """transformers' attention-interface signature over opmux's paged KV cache. The model is called
    on one packed row (``input_ids [1, T]``, ``position_ids = step.positions[None]``) with
    ``opmux_step=`` a ``PagedStep``: the step's lengths and block tables are the mask (no
    ``attention_mask``; transformers builds none for an implementation it has no mask function
    for). q / k / v ``[1, H, T, D]`` -> ``[1, T, Hq, D]``, as the eager function returns.
    ``scaling``, ``softcap``, ``sliding_window`` and gpt-oss's sinks (``s_aux``) are the ops'."""
    from opmux.integrations.paged_cache import PagedStep

    step = kwargs.get("opmux_step")
    if not isinstance(step, PagedStep):
        raise ValueError(
            f"the {PAGED_ATTENTION!r} attention runs over a paged cache: call the model with "
            "opmux_step=cache.schedule(...) (opmux.integrations.paged_cache)"
        )
    if query.shape[0] != 1 or query.shape[2] != step.slot_mapping.shape[0]:
        raise ValueError(
            f"query has shape {tuple(query.shape)}: expected one packed row of the step's "
            f"{step.slot_mapping.shape[0]} tokens, [1, heads, tokens, head_dim]"
        )
    if dropout:
        raise ValueError("the paged attention is inference-only: dropout must be 0")
    window = kwargs.get("sliding_window")  # transformers' window: key positions > query - window
    sinks = kwargs.get("s_aux")  # gpt-oss's attention sinks (one logit per head, in the denominator)
    out = step.cache.attend(
        module.layer_idx,
        query[0].transpose(0, 1),
        key[0].transpose(0, 1),
        value[0].transpose(0, 1),
        step,
        scale=scaling or 0.0,
        softcap=kwargs.get("softcap") or 0.0,
        window_left=-1 if window is None else int(window) - 1,
        sinks=None if sinks is None else sinks.float(),
    )
    return out.unsqueeze(0), None


def register_paged_attention(name: str = PAGED_ATTENTION) -> str:
    """Register ``paged_attention_forward`` with transformers' AttentionInterface under ``name``
    (for every model: the interface's mapping is global); returns the name for
    ``model.set_attn_implementation``."""
    from transformers import AttentionInterface

    AttentionInterface.register(name, paged_attention_forward)
    return name
