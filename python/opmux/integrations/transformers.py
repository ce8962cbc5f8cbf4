"""Swap the RMSNorm, gated-MLP activation and rotary embedding of Hugging Face Llama-family
models (Llama, Qwen2/3, Mistral, Gemma with its own norm) for opmux ops, reversibly.

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
* Rotary embedding: the modeling module's ``apply_rotary_pos_emb`` (rotate_half layout) runs
  ``rope.rotary_embedding`` on copies of q and k with the call's cos/sin as the cache.
"""

from __future__ import annotations

import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import Tensor

__all__ = ["KernelizeResult", "Swap", "kernelize"]


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


def kernelize(model: Any, *, norms: bool = True, mlp: bool = True, rope: bool = True) -> KernelizeResult:
    """Swap ``model``'s RMSNorms, gated MLPs and rotary embedding for opmux ops (see the module
    docstring); returns what was swapped and skipped, with ``revert()``. Kernelizing a model
    twice returns the first result."""
    done = getattr(model, "_opmux_kernelize", None)
    if isinstance(done, KernelizeResult) and (done.swaps or done.skipped):
        return done
    result = KernelizeResult()
    modeling_modules: dict[str, types.ModuleType] = {}
    for name, module in model.named_modules():
        cls = type(module).__name__
        if norms and cls.endswith("RMSNorm"):
            _norm_swap(name, module, result)
        elif mlp and cls.endswith("MLP") and hasattr(module, "gate_proj"):
            _mlp_swap(name, module, result)
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
