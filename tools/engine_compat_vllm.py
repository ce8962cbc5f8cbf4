"""What vLLM's core and quantization kernel tests import besides ``_custom_ops``, for
tools/engine_compat.py (loaded by it; see docs/compat.md for the vLLM commits).

Small stand-ins written from vLLM's own definitions. The rule that keeps a run honest: a layer's
``forward`` (vLLM's CUDA path) calls ``vllm._custom_ops`` (opmux.compat.vllm, i.e. opmux's
kernels) exactly where vLLM calls its ``_C`` kernel; ``forward_native`` is vLLM's PyTorch code,
the test's reference. ``torch.ops._C.<name>`` is registered on opmux.compat.vllm's function for
every name it has. A kernel opmux does not have is registered too (the test modules look these
names up when they are imported), as an op that raises ``NotImplementedError`` naming it, so
only its cases fail; likewise the GEMM wrappers test_block_fp8 imports that opmux lacks (DeepGEMM's,
FlashInfer's): its Triton and CUTLASS block-fp8 GEMMs run opmux's ``gemm.w8a8_block_fp8_matmul``.
"""

from __future__ import annotations

import math
import types
from collections.abc import Callable
from typing import Any

_LIB: list[Any] = []
_ROPE_CACHE: dict[Any, Any] = {}


def _not_opmux(name: str) -> Any:
    def missing(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{name}: not an opmux op (no opmux kernel to run it)")

    missing.__name__ = name.rpartition(".")[2]
    return missing


# -- torch.ops._C -------------------------------------------------------------------------------
# vLLM's schemas (csrc/torch_bindings.cpp) for the names its core / quantization tests call.
_C_SCHEMAS = {
    "rms_norm": "(Tensor(a!) result, Tensor input, Tensor? weight, float epsilon) -> ()",
    "fused_add_rms_norm": "(Tensor(a!) input, Tensor(b!) residual, Tensor? weight, float epsilon) -> ()",
    "silu_and_mul": "(Tensor(a!) result, Tensor input) -> ()",
    "gelu_and_mul": "(Tensor(a!) result, Tensor input) -> ()",
    "gelu_tanh_and_mul": "(Tensor(a!) result, Tensor input) -> ()",
    "mul_and_silu": "(Tensor(a!) out, Tensor input) -> ()",
    "fatrelu_and_mul": "(Tensor(a!) out, Tensor input, float threshold) -> ()",
    "swigluoai_and_mul": "(Tensor(a!) out, Tensor input, float alpha=1.702, float limit=7.0) -> ()",
    "gelu_new": "(Tensor(a!) out, Tensor input) -> ()",
    "gelu_fast": "(Tensor(a!) out, Tensor input) -> ()",
    "gelu_quick": "(Tensor(a!) out, Tensor input) -> ()",
    "rotary_embedding": (
        "(Tensor positions, Tensor(a!) query, Tensor(b!)? key, int head_size, Tensor cos_sin_cache, "
        "bool is_neox) -> ()"
    ),
    "static_scaled_fp8_quant": "(Tensor(a!) result, Tensor input, Tensor scale, int[]? group_shape=None) -> ()",
    "dynamic_scaled_fp8_quant": "(Tensor(a!) result, Tensor input, Tensor(b!) scale) -> ()",
    "dynamic_per_token_scaled_fp8_quant": (
        "(Tensor(a!) result, Tensor input, Tensor(b!) scale, Tensor? scale_ub) -> ()"
    ),
    "rms_norm_static_fp8_quant": (
        "(Tensor(a!) result, Tensor input, Tensor weight, Tensor scale, float epsilon) -> ()"
    ),
    "fused_add_rms_norm_static_fp8_quant": (
        "(Tensor(a!) result, Tensor input, Tensor(b!) residual, Tensor weight, Tensor scale, float epsilon) -> ()"
    ),
}
# in vLLM's _C, not in opmux: registered so the tests import, raising when called
_C_MISSING: dict[str, str] = {}  # none left: every name the core / quantization tests call is an opmux op


def register_c_ops(ops: Any) -> None:
    import torch

    if _LIB:
        return
    lib = torch.library.Library("_C", "FRAGMENT")  # type: ignore[no-untyped-call]
    _LIB.append(lib)
    for name, schema in _C_SCHEMAS.items():
        lib.define(name + schema)  # type: ignore[no-untyped-call]
        fn = getattr(ops, name)
        if name == "static_scaled_fp8_quant":  # int[] arrives as a list; vLLM's wrapper passes a tuple
            fn = _static_quant(ops)
        lib.impl(name, fn, "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]
    for name, schema in _C_MISSING.items():
        lib.define(name + schema)  # type: ignore[no-untyped-call]
        lib.impl(name, _not_opmux(f"torch.ops._C.{name}"), "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]


def _static_quant(ops: Any) -> Any:
    def static_scaled_fp8_quant(out: Any, input: Any, scale: Any, group_shape: Any = None) -> None:
        ops.static_scaled_fp8_quant(out, input, scale, None if group_shape is None else tuple(group_shape))

    return static_scaled_fp8_quant


# -- layers -------------------------------------------------------------------------------------
def _layers(ops: Any) -> dict[str, Any]:
    """vllm.model_executor.layers.{layernorm, activation, rotary_embedding} (vLLM's classes, their
    ``forward_native`` as vLLM has it, ``forward`` the CUDA path through ``_custom_ops``)."""
    import torch
    from torch import nn
    from torch.nn import functional as F

    def rms_norm_native(x: Any, weight: Any, epsilon: float, variance_size: int | None = None) -> Any:
        # vllm/ir/ops/layernorm.py: rms_norm's native definition
        orig_dtype = x.dtype
        x = x.to(torch.float32)
        x_var = x if variance_size is None else x[..., :variance_size]
        variance = x_var.pow(2).mean(dim=-1, keepdim=True)
        x = x * torch.rsqrt(variance + epsilon)
        x = x.to(orig_dtype)
        if weight is not None:
            x = x * weight
        return x

    def _norm_cuda(norm: Any, fused_add: Any, x: Any, residual: Any, weight: Any, eps: float) -> Any:
        # forward_cuda's kernel calls: the fused add in place (x, residual), else the norm into a new out
        if residual is not None:
            fused_add(x, residual, weight, eps)
            return x, residual
        out = torch.empty_like(x)
        norm(out, x, weight, eps)
        return out

    class RMSNorm(nn.Module):
        def __init__(
            self,
            hidden_size: int,
            eps: float = 1e-6,
            var_hidden_size: int | None = None,
            has_weight: bool = True,
            dtype: Any = None,
        ) -> None:
            super().__init__()
            self.hidden_size = hidden_size
            self.variance_epsilon = eps
            self.variance_size_override = None if var_hidden_size == hidden_size else var_hidden_size
            self.has_weight = has_weight
            self.weight = torch.ones(hidden_size, dtype=dtype or torch.get_default_dtype())
            if has_weight:
                self.weight = nn.Parameter(self.weight)

        def forward_native(self, x: Any, residual: Any = None) -> Any:
            weight = self.weight.data if self.has_weight else None
            if residual is None:
                return rms_norm_native(x, weight, self.variance_epsilon, self.variance_size_override)
            orig_dtype = x.dtype
            x = x.to(torch.float32) + residual
            residual = x.to(orig_dtype)
            variance = x.pow(2).mean(dim=-1, keepdim=True)
            x = (x * torch.rsqrt(variance + self.variance_epsilon)).to(orig_dtype)
            if weight is not None:
                x = x * weight
            return x, residual

        def forward(self, x: Any, residual: Any = None) -> Any:  # vLLM's forward_cuda
            if self.variance_size_override is not None:
                return self.forward_native(x, residual)
            weight = self.weight.data if self.has_weight else None
            return _norm_cuda(
                ops.rms_norm, ops.fused_add_rms_norm, x, residual, weight, self.variance_epsilon
            )

    class GemmaRMSNorm(nn.Module):
        """forward_native as vLLM's; forward runs opmux's gemma_rmsnorm / gemma_fused_add_rmsnorm
        (opmux.compat.vllm's gemma_rms_norm, gemma_fused_add_rms_norm).

        vLLM's GemmaRMSNorm.forward_cuda calls no _C kernel: it is its forward_native under
        torch.compile (vllm/model_executor/layers/layernorm.py), so its conventions are that
        code's. With a residual in float16 it adds in float32 and returns that float32 sum as the
        residual, normalizing the unrounded sum; forward does the same: the float32 sum, opmux's
        gemma_rmsnorm of it (weight in float32, output rounded once to float16, as vLLM). bf16 /
        fp32 add in the input dtype there, which opmux's in-place fused add does (same values)."""

        def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(hidden_size))
            self.variance_epsilon = eps

        def forward_native(self, x: Any, residual: Any = None) -> Any:
            orig_dtype = x.dtype
            if residual is not None:
                x = x.float() + residual.float() if orig_dtype == torch.float16 else x + residual
                residual = x
            x = x.float()
            variance = x.pow(2).mean(dim=-1, keepdim=True)
            x = x * torch.rsqrt(variance + self.variance_epsilon)
            x = (x * (1.0 + self.weight.data.float())).to(orig_dtype)
            return x if residual is None else (x, residual)

        def forward(self, x: Any, residual: Any = None) -> Any:
            w, orig = self.weight.data, x.dtype
            if w.dtype != orig:
                # Gemma's float32 weight with bf16 / fp16 activations (vLLM's forward_native:
                # the add in the input dtype (fp16: in float32), the norm in float32, one
                # rounding at the end): opmux's float32 norm of the sum, rounded once (opmux's
                # contract wants one dtype per call)
                if residual is not None:
                    x = x.float() + residual.float() if orig == torch.float16 else x + residual
                    residual = x
                out = torch.empty(x.shape, dtype=torch.float32, device=x.device)
                ops.gemma_rms_norm(out, x.float(), w.float(), self.variance_epsilon)
                return out.to(orig) if residual is None else (out.to(orig), residual)
            if residual is not None and x.dtype == torch.float16:
                residual = x.float() + residual.float()  # a new float32 tensor, as vLLM's
                out = torch.empty_like(residual)
                ops.gemma_rms_norm(out, residual, w.float(), self.variance_epsilon)
                return out.to(x.dtype), residual
            return _norm_cuda(
                ops.gemma_rms_norm, ops.gemma_fused_add_rms_norm, x, residual, w, self.variance_epsilon
            )

    class _GatedAct(nn.Module):
        op_name = ""

        def _native_act(self, x: Any) -> Any:
            raise NotImplementedError

        def forward_native(self, x: Any) -> Any:
            return self._native_act(x)

        def _call(self, out: Any, x: Any) -> None:
            getattr(torch.ops._C, self.op_name)(out, x)

        def forward(self, x: Any) -> Any:
            d = x.shape[-1] // 2
            out = torch.empty((*x.shape[:-1], d), dtype=x.dtype, device=x.device)
            self._call(out, x)
            return out

    class SiluAndMul(_GatedAct):
        op_name = "silu_and_mul"

        def __init__(self, *, compile_native: bool = True) -> None:
            super().__init__()

        def _native_act(self, x: Any) -> Any:
            d = x.shape[-1] // 2
            return F.silu(x[..., :d]) * x[..., d:]

    class MulAndSilu(_GatedAct):
        op_name = "mul_and_silu"

        def _native_act(self, x: Any) -> Any:
            d = x.shape[-1] // 2
            return x[..., :d] * F.silu(x[..., d:])

    class GeluAndMul(_GatedAct):
        def __init__(self, approximate: str = "none") -> None:
            super().__init__()
            if approximate not in ("none", "tanh"):
                raise ValueError(f"Unknown approximate mode: {approximate}")
            self.approximate = approximate
            self.op_name = "gelu_and_mul" if approximate == "none" else "gelu_tanh_and_mul"

        def _native_act(self, x: Any) -> Any:
            d = x.shape[-1] // 2
            return F.gelu(x[..., :d], approximate=self.approximate) * x[..., d:]

    class FatreluAndMul(_GatedAct):
        op_name = "fatrelu_and_mul"

        def __init__(self, threshold: float = 0.0) -> None:
            super().__init__()
            self.threshold = threshold

        def _native_act(self, x: Any) -> Any:
            d = x.shape[-1] // 2
            x1 = F.threshold(x[..., :d], self.threshold, 0.0)
            return x1 * x[..., d:]

        def _call(self, out: Any, x: Any) -> None:
            torch.ops._C.fatrelu_and_mul(out, x, self.threshold)

    class SwigluOAIAndMul(_GatedAct):
        op_name = "swigluoai_and_mul"

        def __init__(self, alpha: float = 1.702, limit: float = 7.0) -> None:
            super().__init__()
            self.alpha, self.limit = alpha, limit

        def _native_act(self, x: Any) -> Any:
            gate, up = x[..., ::2], x[..., 1::2]
            gate = gate.clamp(min=None, max=self.limit)
            up = up.clamp(min=-self.limit, max=self.limit)
            glu = gate * torch.sigmoid(gate * self.alpha)
            return (up + 1) * glu

        def _call(self, out: Any, x: Any) -> None:
            torch.ops._C.swigluoai_and_mul(out, x, self.alpha, self.limit)

    swiglustep_and_mul_triton = ops.swiglustep_and_mul_triton  # vLLM's Triton op, opmux's kernels

    class SwigluStepAndMul(_GatedAct):
        def __init__(self, limit: float = 7.0) -> None:
            super().__init__()
            self.limit = limit

        def _native_act(self, x: Any) -> Any:
            d = x.shape[-1] // 2
            gate, up = x[..., :d], x[..., d:]
            gate = F.silu(gate).clamp(max=self.limit)
            return gate * up.clamp(min=-self.limit, max=self.limit)

        def _call(self, out: Any, x: Any) -> None:
            swiglustep_and_mul_triton(out, x, self.limit)

    class _Act(nn.Module):
        op_name = ""

        def forward(self, x: Any) -> Any:
            out = torch.empty_like(x)
            getattr(torch.ops._C, self.op_name)(out, x)
            return out

    class NewGELU(_Act):
        op_name = "gelu_new"

        def forward_native(self, x: Any) -> Any:
            c = math.sqrt(2.0 / math.pi)
            return 0.5 * x * (1.0 + torch.tanh(c * (x + 0.044715 * torch.pow(x, 3.0))))

    class FastGELU(_Act):
        op_name = "gelu_fast"

        def forward_native(self, x: Any) -> Any:
            return 0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))

    class QuickGELU(_Act):
        op_name = "gelu_quick"

        def forward_native(self, x: Any) -> Any:
            return x * torch.sigmoid(1.702 * x)

    # -- rotary embedding (vllm/model_executor/layers/rotary_embedding) --
    def apply_rotary_emb_torch(x: Any, cos: Any, sin: Any, is_neox_style: bool) -> Any:
        cos = cos.unsqueeze(-2).to(x.dtype)
        sin = sin.unsqueeze(-2).to(x.dtype)
        if is_neox_style:
            x1, x2 = torch.chunk(x, 2, dim=-1)
        else:
            x1, x2 = x[..., ::2], x[..., 1::2]
        o1 = x1 * cos - x2 * sin
        o2 = x2 * cos + x1 * sin
        if is_neox_style:
            return torch.cat((o1, o2), dim=-1)
        return torch.stack((o1, o2), dim=-1).flatten(-2)

    class RotaryEmbedding(nn.Module):
        def __init__(
            self,
            head_size: int,
            rotary_dim: int,
            max_position_embeddings: int,
            base: float,
            is_neox_style: bool,
            dtype: Any,
        ) -> None:
            super().__init__()
            self.head_size = head_size
            self.rotary_dim = rotary_dim
            self.max_position_embeddings = max_position_embeddings
            self.base = base
            self.is_neox_style = is_neox_style
            self.dtype = dtype
            cache = self._compute_cos_sin_cache().to(dtype)
            self.cos_sin_cache: Any
            self.register_buffer("cos_sin_cache", cache, persistent=False)

        def _compute_inv_freq(self, base: float) -> Any:
            return 1.0 / (base ** (torch.arange(0, self.rotary_dim, 2, dtype=torch.float) / self.rotary_dim))

        def _compute_cos_sin_cache(self) -> Any:
            inv_freq = self._compute_inv_freq(self.base)
            t = torch.arange(self.max_position_embeddings, dtype=torch.float)
            freqs = torch.einsum("i,j -> ij", t, inv_freq)
            return torch.cat((freqs.cos(), freqs.sin()), dim=-1)

        def forward_native(self, positions: Any, query: Any, key: Any = None) -> Any:
            positions = positions.flatten()
            num_tokens = positions.shape[0]
            cos_sin = self.cos_sin_cache.index_select(0, positions)
            cos, sin = cos_sin.chunk(2, dim=-1)

            def rot(x: Any) -> Any:
                shape = x.shape
                x = x.view(num_tokens, -1, self.head_size)
                x_rot = apply_rotary_emb_torch(x[..., : self.rotary_dim], cos, sin, self.is_neox_style)
                return torch.cat((x_rot, x[..., self.rotary_dim :]), dim=-1).reshape(shape)

            return rot(query), None if key is None else rot(key)

        def forward(self, positions: Any, query: Any, key: Any = None) -> Any:  # forward_cuda
            if self.cos_sin_cache.device != query.device or self.cos_sin_cache.dtype != query.dtype:
                self.cos_sin_cache = self.cos_sin_cache.to(query.device, dtype=query.dtype)
            ops.rotary_embedding(
                positions, query, key, self.head_size, self.cos_sin_cache, self.is_neox_style
            )
            return query, key

    class LinearScalingRotaryEmbedding(RotaryEmbedding):
        def __init__(
            self,
            head_size: int,
            rotary_dim: int,
            max_position_embeddings: int,
            base: float,
            is_neox_style: bool,
            scaling_factors: Any,
            dtype: Any,
        ) -> None:
            self.scaling_factors = (
                [scaling_factors] if isinstance(scaling_factors, float | int) else list(scaling_factors)
            )
            super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype)

        def _compute_cos_sin_cache(self) -> Any:
            inv_freq = self._compute_inv_freq(self.base)
            caches = []
            for factor in self.scaling_factors:
                t = torch.arange(int(self.max_position_embeddings * factor), dtype=torch.float) / factor
                freqs = torch.einsum("i,j -> ij", t, inv_freq)
                caches.append(torch.cat((freqs.cos(), freqs.sin()), dim=-1))
            return torch.cat(caches, dim=0)

    class DynamicNTKScalingRotaryEmbedding(RotaryEmbedding):
        def __init__(
            self,
            head_size: int,
            rotary_dim: int,
            max_position_embeddings: int,
            base: float,
            is_neox_style: bool,
            scaling_factor: float,
            dtype: Any,
        ) -> None:
            self.scaling_factor = scaling_factor
            super().__init__(head_size, rotary_dim, max_position_embeddings, base, is_neox_style, dtype)

        def _compute_cos_sin_cache(self) -> Any:
            max_len = self.max_position_embeddings * self.scaling_factor
            base = self.base * (
                (self.scaling_factor * max_len / self.max_position_embeddings) - (self.scaling_factor - 1)
            ) ** (self.rotary_dim / (self.rotary_dim - 2))
            inv_freq = self._compute_inv_freq(base)
            t = torch.arange(int(max_len), dtype=torch.float)
            freqs = torch.einsum("i,j -> ij", t, inv_freq)
            return torch.cat((freqs.cos(), freqs.sin()), dim=-1)

    def get_rope(
        head_size: int,
        max_position: int,
        is_neox_style: bool = True,
        rope_parameters: dict[str, Any] | None = None,
        dtype: Any = None,
        dual_chunk_attention_config: Any = None,
    ) -> Any:
        if dtype is None:
            dtype = torch.get_default_dtype()
        args = None
        if rope_parameters is not None:
            args = tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in rope_parameters.items())
        base = rope_parameters["rope_theta"] if rope_parameters else 10000
        factor = rope_parameters.get("partial_rotary_factor", 1.0) if rope_parameters else 1.0
        rotary_dim = int(head_size * factor)
        key = (head_size, rotary_dim, max_position, is_neox_style, args, dtype)
        if key in _ROPE_CACHE:
            return _ROPE_CACHE[key]
        params = rope_parameters or {}
        rope_type = params.get("rope_type", "default")
        rope: Any
        if rope_type == "default":
            rope = RotaryEmbedding(head_size, rotary_dim, max_position, base, is_neox_style, dtype)
        elif rope_type == "linear":
            rope = LinearScalingRotaryEmbedding(
                head_size, rotary_dim, max_position, base, is_neox_style, params["factor"], dtype
            )
        elif rope_type == "dynamic":
            rope = DynamicNTKScalingRotaryEmbedding(
                head_size, rotary_dim, max_position, base, is_neox_style, params["factor"], dtype
            )
        else:
            raise NotImplementedError(f"engine-compat shim: rope_type {rope_type!r}")
        _ROPE_CACHE[key] = rope
        return rope

    return {
        "vllm.model_executor.layers.layernorm": dict(RMSNorm=RMSNorm, GemmaRMSNorm=GemmaRMSNorm),
        "vllm.model_executor.layers.activation": dict(
            SiluAndMul=SiluAndMul,
            MulAndSilu=MulAndSilu,
            GeluAndMul=GeluAndMul,
            FatreluAndMul=FatreluAndMul,
            SwigluOAIAndMul=SwigluOAIAndMul,
            SwigluStepAndMul=SwigluStepAndMul,
            swiglustep_and_mul_triton=swiglustep_and_mul_triton,
            NewGELU=NewGELU,
            FastGELU=FastGELU,
            QuickGELU=QuickGELU,
        ),
        "vllm.model_executor.layers.rotary_embedding": dict(
            RotaryEmbedding=RotaryEmbedding,
            get_rope=get_rope,
            LinearScalingRotaryEmbedding=LinearScalingRotaryEmbedding,
            DynamicNTKScalingRotaryEmbedding=DynamicNTKScalingRotaryEmbedding,
        ),
        "vllm.ir": dict(ops=types.SimpleNamespace(rms_norm=_IrOp(rms_norm_native))),
    }


class _IrOp:
    """``vllm.ir.ops.<name>``: calling it runs the op's native definition (vLLM's reference);
    ``get_tolerance`` vLLM's default tolerances (vllm/ir/tolerances.py)."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    @staticmethod
    def get_tolerance(dtype: Any) -> dict[str, float]:
        import torch

        return {
            torch.float64: {"atol": 1e-8, "rtol": 1e-8},
            torch.float32: {"atol": 1e-5, "rtol": 1.3e-6},
            torch.float16: {"atol": 1e-3, "rtol": 1e-3},
            torch.bfloat16: {"atol": 1e-3, "rtol": 1.6e-2},
        }[dtype]


# -- quantization helpers (vllm/model_executor/layers/quantization/utils) -----------------------
def _quant_utils() -> dict[str, Any]:
    from typing import NamedTuple

    import torch

    class GroupShape(NamedTuple):
        row: int
        col: int

    def _normalize(x: Any, group_shape: Any) -> tuple[int, int]:
        return (
            x.shape[-2] if group_shape[0] == -1 else group_shape[0],
            x.shape[-1] if group_shape[1] == -1 else group_shape[1],
        )

    def scaled_quantize(x: Any, group_shape: Any, quant_dtype: Any, compute_dtype: Any = None) -> Any:
        gm, gn = _normalize(x, group_shape)
        finfo = torch.finfo(quant_dtype)
        xc = x if compute_dtype is None else x.to(compute_dtype)
        blk_m, blk_n = x.shape[0] // gm, x.shape[1] // gn
        assert blk_m * gm == x.shape[0] and blk_n * gn == x.shape[1]
        xb = xc.reshape(blk_m, gm, blk_n, gn).permute(0, 2, 1, 3).flatten(start_dim=2)
        min_val, max_val = xb.aminmax(dim=-1)
        amax = torch.maximum(min_val.abs(), max_val.abs()).clamp(min=1e-12)
        scale = finfo.max / amax
        q = (
            (xb * scale.unsqueeze(-1))
            .clamp(min=finfo.min, max=finfo.max)
            .reshape(blk_m, blk_n, gm, gn)
            .permute(0, 2, 1, 3)
            .reshape(x.shape)
        )
        return q.to(quant_dtype).contiguous(), scale.float().reciprocal()

    def group_broadcast(t: Any, shape: Any) -> Any:
        for i, s in enumerate(shape):
            if t.shape[i] != s and t.shape[i] != 1:
                assert s % t.shape[i] == 0
                t = (
                    t.unsqueeze(i + 1)
                    .expand(*t.shape[: i + 1], s // t.shape[i], *t.shape[i + 1 :])
                    .flatten(i, i + 1)
                )
        return t

    return dict(GroupShape=GroupShape, scaled_quantize=scaled_quantize, group_broadcast=group_broadcast)


def _test_utils() -> dict[str, Any]:
    """tests/kernels/utils.py's fp8 comparison helpers (used by the tests' ROCm branches)."""
    import torch

    def _ordered(t: Any) -> Any:
        b = t.view(torch.uint8).to(torch.int16)
        mag = b & 0x7F
        return torch.where(b & 0x80 != 0, -mag, mag)

    def fp8_ulp_distance(a: Any, b: Any) -> Any:
        return (_ordered(a) - _ordered(b)).abs()

    def fp8_allclose(a: Any, b: Any, rtol: float = 0.0, atol: float = 0.0) -> bool:
        return bool(torch.allclose(a.float(), b.float(), rtol=rtol, atol=atol))

    return dict(fp8_ulp_distance=fp8_ulp_distance, fp8_allclose=fp8_allclose)


def install(ops: Any, module: Callable[..., types.ModuleType]) -> list[str]:
    """Installs the modules through the runner's ``module(name, **attrs)`` (makes or updates
    ``sys.modules[name]`` and its parents); returns what it installed."""
    for name, attrs in _layers(ops).items():
        module(name, **attrs)
    module("vllm.model_executor.layers.quantization.utils.quant_utils", **_quant_utils())
    module(
        "vllm.model_executor.layers.quantization.utils.fp8_utils",
        per_token_group_quant_fp8=ops.per_token_group_quant_fp8,
        w8a8_triton_block_scaled_mm=ops.w8a8_triton_block_scaled_mm,
        w8a8_block_fp8_matmul=ops.w8a8_block_fp8_matmul,
    )

    def cutlass_block_scaled_mm(A: Any, B: Any, As: Any, Bs: Any, block_size: Any, output_dtype: Any) -> Any:
        # vLLM's layer-level wrapper: B [N, K] given as the column-major [K, N] _custom_ops takes
        return ops.cutlass_scaled_mm(A, B.T, As, Bs.T, output_dtype)

    module(
        "vllm.model_executor.kernels.linear.scaled_mm.cutlass",
        cutlass_scaled_mm=cutlass_block_scaled_mm,
    )
    module(
        "vllm.utils.deep_gemm",
        get_tma_aligned_size=lambda x, element_size: -(-x // (16 // element_size)) * (16 // element_size),
        fp8_gemm_nt=_not_opmux("fp8_gemm_nt"),
        per_block_cast_to_fp8=_not_opmux("per_block_cast_to_fp8"),
        should_use_deepgemm_for_fp8_linear=_not_opmux("should_use_deepgemm_for_fp8_linear"),
    )
    module(
        "vllm.utils.flashinfer",
        flashinfer_fp8_blockscale_gemm=_not_opmux("flashinfer_fp8_blockscale_gemm"),
        has_flashinfer_fp8_blockscale_gemm=lambda: False,  # FlashInfer is not installed here
    )
    module("vllm.utils.import_utils", has_deep_gemm=lambda: False)  # nor DeepGEMM

    class VllmConfig:
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

    module("vllm.config", VllmConfig=VllmConfig)
    module("tests.kernels.utils", **_test_utils())
    register_c_ops(ops)
    return [
        "vllm.ir, vllm.model_executor.layers (layernorm, activation, rotary_embedding, quantization "
        "utils), vllm.config, vllm.utils.{deep_gemm,flashinfer,import_utils}, torch.ops._C: shims"
    ]
