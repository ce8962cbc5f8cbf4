"""tools/engine_compat.py runs an upstream-style test file unchanged: the import shims and the
CUDA-to-CPU device mapping."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

UPSTREAM_STYLE = """
import pytest
import sgl_kernel
import torch
from vllm import _custom_ops as ops


@pytest.mark.parametrize("hidden", [64, 128])
def test_rmsnorm_on_cuda(hidden):
    x = torch.randn(3, hidden).to(0).to(torch.float16)
    w = torch.randn(hidden, device="cuda").half()
    y = sgl_kernel.rmsnorm(x, w)
    out = torch.empty_like(x)
    ops.rms_norm(out, x, w, 1e-6)
    ref = (x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).half()
    torch.testing.assert_close(y, ref, rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(out, ref, rtol=1e-3, atol=1e-3)
    torch.cuda.synchronize()


def test_a_failure_is_reported():
    assert sgl_kernel.silu_and_mul(torch.ones(2, 16).cuda()).shape == (2, 9)
"""


def test_runner_runs_upstream_style_files_on_cpu(
    tmp_path: Path, run_engine_compat: Callable[[Path, Path], CompletedProcess[str]]
) -> None:
    (tmp_path / "test_upstream_style.py").write_text(UPSTREAM_STYLE)
    proc = run_engine_compat(tmp_path, tmp_path)
    out = proc.stdout
    assert "sgl_kernel -> opmux.compat.sgl_kernel" in out, out
    assert "test_upstream_style.py: 1 failed, 2 passed" in out, out
    assert proc.returncode == 1, out


# vLLM kernel tests import more than _custom_ops: the runner's shims (platform, seeding, the
# Python wrappers, opcheck, torch.ops._C_cache_ops, the KV cache fixtures), written like
# tests/kernels/moe/test_moe_align_block_size.py, test_fused_topk.py and attention/test_cache.py.
VLLM_STYLE = """
import pytest
import torch

from tests.kernels.utils import DEFAULT_OPCHECK_TEST_UTILS, opcheck
from vllm import _custom_ops as ops
from vllm.model_executor.layers.fused_moe.moe_align_block_size import moe_align_block_size
from vllm.model_executor.layers.fused_moe.router.fused_topk_bias_router import fused_topk_bias
from vllm.model_executor.layers.fused_moe.router.fused_topk_router import fused_topk
from vllm.platforms import current_platform
from vllm.utils.math_utils import round_up
from vllm.utils.torch_utils import set_random_seed

set_random_seed(0)


@pytest.mark.skipif(current_platform.is_rocm(), reason="rocm")
def test_align_with_expert_map():
    topk_ids = torch.randint(0, 8, (16, 2), device="cuda", dtype=torch.int32)
    expert_map = torch.full((8,), -1, device="cuda", dtype=torch.int32)
    expert_map[::2] = torch.arange(4, dtype=torch.int32)
    s, e, n = moe_align_block_size(topk_ids, 4, 8, expert_map=expert_map, ignore_invalid_experts=True)
    kept = int((topk_ids % 2 == 0).sum())
    assert int((s < topk_ids.numel()).sum()) == kept and int(n) % 4 == 0
    assert s.numel() == round_up(32 + 8 * 3, 1) and e.numel() == (s.numel() + 3) // 4


def test_fused_topk_and_bias():
    g = torch.randn(5, 16, device="cuda")
    w, ids, tei = fused_topk(g, g, 4, True)
    assert ids.dtype == torch.int32 and tei[1, 2] == 2 * 5 + 1
    bias = torch.randn(16, device="cuda")
    wb, idsb = fused_topk_bias(g, g, bias, 4, False)
    p = torch.softmax(g, -1)
    assert torch.equal(idsb.long(), torch.topk(p + bias, 4, -1).indices)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_reshape_and_cache_flash(kv_cache_factory_flashinfer, layout, kv_cache_dtype):
    current_platform.seed_everything(0)
    torch.set_default_device("cuda:0")
    key, value = torch.randn(2, 3, 4, 16).unbind(0)[:2]
    kc, vc = kv_cache_factory_flashinfer(4, 8, 1, 4, 16, kv_cache_dtype, torch.float32, cache_layout=layout)
    slots = torch.tensor([5, 30, 17], dtype=torch.long)
    one = torch.tensor(1.0)
    opcheck(torch.ops._C_cache_ops.reshape_and_cache_flash,
            (key, value, kc[0], vc[0], slots, kv_cache_dtype, one, one), test_utils=DEFAULT_OPCHECK_TEST_UTILS)
    # opcheck runs the op on copies (as torch.library.opcheck does); vLLM's test then calls it
    ops.reshape_and_cache_flash(key, value, kc[0], vc[0], slots, kv_cache_dtype, one, one)
    got = torch.empty_like(kc[0], dtype=torch.float16)
    ops.convert_fp8(got, kc[0], 1.0) if kv_cache_dtype == "fp8" else got.copy_(kc[0])
    torch.testing.assert_close(got[30 // 8, 30 % 8].float(), key[1], atol=0.001, rtol=0.1)
"""


def test_runner_shims_vllm_imports(
    tmp_path: Path, run_engine_compat: Callable[[Path, Path], CompletedProcess[str]]
) -> None:
    (tmp_path / "test_vllm_style.py").write_text(VLLM_STYLE)
    proc = run_engine_compat(tmp_path, tmp_path)
    out = proc.stdout
    assert "test_vllm_style.py: 6 passed" in out, out + proc.stderr
    assert proc.returncode == 0, out


# vLLM's core / quantization tests (tests/kernels/core/test_layernorm.py, test_activation.py,
# test_pos_encoding.py, quantization/test_fp8_quant.py style): the layers' forward is opmux (its
# tracing sees the ops), forward_native is the reference; torch.ops._C names opmux lacks import
# and fail naming themselves; tests.kernels.<helper> is the upstream file beside the folder.
VLLM_CORE_STYLE = """
import pytest
import torch

from opmux.kernels import tracing
from tests.kernels.helper_beside import TOL
from tests.kernels.utils import opcheck
from vllm import ir
from vllm.model_executor.layers.activation import GeluAndMul, MulAndSilu, SiluAndMul
from vllm.model_executor.layers.layernorm import GemmaRMSNorm, RMSNorm
from vllm.model_executor.layers.quantization.utils.quant_utils import GroupShape, scaled_quantize
from vllm.model_executor.layers.rotary_embedding import get_rope
from vllm import _custom_ops as ops

CUDA_DEVICES = [f"cuda:{i}" for i in range(1 if torch.accelerator.device_count() == 1 else 2)]


def _ran(op):
    return any(name.endswith(op) for name, _ in tracing.counters())


@pytest.mark.parametrize("device", CUDA_DEVICES)
@pytest.mark.parametrize("residual", [False, True])
@torch.inference_mode()
def test_rms_norm(device, residual):
    torch.set_default_device(device)
    tracing.enable()
    layer = RMSNorm(64).to(dtype=torch.bfloat16)
    x = torch.randn(5, 128, dtype=torch.bfloat16)[:, :64]
    r = torch.randn_like(x) if residual else None
    ref = layer.forward_native(x, r)
    out = layer(x, r)
    torch.testing.assert_close(out, ref, **TOL)
    assert _ran("fused_add_rmsnorm" if residual else "rmsnorm")
    torch.accelerator.synchronize()
    assert ir.ops.rms_norm.get_tolerance(torch.float32)["atol"] == 1e-5


@torch.inference_mode()
def test_activations():
    tracing.enable()
    x = torch.randn(3, 32, device="cuda", dtype=torch.float16)
    # CPU tensors here: the compat entries take vLLM's CPU form (its forward_native), bit for bit
    # in every dtype (on CUDA: the ops' vllm_rounding kernel mode)
    for layer in (SiluAndMul(compile_native=False), GeluAndMul(approximate="tanh")):
        assert torch.equal(layer(x), layer.forward_native(x))
        assert torch.equal(layer(x.float()), layer.forward_native(x.float()))
    opcheck(torch.ops._C.silu_and_mul, (torch.empty(3, 16, device="cuda", dtype=torch.float16), x))
    assert torch.equal(MulAndSilu()(x), MulAndSilu().forward_native(x))
    out = torch.empty(3, 16, device="cuda", dtype=torch.float16)
    torch.ops._C.fatrelu_and_mul(out, x, 0.25)  # opmux's kernel (one rounding of an exact product)
    assert _ran("fatrelu_and_mul")


@torch.inference_mode()
def test_rope_and_static_group_quant():
    tracing.enable()
    rope = get_rope(64, 128, True, {"rope_type": "default", "rope_theta": 10000, "partial_rotary_factor": 0.5})
    assert get_rope(64, 128, True, {"rope_type": "default", "rope_theta": 10000, "partial_rotary_factor": 0.5}) is rope
    pos = torch.randint(0, 128, (2, 3), device="cuda")
    q = torch.randn(2, 3, 4 * 64, device="cuda")
    ref_q, ref_k = rope.forward_native(pos, q, None)
    out_q, out_k = rope.forward(pos, q, None)
    torch.testing.assert_close(out_q, ref_q, atol=1e-5, rtol=1e-5)
    assert out_k is None and _ran("rotary_embedding")
    x = torch.rand(8, 64, device="cuda")
    ref, scale = scaled_quantize(x, GroupShape(4, 32), torch.float8_e4m3fn, compute_dtype=torch.float32)
    q8, s = ops.scaled_fp8_quant(x, scale=scale, group_shape=(4, 32))
    torch.testing.assert_close(q8.float(), ref.float(), rtol=0.12, atol=1e-5)
    assert _ran("static_quant_fp8")


@torch.inference_mode()
def test_gemma_fp16_residual_and_fused_quant():
    tracing.enable()
    layer = GemmaRMSNorm(64).to(dtype=torch.float16)
    x = torch.randn(5, 64, device="cuda", dtype=torch.float16)
    r = torch.randn_like(x)
    ref_out, ref_res = layer.forward_native(x, r.clone())
    out, res = layer(x, r.clone())
    assert res.dtype == torch.float32 and torch.equal(res, ref_res)  # vLLM's fp16 residual: the fp32 sum
    torch.testing.assert_close(out, ref_out, **TOL)
    assert _ran("gemma_rmsnorm")
    q, r2, w, s = torch.empty(5, 64, device="cuda", dtype=torch.float8_e4m3fn), r.clone(), x[0].abs(), torch.tensor(0.1)
    opcheck(torch.ops._C.fused_add_rms_norm_static_fp8_quant, (q, x, r2, w, s, 1e-6))
    assert torch.equal(r2, r)  # as torch.library.opcheck: the arguments are left as they are
    torch.ops._C.fused_add_rms_norm_static_fp8_quant(q, x, r2, w, s, 1e-6)
    assert torch.equal(r2, x + r) and _ran("fused_add_rmsnorm_static_quant_fp8")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("residual", [False, True])
@torch.inference_mode()
def test_gemma_float32_weight_with_half_activations(dtype, residual):
    layer = GemmaRMSNorm(64).to(device="cuda")  # Gemma's float32 weight
    layer.weight.data.normal_(std=0.1)
    x = torch.randn(5, 64, device="cuda", dtype=dtype)
    r = torch.randn_like(x) if residual else None
    ref = layer.forward_native(x, None if r is None else r.clone())
    out = layer(x, None if r is None else r.clone())
    if residual:
        assert out[1].dtype == ref[1].dtype and torch.equal(out[1], ref[1])
        out, ref = out[0], ref[0]
    assert out.dtype == dtype
    torch.testing.assert_close(out, ref, atol=1e-2, rtol=1e-2)
"""


def test_runner_shims_vllm_core_and_quant_imports(
    tmp_path: Path, run_engine_compat: Callable[[Path, Path], CompletedProcess[str]]
) -> None:
    (tmp_path / "core").mkdir()
    (tmp_path / "core" / "test_core_style.py").write_text(VLLM_CORE_STYLE)
    (tmp_path / "helper_beside.py").write_text("TOL = dict(atol=1e-2, rtol=1e-2)\n")
    proc = run_engine_compat(tmp_path / "core", tmp_path)
    out = proc.stdout
    # one CUDA device as on a one-GPU machine: two rms_norm cases, not four
    assert "test_core_style.py: 9 passed" in out, out + proc.stderr
    assert proc.returncode == 0, out


def test_runner_ignores_the_pytest_settings_of_folders_above(
    tmp_path: Path, run_engine_compat: Callable[[Path, Path], CompletedProcess[str]]
) -> None:
    # upstream files carried inside a checkout (e.g. an ignored .upstream/) sit below its
    # pyproject.toml; its settings (warnings as errors, strict markers) are not upstream's
    (tmp_path / "pyproject.toml").write_text(
        '[tool.pytest.ini_options]\naddopts = ["--strict-markers"]\nfilterwarnings = ["error"]\n'
    )
    (tmp_path / "conftest.py").write_text("raise RuntimeError('a conftest above the upstream folder ran')\n")
    folder = tmp_path / "upstream"
    folder.mkdir()
    (folder / "test_loose.py").write_text(
        "import warnings\nimport pytest\n\n\n@pytest.mark.cpu_model\n"
        "def test_warns_with_an_unregistered_marker():\n"
        "    warnings.warn(DeprecationWarning('upstream code warns'))\n"
    )
    proc = run_engine_compat(folder, tmp_path)
    assert "test_loose.py: 1 passed" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout


# SGLang's / vLLM's sampler and Triton-attention test files (sgl-kernel/tests/test_sampling.py,
# vLLM tests/v1/sample/test_topk_topp_sampler.py, SGLang's test_triton_attention_kernels.py):
# torch.Generator("cuda:0") on the CPU, sgl_kernel.sampling, vLLM's sampler modules (its
# sort-based apply_top_k_top_p_pytorch the reference, defined alone from the engine's source file
# fetched beside the tests; the Triton entry opmux's), SGLang's CI registration and unified
# extend entries.
UPSTREAM_SAMPLER = """
import vllm.not_a_module_the_runner_imports  # only the named functions are defined


def apply_top_k_top_p_pytorch(logits, k, p):
    kth = logits.sort(dim=-1, descending=True).values.gather(1, (k.long() - 1)[:, None])
    return logits.masked_fill(logits < kth, float("-inf"))
"""
SAMPLER_STYLE = """
import torch
from torch import Generator

import sgl_kernel
from sglang.srt.layers.attention.triton_ops.extend_attention import build_unified_kv_indices
from sglang.test.ci.ci_register import register_cuda_ci
from vllm.platforms import current_platform
from vllm.triton_utils import HAS_TRITON
from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p_pytorch

register_cuda_ci(est_time=1, suite="x")


def test_generator_and_logits_sampling():
    logits = torch.randn(5, 111, device="cuda:0") * 5
    g = torch.Generator("cuda:0")
    g2 = g.clone_state()
    a = sgl_kernel.sampling.top_k_top_p_sampling_from_logits(logits, 10, 0.5, generator=g)
    b = sgl_kernel.sampling.top_k_top_p_sampling_from_probs(torch.softmax(logits, -1), 10, 0.5, generator=g2)
    assert torch.equal(a, b)


def test_vllm_triton_entry_against_the_sort_reference():
    from vllm.v1.sample.ops.topk_topp_triton import apply_top_k_top_p_triton

    assert HAS_TRITON
    torch.set_default_device(current_platform.device_type)
    gen = Generator(device=current_platform.device_type).manual_seed(42)
    logits = torch.randn(8, 1024, generator=gen)
    k = torch.randint(1, 100, (8,), generator=gen)
    ref = apply_top_k_top_p_pytorch(logits.clone(), k, None)
    got = apply_top_k_top_p_triton(logits.clone(), k.to(torch.int32), None)
    assert torch.equal(ref == float("-inf"), got == float("-inf"))


def test_unified_indices():
    indptr, indices, lens = build_unified_kv_indices(
        torch.tensor([0, 2], dtype=torch.int32), torch.tensor([7, 8]), torch.tensor([0], dtype=torch.int32),
        torch.tensor([1], dtype=torch.int32), torch.tensor([9]), 1,
    )
    assert indices.tolist() == [7, 8, 9]


def test_extend_with_a_causal_custom_mask_against_redundant_attention():
    # SGLang's _test_extend_attention_once, small: prefixes in the pools, the new tokens apart,
    # plain and with a causal custom mask, against its reference composition
    from sglang.srt.layers.attention.triton_ops.extend_attention import (
        extend_attention_fwd, redundant_attention,
    )

    torch.manual_seed(0)
    B, H_Q, H_KV, D = 3, 4, 2, 16
    pre = torch.tensor([5, 1, 9], dtype=torch.int32)
    ext = torch.tensor([3, 6, 2], dtype=torch.int32)
    seq = pre + ext
    start = torch.zeros(B, dtype=torch.int32)
    start[1:] = torch.cumsum(seq[:-1], 0)
    kv_indptr = torch.zeros(B + 1, dtype=torch.int32)
    kv_indptr[1:] = torch.cumsum(pre, 0)
    kv_indices = torch.cat([torch.arange(int(start[i]), int(start[i] + pre[i])) for i in range(B)]).int()
    k_buffer = torch.randn(int(seq.sum()), H_KV, D)
    v_buffer = torch.randn(int(seq.sum()), H_KV, D)
    rows = [torch.arange(int(start[i] + pre[i]), int(start[i] + seq[i])) for i in range(B)]
    k_extend, v_extend = k_buffer[torch.cat(rows)], v_buffer[torch.cat(rows)]
    q_extend = torch.randn(int(ext.sum()), H_Q, D)
    qo_indptr = torch.zeros(B + 1, dtype=torch.int32)
    qo_indptr[1:] = torch.cumsum(ext, 0)
    o, o_mask, o_ref = (torch.empty_like(q_extend) for _ in range(3))
    extend_attention_fwd(q_extend, k_extend, v_extend, o, k_buffer, v_buffer, qo_indptr, kv_indptr,
                         kv_indices, None, True, None, int(ext.max()), 1.0, 1.0)
    sizes = ext * seq
    mask_indptr = torch.zeros(B + 1, dtype=torch.int64)
    mask_indptr[1:] = torch.cumsum(sizes, 0)
    custom_mask = torch.cat([
        torch.cat([torch.ones(int(ext[i]), int(pre[i]), dtype=torch.bool),
                   torch.ones(int(ext[i]), int(ext[i])).tril() == 1], 1).flatten()
        for i in range(B)
    ])
    extend_attention_fwd(q_extend, k_extend, v_extend, o_mask, k_buffer, v_buffer, qo_indptr, kv_indptr,
                         kv_indices, custom_mask, True, mask_indptr, int(ext.max()), 1.0, 1.0)
    redundant_attention(q_extend, o_ref, k_buffer, v_buffer, torch.arange(B), start, seq, pre, int(seq.max()))
    assert torch.allclose(o, o_ref, rtol=1e-4, atol=1e-5)
    assert torch.allclose(o_mask, o_ref, rtol=1e-4, atol=1e-5)


def test_vllm_legacy_prefix_prefill_imports():
    from vllm.utils.torch_utils import STR_DTYPE_TO_TORCH_DTYPE
    from vllm.v1.attention.ops.chunked_prefill_paged_decode import chunked_prefill_paged_decode
    from vllm.v1.attention.ops.prefix_prefill import context_attention_fwd

    assert STR_DTYPE_TO_TORCH_DTYPE["fp8"] == torch.uint8
    assert callable(chunked_prefill_paged_decode) and callable(context_attention_fwd)
"""


def test_runner_shims_sampler_and_attention_imports(
    tmp_path: Path, run_engine_compat: Callable[[Path, Path], CompletedProcess[str]]
) -> None:
    (tmp_path / "test_sampler_style.py").write_text(SAMPLER_STYLE)
    (tmp_path / "topk_topp_sampler.py").write_text(UPSTREAM_SAMPLER)
    proc = run_engine_compat(tmp_path, tmp_path)
    out = proc.stdout
    assert "test_sampler_style.py: 5 passed" in out, out + proc.stderr
    assert proc.returncode == 0, out
