"""What vLLM's fused-MoE kernel tests import besides ``_custom_ops``, for tools/engine_compat.py
(loaded by it after tools/engine_compat_vllm.py; the vLLM release these follow is in
docs/compat.md: v0.19.1, the last with ``test_mixtral_moe``).

``tests/kernels/moe/test_moe.py`` and ``test_block_fp8.py`` (and the upstream ``tests/kernels``
helpers they import: ``moe/utils.py``, ``utils.py``, ``quant_utils.py``,
``quantization/nvfp4_utils.py``, fetched beside them) reach far into vLLM: its fused-MoE config
objects, the modular kernel, the Mixtral layer, the platform / config / distributed context.
Small stand-ins, written from vLLM's definitions, with one rule: every path that computes
experts runs ``vllm._custom_ops`` / opmux.compat.vllm's ``fused_experts`` (opmux's
``moe.fused_experts``), exactly where vLLM runs its Triton ``fused_experts``:

- ``fused_moe.fused_experts`` (the module function), ``TritonExperts`` inside
  ``modular_kernel.FusedMoEKernel.apply``, and the Mixtral layer's ``FusedMoE`` forward;
- ``FusedMoEQuantConfig`` keeps vLLM's descriptors and properties (``use_fp8_w8a8``,
  ``block_shape``, ``use_int8_w8a16``, ...), which opmux.compat.vllm reads by attribute, so a
  form opmux does not run is refused by name there (``NotImplementedError``);
- the tests' references (``tests.kernels.utils.torch_moe`` / ``torch_experts``, the files' own
  torch loops, Hugging Face's ``MixtralSparseMoeBlock``) stay upstream's code.

Kernels opmux does not have (Marlin, DeepGEMM, FlashInfer, batched experts, fp4 / int quantizers)
are stand-ins raising ``NotImplementedError`` naming them, so only their cases fail.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import types
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple


def _not_opmux(name: str) -> Any:
    def missing(*args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{name}: not an opmux op (no opmux kernel to run it)")

    missing.__name__ = name.rpartition(".")[2]
    return missing


def _not_opmux_class(name: str) -> type:
    def init(self: Any, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"{name}: not an opmux op (no opmux kernel to run it)")

    return type(name.rpartition(".")[2], (), {"__init__": init})


# -- vllm.scalar_type (vLLM's ScalarType: exponent / mantissa / sign / bias) ---------------------
@dataclasses.dataclass(frozen=True)
class ScalarType:
    exponent: int
    mantissa: int
    signed: bool
    bias: int
    _finite_values_only: bool = False
    nan_repr: int = 1  # vLLM's NanRepr: NONE 0, IEEE_754 1, EXTD_RANGE_MAX_MIN 2

    @property
    def size_bits(self) -> int:
        return self.exponent + self.mantissa + int(self.signed)

    @property
    def id(self) -> int:
        # vLLM packs the fields into an int; any injective packing serves the stand-ins
        return (
            self.exponent
            | self.mantissa << 8
            | int(self.signed) << 16
            | (self.bias & 0xFFFF) << 17
            | int(self._finite_values_only) << 33
            | self.nan_repr << 34
        )

    def is_floating_point(self) -> bool:
        return self.exponent != 0

    def max(self) -> float:
        if not self.is_floating_point():
            return float((1 << (self.mantissa)) - 1 - self.bias)
        max_mantissa = (1 << self.mantissa) - 1
        if self.nan_repr == 2:  # EXTD_RANGE_MAX_MIN: the all-ones pattern is NaN
            max_mantissa -= 1
        max_exp = (1 << self.exponent) - 1
        if self.nan_repr == 2 or self._finite_values_only:
            pass
        elif self.nan_repr == 1:  # IEEE: the top exponent holds inf / NaN
            max_exp -= 1
        exp_bias = (1 << (self.exponent - 1)) - 1
        return float((1 + max_mantissa / (1 << self.mantissa)) * 2.0 ** (max_exp - exp_bias))


def _scalar_types() -> types.SimpleNamespace:
    def u(bits: int, bias: int = 0) -> ScalarType:
        return ScalarType(0, bits, False, bias)

    def s(bits: int) -> ScalarType:
        return ScalarType(0, bits - 1, True, 0)

    return types.SimpleNamespace(
        int4=s(4),
        uint4=u(4),
        int8=s(8),
        uint8=u(8),
        uint4b8=u(4, 8),
        uint8b128=u(8, 128),
        float8_e4m3fn=ScalarType(4, 3, True, 0, True, 2),
        float8_e5m2=ScalarType(5, 2, True, 0),
        float16_e8m7=ScalarType(8, 7, True, 0),
        float16_e5m10=ScalarType(5, 10, True, 0),
        float6_e3m2f=ScalarType(3, 2, True, 0, True, 0),
        float4_e2m1f=ScalarType(2, 1, True, 0, True, 0),
        bfloat16=ScalarType(8, 7, True, 0),
        float16=ScalarType(5, 10, True, 0),
    )


# -- vllm.model_executor.layers.fused_moe.activation --------------------------------------------
class MoEActivation(enum.Enum):
    SILU = "silu"
    GELU = "gelu"
    RELU2 = "relu2"
    SWIGLUOAI = "swigluoai"
    SWIGLUSTEP = "swiglustep"
    SILU_NO_MUL = "silu_no_mul"
    GELU_NO_MUL = "gelu_no_mul"
    RELU2_NO_MUL = "relu2_no_mul"

    @property
    def is_gated(self) -> bool:
        return not self.value.endswith("_no_mul")

    @property
    def custom_op_name(self) -> str:
        return {
            "silu": "silu_and_mul",
            "gelu": "gelu_and_mul",
            "swigluoai": "swigluoai_and_mul",
            "swiglustep": "swiglustep_and_mul",
            "relu2": "relu2",
            "silu_no_mul": "silu_and_mul",
            "gelu_no_mul": "gelu_and_mul",
            "relu2_no_mul": "relu2",
        }[self.value]

    def without_mul(self) -> MoEActivation:
        return {"silu": MoEActivation.SILU_NO_MUL, "gelu": MoEActivation.GELU_NO_MUL}.get(self.value, self)

    @classmethod
    def from_str(cls, s: str) -> MoEActivation:
        for member in cls:
            if member.value == s:
                return member
        raise ValueError(f"Unknown MoE activation: {s!r}. Valid activations: {[m.value for m in cls]}")


# -- vllm.model_executor.layers.fused_moe.config ------------------------------------------------
class GroupShape(NamedTuple):
    row: int
    col: int


_PER_TENSOR = GroupShape(-1, -1)
_PER_TOKEN = GroupShape(1, -1)


@dataclasses.dataclass
class FusedMoEQuantDesc:
    dtype: Any = None
    shape: GroupShape | None = None
    scale: Any = None
    alpha_or_gscale: Any = None
    zp: Any = None
    bias: Any = None


@dataclasses.dataclass
class FusedMoEQuantConfig:
    """vLLM's FusedMoEQuantConfig: four descriptors and the properties its kernels (and
    opmux.compat.vllm) read."""

    _a1: FusedMoEQuantDesc
    _a2: FusedMoEQuantDesc
    _w1: FusedMoEQuantDesc
    _w2: FusedMoEQuantDesc
    is_nvfp4_scale_swizzled: bool = True

    quant_dtype = property(lambda self: self._a1.dtype)
    weight_quant_dtype = property(lambda self: self._w1.dtype)
    is_quantized = property(lambda self: self._a1.dtype is not None)
    per_act_token_quant = property(lambda self: self._a1.shape == _PER_TOKEN)
    is_per_act_token = per_act_token_quant
    per_out_ch_quant = property(lambda self: self._w1.shape == _PER_TOKEN)
    is_per_tensor = property(lambda self: self._a1.shape == _PER_TENSOR)
    a1_scale = property(lambda self: self._a1.scale)
    a2_scale = property(lambda self: self._a2.scale)
    a1_gscale = property(lambda self: self._a1.alpha_or_gscale)
    a2_gscale = property(lambda self: self._a2.alpha_or_gscale)
    w1_scale = property(lambda self: self._w1.scale)
    w2_scale = property(lambda self: self._w2.scale)
    w1_zp = property(lambda self: self._w1.zp)
    w2_zp = property(lambda self: self._w2.zp)
    w1_bias = property(lambda self: self._w1.bias)
    w2_bias = property(lambda self: self._w2.bias)
    g1_alphas = property(lambda self: self._w1.alpha_or_gscale)
    g2_alphas = property(lambda self: self._w2.alpha_or_gscale)

    @property
    def block_shape(self) -> list[int] | None:
        s = self._a1.shape
        if s is not None and s != _PER_TENSOR and s != _PER_TOKEN:
            return [s.row, s.col]
        return None

    @property
    def is_block_quantized(self) -> bool:
        return self.block_shape is not None

    @property
    def use_fp8_w8a8(self) -> bool:
        import torch

        return bool(self._a1.dtype == torch.float8_e4m3fn)

    @property
    def use_int8_w8a8(self) -> bool:
        import torch

        return bool(self._a1.dtype == torch.int8)

    @property
    def use_int8_w8a16(self) -> bool:
        import torch

        return self._a1.dtype is None and self._w1.dtype == torch.int8

    @property
    def use_fp8_w8a16(self) -> bool:
        import torch

        return self._a1.dtype is None and self._w1.dtype == torch.float8_e4m3fn

    use_int4_w4a16 = property(lambda self: self._a1.dtype is None and self._w1.dtype == "int4")
    use_nvfp4_w4a16 = property(lambda self: self._a1.dtype is None and self._w1.dtype == "nvfp4")
    use_mxfp4_w4a16 = property(lambda self: self._a1.dtype is None and self._w1.dtype == "mxfp4")
    use_mxfp4_w4a4 = property(lambda self: self._a1.dtype == "mxfp4" and self._w1.dtype == "mxfp4")
    use_nvfp4_w4a4 = property(lambda self: self._a1.dtype == "nvfp4")
    use_mxfp4_w4a8 = property(lambda self: self._a1.dtype == "fp8" and self._w1.dtype == "mxfp4")

    @property
    def ocp_mx_scheme(self) -> str | None:
        # vLLM derives a scheme only from string dtypes (mx formats)
        a, w = self._a1.dtype, self._w1.dtype
        if (a is not None and not isinstance(a, str)) or (w is not None and not isinstance(w, str)):
            return None
        if (isinstance(a, str) and a.startswith("mx")) or (isinstance(w, str) and w.startswith("mx")):
            return f"w_{w}" + (f"_a_{a}" if a else "")
        return None

    @staticmethod
    def make(
        quant_dtype: Any = None,
        per_act_token_quant: bool = False,
        per_out_ch_quant: bool = False,
        block_shape: list[int] | None = None,
        w1_scale: Any = None,
        w2_scale: Any = None,
        a1_scale: Any = None,
        a2_scale: Any = None,
        g1_alphas: Any = None,
        g2_alphas: Any = None,
        a1_gscale: Any = None,
        a2_gscale: Any = None,
        w1_bias: Any = None,
        w2_bias: Any = None,
        w1_zp: Any = None,
        w2_zp: Any = None,
        weight_dtype: Any = None,
        is_nvfp4_scale_swizzled: bool = True,
    ) -> FusedMoEQuantConfig:
        if weight_dtype is None:
            weight_dtype = quant_dtype
        a_shape: GroupShape | None
        w_shape: GroupShape | None
        if block_shape is not None:
            assert not per_act_token_quant and not per_out_ch_quant
            a_shape = w_shape = GroupShape(block_shape[0], block_shape[1])
        else:
            w_shape = _PER_TOKEN if per_out_ch_quant else None
            a_shape = _PER_TOKEN if per_act_token_quant else (None if quant_dtype is None else _PER_TENSOR)
        return FusedMoEQuantConfig(
            FusedMoEQuantDesc(quant_dtype, a_shape, a1_scale, a1_gscale),
            FusedMoEQuantDesc(quant_dtype, a_shape, a2_scale, a2_gscale),
            FusedMoEQuantDesc(weight_dtype, w_shape, w1_scale, g1_alphas, w1_zp, w1_bias),
            FusedMoEQuantDesc(weight_dtype, w_shape, w2_scale, g2_alphas, w2_zp, w2_bias),
            is_nvfp4_scale_swizzled,
        )


def _config_module() -> dict[str, Any]:
    import torch

    def fp8_w8a8_moe_quant_config(
        w1_scale: Any,
        w2_scale: Any,
        a1_scale: Any = None,
        a2_scale: Any = None,
        w1_bias: Any = None,
        w2_bias: Any = None,
        per_act_token_quant: bool = False,
        per_out_ch_quant: bool = False,
        block_shape: list[int] | None = None,
        a1_gscale: Any = None,
        a2_gscale: Any = None,
        g1_alphas: Any = None,
        g2_alphas: Any = None,
    ) -> FusedMoEQuantConfig:
        return FusedMoEQuantConfig.make(
            torch.float8_e4m3fn,
            w1_scale=w1_scale,
            g1_alphas=g1_alphas,
            w2_scale=w2_scale,
            g2_alphas=g2_alphas,
            w1_bias=w1_bias,
            w2_bias=w2_bias,
            a1_scale=a1_scale,
            a1_gscale=a1_gscale,
            a2_scale=a2_scale,
            a2_gscale=a2_gscale,
            per_act_token_quant=per_act_token_quant,
            per_out_ch_quant=per_out_ch_quant,
            block_shape=block_shape,
        )

    def _weight_only(dtype: Any) -> Callable[..., FusedMoEQuantConfig]:
        def build(
            w1_scale: Any, w2_scale: Any, w1_zp: Any, w2_zp: Any, block_shape: list[int] | None = None
        ) -> FusedMoEQuantConfig:
            g = GroupShape(*block_shape) if block_shape is not None else None
            return FusedMoEQuantConfig(
                FusedMoEQuantDesc(shape=g),
                FusedMoEQuantDesc(shape=g),
                FusedMoEQuantDesc(dtype, g, w1_scale, None, w1_zp),
                FusedMoEQuantDesc(dtype, g, w2_scale, None, w2_zp),
            )

        return build

    class RoutingMethodType(enum.IntEnum):
        Default = 0
        Renormalize = 1
        DeepSeekV3 = 2
        Llama4 = 3
        RenormalizeNaive = 4
        TopK = 5
        Custom = 6
        Simulated = 7
        Unspecified = 8

    @dataclasses.dataclass
    class FusedMoEParallelConfig:
        tp_size: int = 1
        pcp_size: int = 1
        dp_size: int = 1
        ep_size: int = 1
        tp_rank: int = 0
        pcp_rank: int = 0
        dp_rank: int = 0
        ep_rank: int = 0
        sp_size: int = 1
        use_ep: bool = False
        all2all_backend: str = "allgather_reducescatter"
        enable_eplb: bool = False

        @classmethod
        def make_no_parallel(cls) -> FusedMoEParallelConfig:
            return cls()

    class FusedMoEConfig:
        def __init__(self, **kwargs: Any) -> None:
            self.__dict__.update(kwargs)

    return dict(
        FusedMoEQuantConfig=FusedMoEQuantConfig,
        FusedMoEQuantDesc=FusedMoEQuantDesc,
        FUSED_MOE_UNQUANTIZED_CONFIG=FusedMoEQuantConfig.make(),
        fp8_w8a8_moe_quant_config=fp8_w8a8_moe_quant_config,
        int8_w8a16_moe_quant_config=_weight_only(torch.int8),
        int4_w4a16_moe_quant_config=_weight_only("int4"),
        RoutingMethodType=RoutingMethodType,
        FusedMoEParallelConfig=FusedMoEParallelConfig,
        FusedMoEConfig=FusedMoEConfig,
    )


# -- the modular kernel: prepare / finalize without expert parallelism, Triton experts ----------
class _NoEPPrepareAndFinalize:
    """``maybe_make_prepare_finalize`` for one rank: vLLM's MoEPrepareAndFinalizeNoEP, whose
    prepare / finalize around the Triton experts add nothing opmux's op does not do itself
    (activation quantization per 1x128 group, the weighted sum over top-k)."""

    def __init__(self, moe: Any = None, quant_config: Any = None) -> None:
        self.moe, self.quant_config = moe, quant_config


def _modular(ops: Any) -> dict[str, Any]:
    class TritonExperts:
        """vLLM's TritonExperts (fused_moe.py's Triton kernel): here opmux's ``moe.fused_experts``
        through opmux.compat.vllm.fused_experts, with the experts' quant config."""

        def __init__(self, moe_config: Any, quant_config: Any) -> None:
            self.moe_config, self.quant_config = moe_config, quant_config

    class FusedMoEKernel:
        def __init__(
            self,
            prepare_finalize: Any,
            fused_experts: Any,
            shared_experts: Any = None,
            moe_parallel_config: Any = None,
            inplace: bool = False,
        ) -> None:
            if not isinstance(fused_experts, TritonExperts):
                raise NotImplementedError(
                    f"FusedMoEKernel with {type(fused_experts).__name__}: opmux runs TritonExperts' form only"
                )
            if shared_experts is not None:
                raise NotImplementedError("FusedMoEKernel shared_experts: not run by the opmux stand-in")
            self.prepare_finalize, self.fused_experts = prepare_finalize, fused_experts
            self.inplace = inplace

        def apply(
            self,
            hidden_states: Any,
            w1: Any,
            w2: Any,
            topk_weights: Any,
            topk_ids: Any,
            activation: Any = MoEActivation.SILU,
            global_num_experts: int = -1,
            expert_map: Any = None,
            apply_router_weight_on_input: bool = False,
            shared_experts_input: Any = None,
        ) -> Any:
            return ops.fused_experts(
                hidden_states,
                w1,
                w2,
                topk_weights,
                topk_ids,
                inplace=self.inplace,
                activation=activation,
                apply_router_weight_on_input=apply_router_weight_on_input,
                global_num_experts=global_num_experts,
                expert_map=expert_map,
                quant_config=self.fused_experts.quant_config,
            )

    def maybe_make_prepare_finalize(
        moe: Any,
        quant_config: Any,
        routing_tables: Any = None,
        allow_new_interface: bool = False,
        use_monolithic: bool = False,
    ) -> Any:
        return _NoEPPrepareAndFinalize(moe, quant_config)

    return dict(
        TritonExperts=TritonExperts,
        FusedMoEKernel=FusedMoEKernel,
        maybe_make_prepare_finalize=maybe_make_prepare_finalize,
    )


# -- quantization helpers the references call -----------------------------------------------------
def _quant(ops: Any) -> dict[str, Any]:
    import torch

    def get_fp8_min_max() -> tuple[float, float]:
        finfo = torch.finfo(torch.float8_e4m3fn)
        return finfo.min, finfo.max

    def _ceil_to_ue8m0(x: Any) -> Any:
        return torch.pow(2.0, torch.ceil(torch.log2(x.abs())))

    def per_block_cast_to_fp8(x: Any, block_size: Any = (128, 128), use_ue8m0: bool = False) -> Any:
        # vllm/utils/deep_gemm.py: a test helper (torch), the weights' 128x128 block quantization
        assert x.dim() == 2
        m, n = x.shape
        bm, bn = block_size
        pad = torch.zeros((-(-m // bm) * bm, -(-n // bn) * bn), dtype=x.dtype, device=x.device)
        pad[:m, :n] = x
        view = pad.view(-1, bm, pad.size(1) // bn, bn)
        amax = view.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
        sf = amax / get_fp8_min_max()[1]
        sf = _ceil_to_ue8m0(sf) if use_ue8m0 else sf
        q = (view * (1.0 / sf)).to(torch.float8_e4m3fn)
        return q.view_as(pad)[:m, :n].contiguous(), sf.view(view.size(0), view.size(2))

    def moe_kernel_quantize_input(
        A: Any,
        A_scale: Any,
        quant_dtype: Any,
        per_act_token_quant: bool,
        block_shape: list[int] | None = None,
        is_fp4_scale_swizzled: bool = True,
        ocp_mx_scheme: str | None = None,
    ) -> tuple[Any, Any]:
        # fused_moe/utils.py: fp8 through _custom_ops (opmux), unquantized as is; other formats
        # are not opmux's
        if ocp_mx_scheme is not None:
            raise NotImplementedError(
                f"moe_kernel_quantize_input: ocp_mx_scheme {ocp_mx_scheme!r} not an opmux op"
            )
        if quant_dtype == torch.float8_e4m3fn:
            if block_shape is None:
                return ops.scaled_fp8_quant(A, A_scale, use_per_token_if_dynamic=per_act_token_quant)
            assert not per_act_token_quant and len(block_shape) == 2
            q, s = ops.per_token_group_quant_fp8(A, block_shape[1])
            return q, s
        if quant_dtype is None or quant_dtype in (torch.float16, torch.bfloat16):
            return A, A_scale
        raise NotImplementedError(f"moe_kernel_quantize_input: quant_dtype {quant_dtype} not an opmux op")

    return dict(
        get_fp8_min_max=get_fp8_min_max,
        _ceil_to_ue8m0=_ceil_to_ue8m0,
        per_block_cast_to_fp8=per_block_cast_to_fp8,
        moe_kernel_quantize_input=moe_kernel_quantize_input,
    )


# -- config / forward context / distributed (one process, no model) ------------------------------
class _CompilationConfig:
    def __init__(self) -> None:
        self.static_forward_context: dict[str, Any] = {}


class VllmConfig:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.compilation_config = _CompilationConfig()
        self.parallel_config = types.SimpleNamespace(
            eplb_config=types.SimpleNamespace(num_redundant_experts=0)
        )


_CURRENT: dict[str, Any] = {}


@contextlib.contextmanager
def set_current_vllm_config(
    vllm_config: Any, check_compile: bool = False, prefix: str | None = None
) -> Iterator[None]:
    old = _CURRENT.get("config")
    _CURRENT["config"] = vllm_config
    try:
        yield
    finally:
        _CURRENT["config"] = old


def get_current_vllm_config() -> Any:
    return _CURRENT.get("config") or VllmConfig()


@contextlib.contextmanager
def set_forward_context(attn_metadata: Any, vllm_config: Any, *args: Any, **kwargs: Any) -> Iterator[None]:
    old = _CURRENT.get("forward")
    _CURRENT["forward"] = types.SimpleNamespace(attn_metadata=attn_metadata, all_moe_layers=None)
    try:
        yield
    finally:
        _CURRENT["forward"] = old


def get_forward_context() -> Any:
    ctx = _CURRENT.get("forward")
    if ctx is None:
        raise AssertionError("Forward context is not set. Please use `set_forward_context` to set it.")
    return ctx


# -- the Mixtral layer (vllm/model_executor/models/mixtral.py) -----------------------------------
def _mixtral(ops: Any) -> dict[str, Any]:
    import torch
    from torch import nn
    from torch.nn import functional as F

    class ReplicatedLinear(nn.Module):
        def __init__(
            self,
            input_size: int,
            output_size: int,
            bias: bool = True,
            params_dtype: Any = None,
            quant_config: Any = None,
            prefix: str = "",
            **kwargs: Any,
        ) -> None:
            super().__init__()
            dtype = params_dtype or torch.get_default_dtype()
            self.weight = nn.Parameter(torch.empty(output_size, input_size, dtype=dtype), requires_grad=False)
            self.bias = (
                nn.Parameter(torch.empty(output_size, dtype=dtype), requires_grad=False) if bias else None
            )

        def forward(self, x: Any) -> tuple[Any, Any]:
            return F.linear(x, self.weight, self.bias), None

    class _UnquantizedMethod:
        def process_weights_after_loading(self, layer: Any) -> None:
            """vLLM's UnquantizedFusedMoEMethod selects its kernel here; opmux's needs nothing."""

    class FusedMoE(nn.Module):
        """vLLM's FusedMoE for one rank, unquantized: ``w13_weight`` [E, 2I, H] (w1 rows, then
        w3), ``w2_weight`` [E, H, I]; forward = softmax top-k (``renormalize``) and
        opmux.compat.vllm's ``fused_experts``."""

        def __init__(
            self,
            num_experts: int,
            top_k: int,
            hidden_size: int,
            intermediate_size: int,
            params_dtype: Any = None,
            reduce_results: bool = False,
            renormalize: bool = True,
            quant_config: Any = None,
            tp_size: int | None = None,
            dp_size: int | None = None,
            prefix: str = "",
            **kwargs: Any,
        ) -> None:
            super().__init__()
            if quant_config is not None:
                raise NotImplementedError("FusedMoE quant_config: the opmux stand-in runs unquantized layers")
            if (tp_size or 1) != 1 or (dp_size or 1) != 1:
                raise NotImplementedError(
                    "FusedMoE tensor / data parallelism: the opmux stand-in is one rank"
                )
            dtype = params_dtype or torch.get_default_dtype()
            self.top_k, self.renormalize, self.global_num_experts = top_k, renormalize, num_experts
            self.w13_weight = nn.Parameter(
                torch.empty(num_experts, 2 * intermediate_size, hidden_size, dtype=dtype), requires_grad=False
            )
            self.w2_weight = nn.Parameter(
                torch.empty(num_experts, hidden_size, intermediate_size, dtype=dtype), requires_grad=False
            )
            self.quant_method = _UnquantizedMethod()

        def forward(self, hidden_states: Any, router_logits: Any) -> Any:
            w, ids, _ = ops.fused_topk(hidden_states, router_logits, self.top_k, self.renormalize)
            return ops.fused_experts(
                hidden_states,
                self.w13_weight,
                self.w2_weight,
                w,
                ids,
                global_num_experts=self.global_num_experts,
            )

    class MixtralMoE(nn.Module):
        def __init__(
            self,
            num_experts: int,
            top_k: int,
            hidden_size: int,
            intermediate_size: int,
            params_dtype: Any = None,
            quant_config: Any = None,
            tp_size: int | None = None,
            dp_size: int | None = None,
            prefix: str = "",
            enable_eplb: bool = False,
        ) -> None:
            super().__init__()
            self.hidden_size = hidden_size
            self.gate = ReplicatedLinear(hidden_size, num_experts, bias=False, params_dtype=params_dtype)
            self.experts = FusedMoE(
                num_experts=num_experts,
                top_k=top_k,
                hidden_size=hidden_size,
                intermediate_size=intermediate_size,
                params_dtype=params_dtype,
                reduce_results=True,
                renormalize=True,
                quant_config=quant_config,
                tp_size=tp_size,
                dp_size=dp_size,
            )

        def forward(self, hidden_states: Any) -> Any:
            orig_shape = hidden_states.shape
            hidden_states = hidden_states.view(-1, self.hidden_size)
            router_logits, _ = self.gate(hidden_states)
            return self.experts(hidden_states, router_logits).view(orig_shape)

    return dict(MixtralMoE=MixtralMoE, FusedMoE=FusedMoE, ReplicatedLinear=ReplicatedLinear)


def install(ops: Any, module: Callable[..., types.ModuleType]) -> list[str]:
    """Installs the modules through the runner's ``module(name, **attrs)``; call after
    engine_compat_vllm.install (the activation layers, quant utils)."""
    import sys

    import torch

    fm = "vllm.model_executor.layers.fused_moe"
    q = _quant(ops)
    modular = _modular(ops)
    config = _config_module()
    module("vllm.scalar_type", ScalarType=ScalarType, scalar_types=_scalar_types())
    module(f"{fm}.activation", MoEActivation=MoEActivation)
    module(f"{fm}.config", **config)
    module(f"{fm}.modular_kernel", FusedMoEKernel=modular["FusedMoEKernel"])
    module(f"{fm}.all2all_utils", maybe_make_prepare_finalize=modular["maybe_make_prepare_finalize"])
    module(f"{fm}.fused_moe", TritonExperts=modular["TritonExperts"])
    module(f"{fm}.utils", moe_kernel_quantize_input=q["moe_kernel_quantize_input"])
    module(fm, MoEActivation=MoEActivation, FusedMoE=_mixtral(ops)["FusedMoE"])
    module(
        f"{fm}.fused_batched_moe",
        BatchedPrepareAndFinalize=_not_opmux_class("BatchedPrepareAndFinalize"),
        BatchedTritonExperts=_not_opmux_class("BatchedTritonExperts"),
        NaiveBatchedExperts=_not_opmux_class("NaiveBatchedExperts"),
    )
    module(
        f"{fm}.fused_marlin_moe",
        fused_marlin_moe=_not_opmux("fused_marlin_moe"),
        batched_fused_marlin_moe=_not_opmux("batched_fused_marlin_moe"),
    )
    module(f"{fm}.deep_gemm_moe", _valid_deep_gemm_shape=_not_opmux("_valid_deep_gemm_shape"))
    module(f"{fm}.triton_deep_gemm_moe", TritonOrDeepGemmExperts=_not_opmux_class("TritonOrDeepGemmExperts"))
    qu = "vllm.model_executor.layers.quantization.utils"
    module(f"{qu}.marlin_utils", marlin_permute_bias=_not_opmux("marlin_permute_bias"))
    module(
        f"{qu}.marlin_utils_fp4",
        rand_marlin_weight_mxfp4_like=_not_opmux("rand_marlin_weight_mxfp4_like"),
        rand_marlin_weight_nvfp4_like=_not_opmux("rand_marlin_weight_nvfp4_like"),
    )
    module(f"{qu}.marlin_utils_fp8", marlin_quant_fp8_torch=_not_opmux("marlin_quant_fp8_torch"))
    module(
        f"{qu}.marlin_utils_test",
        awq_marlin_quantize=_not_opmux("awq_marlin_quantize"),
        marlin_quantize=_not_opmux("marlin_quantize"),
    )
    module(
        f"{qu}.quant_utils",
        get_fp8_min_max=q["get_fp8_min_max"],
        quantize_weights=_not_opmux("quantize_weights (int4 / int8 weight quantization)"),
    )
    module("vllm.model_executor.models.mixtral", MixtralMoE=_mixtral(ops)["MixtralMoE"])
    act = sys.modules["vllm.model_executor.layers.activation"]
    module(
        "vllm.model_executor.custom_op",
        op_registry={
            "silu_and_mul": act.SiluAndMul,
            "gelu_and_mul": act.GeluAndMul,
            "swigluoai_and_mul": act.SwigluOAIAndMul,
            "swiglustep_and_mul": act.SwigluStepAndMul,
        },
    )
    module(
        "vllm.utils.deep_gemm",
        per_block_cast_to_fp8=q["per_block_cast_to_fp8"],
        _ceil_to_ue8m0=q["_ceil_to_ue8m0"],
        is_deep_gemm_e8m0_used=lambda: False,  # DeepGEMM is not installed
        get_mk_alignment_for_contiguous_layout=lambda: [128, 128],
    )

    def make_tensor_with_pad(
        x: list[list[Any]],
        pad: Any,
        dtype: Any,
        *,
        max_len: int | None = None,
        device: Any = None,
        pin_memory: bool = False,
    ) -> Any:
        n = max_len or max((len(r) for r in x), default=0)
        return torch.tensor([list(r) + [pad] * (n - len(r)) for r in x], dtype=dtype, device=device)

    module("vllm.utils.torch_utils", make_tensor_with_pad=make_tensor_with_pad)

    class AttentionType(str, enum.Enum):
        DECODER = "decoder"
        ENCODER = "encoder"
        ENCODER_ONLY = "encoder_only"
        ENCODER_DECODER = "encoder_decoder"

    module("vllm.v1.attention.backend", AttentionType=AttentionType)
    module("vllm.v1.worker.workspace", init_workspace_manager=lambda *a, **k: None)
    module(
        "vllm.config",
        VllmConfig=VllmConfig,
        set_current_vllm_config=set_current_vllm_config,
        get_current_vllm_config=get_current_vllm_config,
    )
    module(
        "vllm.forward_context",
        set_forward_context=set_forward_context,
        get_forward_context=get_forward_context,
    )
    module("vllm.distributed.parallel_state", init_distributed_environment=lambda *a, **k: None)
    module("vllm._aiter_ops", rocm_aiter_ops=types.SimpleNamespace(refresh_env_variables=lambda: None))
    # _custom_ops names the tests' helper modules import but opmux has no kernel for
    for name in ("scaled_fp4_quant", "scaled_int8_quant"):
        if not hasattr(ops, name):
            setattr(ops, name, _not_opmux(f"vllm._custom_ops.{name}"))
    return [
        "vllm.model_executor.layers.fused_moe (config, activation, modular_kernel, all2all_utils, "
        "TritonExperts, Marlin / DeepGEMM / batched stand-ins), vllm.model_executor.models.mixtral, "
        "vllm.scalar_type, vllm.forward_context, vllm.distributed, vllm.v1: shims"
    ]
