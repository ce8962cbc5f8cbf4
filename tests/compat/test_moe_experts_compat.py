"""The engines' fused MoE entry points on ``moe.fused_experts``: vLLM's ``fused_experts`` /
``fused_moe`` / ``fused_topk`` and SGLang's ``fused_experts`` against the op's definition
(``reference``), bf16 / fp32 and fp8 with 128x128 block scales, in place, expert parallelism,
and the forms opmux refuses (``NotImplementedError`` naming them)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from pathlib import Path
from subprocess import CompletedProcess
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import opmux.compat.sgl_kernel as sgl
import opmux.compat.vllm as vllm
from opmux.kernels.ops.moe._experts import reference

M, K, N, E, TOPK = 9, 256, 128, 4, 2
TOL = {torch.float32: 1e-5, torch.bfloat16: 1.6e-2}


@pytest.fixture(autouse=True)
def _torch_moe() -> Iterator[None]:
    """The moe ops' torch backend (the routing's C++ kernel would be compiled first: slow here)."""
    import opmux.kernels as K_

    with K_.use_backends("moe.*=torch"):
        yield


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _problem(dtype: torch.dtype, seed: int = 0, experts: int = E) -> dict[str, torch.Tensor]:
    h = torch.randn(M, K, generator=_gen(seed)).to(dtype)
    w1 = (torch.randn(experts, 2 * N, K, generator=_gen(seed + 1)) * 0.05).to(dtype)
    w2 = (torch.randn(experts, K, N, generator=_gen(seed + 2)) * 0.05).to(dtype)
    gating = torch.randn(M, experts, generator=_gen(seed + 3))
    w, ids = torch.topk(torch.softmax(gating, -1), TOPK, -1)
    return dict(hidden=h, w1=w1, w2=w2, gating=gating, w=w / w.sum(-1, keepdim=True), ids=ids.int())


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    tol = TOL[want.dtype]
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def _fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """[E, R, C] weights -> e4m3 with 128x128 block scales (amax / 448 per block)."""
    e, r, c = w.shape
    blocks = w.float().view(e, r // 128, 128, c // 128, 128)
    scale = blocks.abs().amax(dim=(2, 4)) / 448.0
    q = (blocks / scale[:, :, None, :, None]).view(e, r, c).to(torch.float8_e4m3fn)
    return q, scale.contiguous()


# -- vLLM ---------------------------------------------------------------------------------------
def test_vllm_signatures() -> None:
    params = list(inspect.signature(vllm.fused_experts).parameters)
    assert params[:12] == [
        "hidden_states", "w1", "w2", "topk_weights", "topk_ids", "inplace", "activation",
        "apply_router_weight_on_input", "global_num_experts", "expert_map", "quant_config", "allow_deep_gemm",
    ]  # fmt: skip
    assert {"use_fp8_w8a8", "block_shape", "w1_scale", "a1_scale", "w1_zp", "use_int8_w8a16"} <= set(params)
    assert list(inspect.signature(vllm.fused_topk).parameters) == [
        "hidden_states", "gating_output", "topk", "renormalize", "indices_type",
    ]  # fmt: skip
    assert list(inspect.signature(vllm.fused_moe).parameters)[:6] == [
        "hidden_states", "w1", "w2", "gating_output", "topk", "renormalize",
    ]  # fmt: skip


@pytest.mark.parametrize("activation", ["silu", "gelu"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_vllm_fused_experts(dtype: torch.dtype, activation: str) -> None:
    p = _problem(dtype)
    want = reference(p["hidden"], p["w1"], p["w2"], p["w"], p["ids"], activation)
    got = vllm.fused_experts(p["hidden"], p["w1"], p["w2"], p["w"], p["ids"], activation=activation)
    assert got.dtype == dtype and got.data_ptr() != p["hidden"].data_ptr()
    _close(got, want)
    # in place: the result in hidden_states, which is returned
    h = p["hidden"].clone()
    out = vllm.fused_experts(h, p["w1"], p["w2"], p["w"], p["ids"], inplace=True, activation=activation)
    assert out is h
    torch.testing.assert_close(h, got, atol=0, rtol=0)


def test_vllm_apply_router_weight_on_input_and_int64_ids() -> None:
    p = _problem(torch.float32)
    w, ids = p["w"][:, :1].contiguous(), p["ids"][:, :1].long()
    want = reference(p["hidden"], p["w1"], p["w2"], w, ids, "silu", True)
    _close(vllm.fused_experts(p["hidden"], p["w1"], p["w2"], w, ids, apply_router_weight_on_input=True), want)


def test_vllm_fp8_block() -> None:
    p = _problem(torch.bfloat16)
    q1, s1 = _fp8(p["w1"])
    q2, s2 = _fp8(p["w2"])
    want = reference(p["hidden"], q1, q2, p["w"], p["ids"], w1_scale=s1, w2_scale=s2)
    got = vllm.fused_experts(
        p["hidden"],
        q1,
        q2,
        p["w"],
        p["ids"],
        use_fp8_w8a8=True,
        block_shape=[128, 128],
        w1_scale=s1,
        w2_scale=s2,
    )
    _close(got, want)
    # vLLM's current form: a FusedMoEQuantConfig (read by attribute)
    cfg = SimpleNamespace(use_fp8_w8a8=True, block_shape=[128, 128], w1_scale=s1, w2_scale=s2)
    torch.testing.assert_close(
        vllm.fused_experts(p["hidden"], q1, q2, p["w"], p["ids"], quant_config=cfg), got
    )
    # close to the unquantized experts (the fp8 form's error, not a different computation)
    full = reference(p["hidden"], p["w1"], p["w2"], p["w"], p["ids"])
    assert (got.float() - full.float()).abs().max() < 0.1 * full.float().abs().max()


def test_vllm_expert_map() -> None:
    """Expert parallelism: 8 global experts, this rank holds 4 of them (global 1, 3, 4, 6)."""
    p = _problem(torch.float32, experts=8)
    local = [1, 3, 4, 6]
    emap = torch.full((8,), -1, dtype=torch.int32)
    emap[local] = torch.arange(4, dtype=torch.int32)
    w1, w2 = p["w1"][local].contiguous(), p["w2"][local].contiguous()
    want = reference(p["hidden"], w1, w2, p["w"], p["ids"], expert_map=emap)
    for gne in (-1, 8):
        got = vllm.fused_experts(
            p["hidden"], w1, w2, p["w"], p["ids"], global_num_experts=gne, expert_map=emap
        )
        _close(got, want)
    # the terms of this rank's experts only: the full layer is the sum over ranks
    other = [0, 2, 5, 7]
    emap2 = torch.full((8,), -1, dtype=torch.int32)
    emap2[other] = torch.arange(4, dtype=torch.int32)
    rest = vllm.fused_experts(
        p["hidden"], p["w1"][other].contiguous(), p["w2"][other].contiguous(), p["w"], p["ids"],
        expert_map=emap2.long(),
    )  # fmt: skip
    _close(got + rest, reference(p["hidden"], p["w1"], p["w2"], p["w"], p["ids"]))
    with pytest.raises(ValueError, match="global_num_experts = 16 but expert_map has 8"):
        vllm.fused_experts(p["hidden"], w1, w2, p["w"], p["ids"], global_num_experts=16, expert_map=emap)
    with pytest.raises(ValueError, match="global_num_experts = 8 without an expert_map"):
        vllm.fused_experts(p["hidden"], w1, w2, p["w"], p["ids"], global_num_experts=8)


UNSUPPORTED: dict[str, tuple[dict[str, Any], str]] = {
    "int8_w8a8": (dict(use_int8_w8a8=True), "use_int8_w8a8"),
    "int8_w8a16": (dict(use_int8_w8a16=True), "use_int8_w8a16"),
    "int4_w4a16": (dict(use_int4_w4a16=True), "use_int4_w4a16"),
    "per_channel": (dict(per_channel_quant=True), "per_act_token_quant"),
    "fp8_per_tensor": (dict(use_fp8_w8a8=True), "use_fp8_w8a8 without block_shape"),
    "fp8_block_64": (dict(use_fp8_w8a8=True, block_shape=[64, 64]), r"block_shape \[64, 64\]"),
    "static_scales": (dict(a1_scale=torch.ones(1)), "a1_scale"),
    "zero_points": (dict(w1_zp=torch.zeros(1)), "w1_zp"),
    "bias": (dict(w1_bias=torch.zeros(E, 2 * N)), "w1_bias"),
    "mx": (dict(ocp_mx_scheme="w_mxfp4_a_mxfp4"), "ocp_mx_scheme"),
    "activation": (dict(activation="relu2_no_mul"), "activation 'relu2_no_mul'"),
}


@pytest.mark.parametrize("case", sorted(UNSUPPORTED))
def test_vllm_unsupported_forms_raise(case: str) -> None:
    p = _problem(torch.bfloat16)
    kwargs, what = UNSUPPORTED[case]
    with pytest.raises(
        NotImplementedError, match=f"fused_experts: {what}.*not supported by opmux; opmux runs"
    ):
        vllm.fused_experts(p["hidden"], p["w1"], p["w2"], p["w"], p["ids"], **kwargs)
    if "activation" not in kwargs and "ocp_mx_scheme" not in kwargs:
        # the same through a quant_config object
        cfg = SimpleNamespace(
            **{("per_act_token_quant" if k == "per_channel_quant" else k): v for k, v in kwargs.items()}
        )
        with pytest.raises(NotImplementedError, match="not supported by opmux"):
            vllm.fused_experts(p["hidden"], p["w1"], p["w2"], p["w"], p["ids"], quant_config=cfg)


def test_vllm_fp8_weights_need_the_flag() -> None:
    p = _problem(torch.bfloat16)
    q1, s1 = _fp8(p["w1"])
    q2, s2 = _fp8(p["w2"])
    with pytest.raises(ValueError, match="use_fp8_w8a8 is not set"):
        vllm.fused_experts(p["hidden"], q1, q2, p["w"], p["ids"])
    with pytest.raises(NotImplementedError, match="w1_scale / w2_scale without use_fp8_w8a8"):
        vllm.fused_experts(p["hidden"], p["w1"], p["w2"], p["w"], p["ids"], w1_scale=s1, w2_scale=s2)
    with pytest.raises(ValueError, match="not both"):
        cfg = SimpleNamespace(use_fp8_w8a8=True, block_shape=[128, 128], w1_scale=s1, w2_scale=s2)
        vllm.fused_experts(p["hidden"], q1, q2, p["w"], p["ids"], quant_config=cfg, use_fp8_w8a8=True)


@pytest.mark.parametrize("renormalize", [True, False])
def test_vllm_fused_topk_and_fused_moe(renormalize: bool) -> None:
    p = _problem(torch.bfloat16)
    g = p["gating"]
    w, ids, tei = vllm.fused_topk(p["hidden"], g, TOPK, renormalize)
    ref_w, ref_ids = torch.topk(torch.softmax(g, -1), TOPK, -1)
    if renormalize:
        ref_w = ref_w / ref_w.sum(-1, keepdim=True)
    assert ids.dtype == torch.int32 and torch.equal(ids.long(), ref_ids) and tei[1, 1] == M + 1
    torch.testing.assert_close(w, ref_w)
    assert vllm.fused_topk(p["hidden"], g, TOPK, renormalize, torch.int64)[1].dtype == torch.int64
    want = reference(p["hidden"], p["w1"], p["w2"], w, ids)
    got = vllm.fused_moe(p["hidden"], p["w1"], p["w2"], g, TOPK, renormalize)
    _close(got, want)
    h = p["hidden"].clone()
    assert vllm.fused_moe(h, p["w1"], p["w2"], g, TOPK, renormalize, inplace=True) is h
    torch.testing.assert_close(h, got, atol=0, rtol=0)

    def route(hidden: torch.Tensor, gating: torch.Tensor, topk: int, renorm: bool) -> Any:
        return torch.full((M, 1), 1.0), torch.zeros(M, 1, dtype=torch.int32)  # everyone to expert 0

    one = vllm.fused_moe(p["hidden"], p["w1"], p["w2"], g, 1, renormalize, custom_routing_function=route)
    _close(one, reference(p["hidden"], p["w1"], p["w2"], *route(p["hidden"], g, 1, True)))
    with pytest.raises(NotImplementedError, match="grouped top-k"):
        vllm.fused_moe(p["hidden"], p["w1"], p["w2"], g, TOPK, renormalize, use_grouped_topk=True)


# -- SGLang -------------------------------------------------------------------------------------
def _runner(**kw: Any) -> SimpleNamespace:
    """SGLang's MoeRunnerConfig (its defaults: inplace, silu, every expert maybe remote)."""
    base: dict[str, Any] = dict(
        num_experts=None, num_local_experts=None, activation="silu", is_gated=True,
        apply_router_weight_on_input=False, inplace=True, no_combine=False, routed_scaling_factor=None,
        gemm1_alpha=None, gemm1_clamp_limit=None,
    )  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def test_sgl_signature() -> None:
    assert list(inspect.signature(sgl.fused_experts).parameters)[:7] == [
        "hidden_states", "w1", "w2", "topk_output", "moe_runner_config", "b1", "b2",
    ]  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sgl_fused_experts(dtype: torch.dtype) -> None:
    p = _problem(dtype)
    topk_output = (p["w"], p["ids"], p["gating"])  # StandardTopKOutput's fields
    want = reference(p["hidden"], p["w1"], p["w2"], p["w"], p["ids"])
    got = sgl.fused_experts(
        p["hidden"], p["w1"], p["w2"], topk_output, _runner(inplace=False, num_experts=E, num_local_experts=E)
    )
    _close(got, want)
    h = p["hidden"].clone()
    assert sgl.fused_experts(h, p["w1"], p["w2"], topk_output, _runner()) is h  # inplace: the default
    torch.testing.assert_close(h, got, atol=0, rtol=0)
    # routed_scaling_factor scales the result
    scaled = sgl.fused_experts(
        p["hidden"], p["w1"], p["w2"], topk_output, _runner(inplace=False, routed_scaling_factor=2.5)
    )
    _close(scaled, (want.float() * 2.5).to(dtype))


def test_sgl_routed_scaling_factor_with_router_weight_on_input() -> None:
    """SGLang scales the combined output (moe_sum_reduce), also when the router weight went on
    the input: scaling the weights there would scale the gated activation's input instead."""
    p = _problem(torch.float32)
    w, ids = p["w"][:, :1].contiguous(), p["ids"][:, :1].contiguous()
    want = reference(p["hidden"], p["w1"], p["w2"], w, ids, apply_router_weight_on_input=True) * 2.5
    runner = _runner(inplace=False, apply_router_weight_on_input=True, routed_scaling_factor=2.5)
    got = sgl.fused_experts(p["hidden"], p["w1"], p["w2"], (w, ids, None), runner)
    _close(got, want)
    h = p["hidden"].clone()
    runner = _runner(apply_router_weight_on_input=True, routed_scaling_factor=2.5)
    assert sgl.fused_experts(h, p["w1"], p["w2"], (w, ids, None), runner) is h
    _close(h, want)


def test_sgl_skips_experts_of_other_ranks() -> None:
    """ids of -1 (an expert on another rank) contribute nothing, as SGLang's filter_expert."""
    p = _problem(torch.float32)
    ids = p["ids"].clone()
    ids[::2, 0] = -1
    got = sgl.fused_experts(p["hidden"], p["w1"], p["w2"], (p["w"], ids, None), _runner(inplace=False))
    keep = ids >= 0
    want = reference(p["hidden"], p["w1"], p["w2"], p["w"] * keep, ids.clamp(min=0))
    _close(got, want)


def test_sgl_fp8_block_and_refusals() -> None:
    p = _problem(torch.bfloat16)
    q1, s1 = _fp8(p["w1"])
    q2, s2 = _fp8(p["w2"])
    topk_output = (p["w"], p["ids"], None)
    got = sgl.fused_experts(
        p["hidden"], q1, q2, topk_output, _runner(inplace=False), use_fp8_w8a8=True, w1_scale=s1, w2_scale=s2,
        block_shape=[128, 128],
    )  # fmt: skip
    _close(got, reference(p["hidden"], q1, q2, p["w"], p["ids"], w1_scale=s1, w2_scale=s2))
    refused: list[tuple[dict[str, Any], dict[str, Any], str]] = [
        ({}, dict(use_int8_w8a8=True), "use_int8_w8a8"),
        ({}, dict(use_int4_w4a16=True), "use_int4_w4a16"),
        ({}, dict(b1=torch.zeros(E, 2 * N)), "b1 / b2"),
        ({}, dict(a1_scale=torch.ones(1)), "a1_scale"),
        (dict(no_combine=True), {}, "moe_runner_config.no_combine"),
        (dict(is_gated=False), {}, "moe_runner_config.is_gated=False"),
        (dict(activation="swigluoai", gemm1_alpha=1.0), {}, "gemm1_alpha 1.0"),
        (dict(activation="gelu_tanh"), {}, "activation 'gelu_tanh'"),
    ]
    for cfg, kwargs, what in refused:
        with pytest.raises(NotImplementedError, match=f"fused_experts: {what}.*not supported by opmux"):
            sgl.fused_experts(p["hidden"], p["w1"], p["w2"], topk_output, _runner(**cfg), **kwargs)


# -- the runner's shim: vllm.model_executor.layers.fused_moe ---------------------------------------
VLLM_STYLE = """
import torch

from vllm.model_executor.layers.fused_moe import fused_experts, fused_moe, fused_topk
from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts as fe


def test_fused_moe_shim():
    torch.manual_seed(0)
    a = torch.randn(6, 128, device="cuda", dtype=torch.bfloat16)
    w1 = torch.randn(4, 128, 128, device="cuda", dtype=torch.bfloat16) / 10
    w2 = torch.randn(4, 128, 64, device="cuda", dtype=torch.bfloat16) / 10
    score = torch.randn(6, 4, device="cuda")
    w, ids, _ = fused_topk(a, score, 2, True)
    out = fused_experts(a, w1, w2, w, ids)
    assert fe is fused_experts
    torch.testing.assert_close(fused_moe(a, w1, w2, score, 2, True), out, atol=0, rtol=0)
"""


def test_runner_shims_fused_moe(
    tmp_path: Path, run_engine_compat: Callable[[Path, Path], CompletedProcess[str]]
) -> None:
    (tmp_path / "test_vllm_fused_moe.py").write_text(VLLM_STYLE)
    proc = run_engine_compat(tmp_path, tmp_path)
    assert "test_vllm_fused_moe.py: 1 passed" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout


def test_vllm_moe_activation_enum_and_quant_dtype() -> None:
    """vLLM's current ``fused_experts`` takes ``activation`` as its ``MoEActivation`` enum (a
    value string); a ``quant_config`` whose activations' ``quant_dtype`` is not fp8 (int8, the
    nv / mx fp4 strings) is refused naming it."""
    import enum

    class MoEActivation(enum.Enum):
        SILU = "silu"
        RELU2_NO_MUL = "relu2_no_mul"

    p = _problem(torch.bfloat16)
    args = (p["hidden"], p["w1"], p["w2"], p["w"], p["ids"])
    want = vllm.fused_experts(*args, activation="silu")
    torch.testing.assert_close(vllm.fused_experts(*args, activation=MoEActivation.SILU), want, atol=0, rtol=0)
    with pytest.raises(NotImplementedError, match="activation 'relu2_no_mul'"):
        vllm.fused_experts(*args, activation=MoEActivation.RELU2_NO_MUL)
    for qd in ("nvfp4", "mxfp8", torch.int8):
        cfg = SimpleNamespace(quant_dtype=qd)
        with pytest.raises(
            NotImplementedError, match=f"fused_experts: quant_dtype {qd}.*not supported by opmux"
        ):
            vllm.fused_experts(*args, quant_config=cfg)
    unquantized = SimpleNamespace(quant_dtype=None)
    torch.testing.assert_close(vllm.fused_experts(*args, quant_config=unquantized), want, atol=0, rtol=0)


# -- the runner's stand-ins for vLLM v0.19's fused-MoE modules (tools/engine_compat_vllm_moe.py) ---
# written the way tests/kernels/moe/test_moe.py and test_block_fp8.py use them: the quant config
# builders, the modular kernel, the Mixtral layer, the Marlin / int refusals, torch.topk's layout
VLLM_MOE_STYLE = """
import pytest
import torch

import vllm.model_executor.layers.fused_moe.modular_kernel as mk
from vllm.config import VllmConfig, set_current_vllm_config
from vllm.forward_context import get_forward_context, set_forward_context
from vllm.model_executor.layers.fused_moe import MoEActivation, fused_experts, fused_topk
from vllm.model_executor.layers.fused_moe.all2all_utils import maybe_make_prepare_finalize
from vllm.model_executor.layers.fused_moe.config import (
    FUSED_MOE_UNQUANTIZED_CONFIG,
    FusedMoEQuantConfig,
    fp8_w8a8_moe_quant_config,
    int8_w8a16_moe_quant_config,
)
from vllm.model_executor.layers.fused_moe.fused_marlin_moe import fused_marlin_moe
from vllm.model_executor.layers.fused_moe.fused_moe import TritonExperts
from vllm.model_executor.models.mixtral import MixtralMoE
from vllm.platforms import current_platform
from vllm.scalar_type import scalar_types
from vllm.utils.deep_gemm import per_block_cast_to_fp8

E, M, N, K = 4, 5, 128, 256


def _kernel(quant_config):
    pf = maybe_make_prepare_finalize(moe=None, quant_config=quant_config, allow_new_interface=True)
    return mk.FusedMoEKernel(pf, TritonExperts(None, quant_config), inplace=False)


def _data():
    torch.manual_seed(0)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16) / 10
    w1 = torch.randn(E, 2 * N, K, device="cuda", dtype=torch.bfloat16) / 10
    w2 = torch.randn(E, K, N, device="cuda", dtype=torch.bfloat16) / 10
    w, ids, _ = fused_topk(a, torch.randn(M, E, device="cuda"), 2, False)
    return a, w1, w2, w, ids


def test_config_properties():
    assert FUSED_MOE_UNQUANTIZED_CONFIG.quant_dtype is None
    cfg = FusedMoEQuantConfig.make(torch.float8_e4m3fn, block_shape=[128, 128])
    assert cfg.use_fp8_w8a8 and cfg.block_shape == [128, 128] and not cfg.per_act_token_quant
    assert FusedMoEQuantConfig.make(torch.float8_e4m3fn, per_act_token_quant=True).per_act_token_quant
    assert scalar_types.float4_e2m1f.max() == 6.0 and scalar_types.uint4b8.size_bits == 4
    assert not current_platform.is_device_capability_family(100)


def test_modular_kernel_is_fused_experts():
    a, w1, w2, w, ids = _data()
    with set_current_vllm_config(VllmConfig()):
        want = fused_experts(a, w1, w2, w, ids)
        got = _kernel(FUSED_MOE_UNQUANTIZED_CONFIG).apply(
            a, w1, w2, w, ids, activation=MoEActivation.SILU, global_num_experts=E,
            expert_map=None, apply_router_weight_on_input=False,
        )
    torch.testing.assert_close(got, want, atol=0, rtol=0)


def test_fp8_block_config():
    a, w1, w2, w, ids = _data()
    q1, s1 = zip(*(per_block_cast_to_fp8(x, [128, 128]) for x in w1))
    q2, s2 = zip(*(per_block_cast_to_fp8(x, [128, 128]) for x in w2))
    cfg = fp8_w8a8_moe_quant_config(
        w1_scale=torch.stack(s1), w2_scale=torch.stack(s2), block_shape=[128, 128]
    )
    out = fused_experts(a, torch.stack(q1), torch.stack(q2), w, ids, quant_config=cfg)
    torch.testing.assert_close(out, fused_experts(a, w1, w2, w, ids), atol=0.05, rtol=0.05)


def test_int8_weights_and_marlin_are_refused():
    a, w1, w2, w, ids = _data()
    cfg = int8_w8a16_moe_quant_config(torch.ones(1), torch.ones(1), None, None, block_shape=[0, 128])
    with pytest.raises(NotImplementedError, match="use_int8_w8a16.*not supported by opmux"):
        fused_experts(a, w1, w2, w, ids, quant_config=cfg)
    with pytest.raises(NotImplementedError, match="fused_marlin_moe: not an opmux op"):
        fused_marlin_moe(a)


def test_mixtral_layer_and_topk_layout():
    torch.manual_seed(0)
    layer = MixtralMoE(num_experts=E, top_k=2, hidden_size=K, intermediate_size=N, params_dtype=torch.float32, tp_size=1, dp_size=1).cuda()
    layer.gate.weight.data[:] = torch.randn(E, K)
    layer.experts.w13_weight.data[:] = torch.randn(E, 2 * N, K) / 10
    layer.experts.w2_weight.data[:] = torch.randn(E, K, N) / 10
    x = torch.randn(M, K, device="cuda")
    with set_forward_context(None, VllmConfig()):
        get_forward_context().all_moe_layers = None
        out = layer(x)
    p = torch.softmax(x @ layer.gate.weight.T, -1)
    w, ids = torch.topk(p, 2)
    assert ids.is_contiguous()  # as torch.topk's own outputs: `ids.view(-1)` works
    w = w / w.sum(-1, keepdim=True)
    want = fused_experts(x, layer.experts.w13_weight, layer.experts.w2_weight, w, ids)
    torch.testing.assert_close(out, want, atol=1e-5, rtol=1e-5)
"""


def test_runner_shims_vllm_moe_modules(
    tmp_path: Path, run_engine_compat: Callable[[Path, Path], CompletedProcess[str]]
) -> None:
    (tmp_path / "test_vllm_moe_modules.py").write_text(VLLM_MOE_STYLE)
    proc = run_engine_compat(tmp_path, tmp_path)
    assert "test_vllm_moe_modules.py: 5 passed" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout
