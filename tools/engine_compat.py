"""Run the engines' own kernel test files, unchanged, against opmux's compat modules.

    python tools/engine_compat.py [--device cpu|cuda] [--preset NAME] FOLDER [-- PYTEST_ARGS...]

FOLDER holds upstream test files a developer fetched (sgl-kernel/tests/test_norm.py,
vllm tests/kernels/core/test_layernorm.py, ...; never committed here). Before pytest collects
them, import shims make ``sgl_kernel`` resolve to ``opmux.compat.sgl_kernel`` and
``vllm._custom_ops`` to ``opmux.compat.vllm`` (only where the real packages are absent or
``--shadow`` is given). With ``--device cpu`` the tests' hard-coded CUDA device is mapped to the
CPU (``.to(0)``, ``.cuda()``, ``device="cuda"``), the rest of each file running unchanged
(the "device choice aside" of the issue); ``--device cuda`` changes nothing.

The summary at the end counts outcomes per file and groups failures by their first line, so a
missing signature (TypeError / AttributeError) stands apart from a numerical difference.
Exit status: pytest's.
"""

from __future__ import annotations

import argparse
import collections
import importlib
import importlib.util
import sys
import types
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def install_shims(shadow: bool = False, flashinfer: bool = False) -> list[str]:
    """``sgl_kernel`` -> opmux.compat.sgl_kernel, ``vllm._custom_ops`` -> opmux.compat.vllm, and
    (with the latter) the few other names vLLM's kernel tests import (``_vllm_shims``); with
    ``flashinfer``, ``flashinfer.sampling`` -> opmux.compat.flashinfer (asked for: the engines'
    tests take an importable FlashInfer as the real one to compare against). Returns what it
    installed. opmux is the one the interpreter finds (an installed wheel: its artefact under
    test), else this checkout's ``python/``."""
    if importlib.util.find_spec("opmux") is None:
        sys.path.insert(0, str(ROOT / "python"))
    import opmux

    installed = [f"opmux {opmux.__version__} from {Path(opmux.__file__).parent}"]
    if shadow or importlib.util.find_spec("sgl_kernel") is None:
        sys.modules["sgl_kernel"] = importlib.import_module("opmux.compat.sgl_kernel")
        sys.modules["sgl_kernel.sampling"] = sys.modules["sgl_kernel"].sampling
        installed.append("sgl_kernel -> opmux.compat.sgl_kernel")
    if shadow or importlib.util.find_spec("sglang") is None:
        installed += _sglang_shims(sys.modules["sgl_kernel"] if "sgl_kernel" in sys.modules else None)
    if shadow or importlib.util.find_spec("vllm") is None:
        ops = importlib.import_module("opmux.compat.vllm")
        pkg = sys.modules.get("vllm")
        if pkg is None:
            pkg = types.ModuleType("vllm")
            pkg.__path__ = []  # a package: other vllm submodules are absent (ImportError names them)
            sys.modules["vllm"] = pkg
        pkg._custom_ops = ops  # type: ignore[attr-defined]
        sys.modules["vllm._custom_ops"] = ops
        installed.append("vllm._custom_ops -> opmux.compat.vllm")
        installed += _vllm_shims(ops)
    if flashinfer and (shadow or importlib.util.find_spec("flashinfer") is None):
        fi = types.ModuleType("flashinfer")
        fi.__path__ = []  # a package: its other submodules are absent (ImportError names them)
        sampling = importlib.import_module("opmux.compat.flashinfer")
        fi.sampling = sampling  # type: ignore[attr-defined]
        sys.modules["flashinfer"], sys.modules["flashinfer.sampling"] = fi, sampling
        installed.append("flashinfer.sampling -> opmux.compat.flashinfer")
    return installed


def _sglang_shims(sgl: Any) -> list[str]:
    """SGLang's Triton attention modules (``sglang.srt.layers.attention.triton_ops``) as
    opmux.compat.sgl_kernel's entries, for SGLang's test_triton_attention_kernels.py (its prefill
    kernel ``prefill_attention.context_attention_fwd`` too). Its extend test's reference
    ``redundant_attention`` is SGLang's composition around its prefill kernel (each request's new
    queries placed at their rows of the whole sequence, a causal prefill over it, the rows taken
    back): the same composition here around opmux's ``context_attention_fwd`` (``_redundant``), so
    that test checks opmux's extend entry against opmux's prefill entry. ``sglang.srt.utils`` / ``sglang.test.test_utils`` get the few names the file
    imports."""
    import unittest

    if sgl is None:
        sgl = importlib.import_module("opmux.compat.sgl_kernel")

    ops = "sglang.srt.layers.attention.triton_ops"
    _module(
        f"{ops}.decode_attention",
        decode_attention_fwd=sgl.decode_attention_fwd,
        decode_attention_fwd_normal=sgl.decode_attention_fwd_normal,
        decode_attention_fwd_grouped=sgl.decode_attention_fwd_grouped,
    )
    _module(
        f"{ops}.extend_attention",
        extend_attention_fwd=sgl.extend_attention_fwd,
        extend_attention_fwd_unified=sgl.extend_attention_fwd_unified,
        build_unified_kv_indices=sgl.build_unified_kv_indices,
        redundant_attention=_redundant(sgl),
    )
    _module(f"{ops}.prefill_attention", context_attention_fwd=sgl.context_attention_fwd)
    utils = sys.modules.get("sglang.srt.utils")
    if utils is None or not hasattr(utils, "infer_device"):
        _module(
            "sglang.srt.utils",
            is_hip=lambda: False,
            is_cuda=lambda: True,
            infer_device=lambda: _DEVICE[0],
            get_device=lambda: _DEVICE[0],
        )
    _module("sglang.test.test_utils", CustomTestCase=unittest.TestCase)
    # SGLang's CI registration (test/registered/*): a no-op here
    _module(
        "sglang.test.ci.ci_register", **{f"register_{d}_ci": _no_op for d in ("cuda", "amd", "cpu", "npu")}
    )
    return [f"{ops}.{{decode,extend,prefill}}_attention -> opmux.compat.sgl_kernel"]


def _no_op(*args: Any, **kwargs: Any) -> None:
    return None


def _redundant(sgl: Any) -> Any:
    """SGLang's ``redundant_attention(q_extend, o_extend, k_buffer, v_buffer, b_req_idx,
    b_start_loc, b_seq_len, b_seq_len_prefix, max_len_in_batch)`` (its extend test's reference): the
    new queries of request ``i`` at rows ``b_start_loc[i] + prefix .. b_start_loc[i] + seq_len`` of a
    buffer shaped like the pools, ``context_attention_fwd`` (causal) over every whole sequence, the
    same rows read back into ``o_extend``."""
    import torch

    def redundant_attention(
        q_extend: Any, o_extend: Any, k_buffer: Any, v_buffer: Any, b_req_idx: Any, b_start_loc: Any,
        b_seq_len: Any, b_seq_len_prefix: Any, max_len_in_batch: int,
    ) -> None:  # fmt: skip
        q_buffer = q_extend.new_empty((k_buffer.shape[0], *q_extend.shape[1:]))
        spans, pt = [], 0
        for i in range(b_req_idx.shape[0]):
            lo, hi = int(b_start_loc[i] + b_seq_len_prefix[i]), int(b_start_loc[i] + b_seq_len[i])
            q_buffer[lo:hi] = q_extend[pt : pt + hi - lo]
            spans.append((lo, hi, pt))
            pt += hi - lo
        o_buffer = torch.empty_like(q_buffer)
        sgl.context_attention_fwd(
            q_buffer, k_buffer, v_buffer, o_buffer, b_start_loc, b_seq_len, max_len_in_batch
        )
        for lo, hi, at in spans:
            o_extend[at : at + hi - lo] = o_buffer[lo:hi]

    return redundant_attention


# -- what vLLM's kernel tests import besides _custom_ops ----------------------------------------
# Small stand-ins, written here from vLLM's own definitions (the vLLM commit they follow is in
# docs/compat.md): the platform object, seeding, round_up, the Python wrappers the tests call
# (moe_align_block_size, fused_topk, fused_topk_bias: buffer allocation around the _custom_ops
# call), the KV cache factories of vLLM's conftest, opcheck (a call-through) and the torch library
# ops ``torch.ops._C_cache_ops.*`` for the names opmux.compat.vllm has. A name opmux does not
# provide stays absent, so its test fails naming it.
_DEVICE = ["cuda"]


def _module(name: str, **attrs: Any) -> types.ModuleType:
    mod = sys.modules.get(name)
    if mod is None:
        mod = types.ModuleType(name)
        mod.__path__ = []  # type: ignore[attr-defined]
        sys.modules[name] = mod
        parent, _, leaf = name.rpartition(".")
        if parent:
            setattr(_module(parent), leaf, mod)
    for k, v in attrs.items():
        setattr(mod, k, v)
    return mod


def _round_up(x: int, y: int) -> int:
    return (x + y - 1) // y * y


def _set_random_seed(seed: int | None) -> None:
    import random

    import torch

    if seed is not None:
        random.seed(seed)
        torch.manual_seed(seed)
        try:
            import numpy as np

            np.random.seed(seed)
        except ImportError:
            pass


class _Platform:
    """vLLM's ``current_platform`` for the runner's device: the tests run as on a CUDA machine
    (``--device cpu`` moves their CUDA tensors to the CPU)."""

    device_type = "cuda"

    def is_cuda(self) -> bool:
        return True

    def is_cuda_alike(self) -> bool:
        return True

    def is_rocm(self) -> bool:
        return False

    def is_cpu(self) -> bool:
        return False

    def is_fp8_fnuz(self) -> bool:
        return False

    def fp8_dtype(self) -> Any:
        import torch

        return torch.float8_e4m3fn

    def seed_everything(self, seed: int | None = None) -> None:
        _set_random_seed(seed)

    def has_device_capability(self, capability: Any, device_id: int = 0) -> bool:
        return True

    def get_device_capability(self, device_id: int = 0) -> Any:
        return (9, 0)

    def is_device_capability(self, capability: Any, device_id: int = 0) -> bool:
        major, minor = self.get_device_capability(device_id)
        return bool(
            major * 10 + minor == capability
            if isinstance(capability, int)
            else (major, minor) == tuple(capability)
        )

    def is_device_capability_family(self, capability: int, device_id: int = 0) -> bool:
        # vLLM: the capability's integer form divided by 10 (sm_90: 9; Blackwell sm_10x: 10)
        major, minor = self.get_device_capability(device_id)
        return (major * 10 + minor) // 10 == capability // 10


def _vllm_shims(ops: Any) -> list[str]:
    import torch

    def moe_align_block_size(
        topk_ids: Any,
        block_size: int,
        num_experts: int,
        expert_map: Any = None,
        pad_sorted_ids: bool = False,
        ignore_invalid_experts: bool = False,
    ) -> tuple[Any, Any, Any]:
        # vllm/model_executor/layers/fused_moe/moe_align_block_size.py: buffers, then the op
        max_num_tokens_padded = topk_ids.numel() + num_experts * (block_size - 1)
        if pad_sorted_ids:
            max_num_tokens_padded = _round_up(max_num_tokens_padded, block_size)
        if topk_ids.numel() < num_experts:
            max_num_tokens_padded = min(topk_ids.numel() * block_size, max_num_tokens_padded)
        dev = topk_ids.device
        sorted_ids = torch.empty((max_num_tokens_padded,), dtype=torch.int32, device=dev)
        expert_ids = torch.empty(
            ((max_num_tokens_padded + block_size - 1) // block_size,), dtype=torch.int32, device=dev
        )
        num_tokens_post_pad = torch.empty((1,), dtype=torch.int32, device=dev)
        ops.moe_align_block_size(
            topk_ids,
            num_experts,
            block_size,
            sorted_ids,
            expert_ids,
            num_tokens_post_pad,
            expert_map if ignore_invalid_experts else None,
        )
        if expert_map is not None and not ignore_invalid_experts:
            expert_ids = expert_map[expert_ids]
        return sorted_ids, expert_ids, num_tokens_post_pad

    def batched_moe_align_block_size(
        max_tokens_per_batch: int, block_size: int, expert_num_tokens: Any
    ) -> Any:
        e = expert_num_tokens.size(0)
        n = _round_up(max_tokens_per_batch, block_size) * e
        dev = expert_num_tokens.device
        sorted_ids = torch.empty((n,), dtype=torch.int32, device=dev)
        block_ids = torch.empty((n // block_size,), dtype=torch.int32, device=dev)
        post = torch.empty((1,), dtype=torch.int32, device=dev)
        ops.batched_moe_align_block_size(
            max_tokens_per_batch, block_size, expert_num_tokens, sorted_ids, block_ids, post
        )
        return sorted_ids, block_ids, post

    def _route(
        gating_output: Any, topk: int, renormalize: bool, scoring_func: str, bias: Any, indices_type: Any
    ) -> Any:
        m, dev = gating_output.shape[0], gating_output.device
        w = torch.empty(m, topk, dtype=torch.float32, device=dev)
        ids = torch.empty(m, topk, dtype=torch.int32 if indices_type is None else indices_type, device=dev)
        tei = torch.empty(m, topk, dtype=torch.int32, device=dev)
        if scoring_func == "softmax":
            ops.topk_softmax(w, ids, tei, gating_output, renormalize, bias)
        elif scoring_func == "sigmoid":
            ops.topk_sigmoid(w, ids, tei, gating_output, renormalize, bias)
        else:
            raise ValueError(f"Unsupported scoring function: {scoring_func}")
        return w, ids, tei

    def fused_topk(
        hidden_states: Any,
        gating_output: Any,
        topk: int,
        renormalize: bool,
        indices_type: Any = None,
        scoring_func: str = "softmax",
    ) -> Any:
        return _route(gating_output, topk, renormalize, scoring_func, None, indices_type)

    def fused_topk_bias(
        hidden_states: Any,
        gating_output: Any,
        e_score_correction_bias: Any,
        topk: int,
        renormalize: bool,
        scoring_func: str = "softmax",
        indices_type: Any = None,
    ) -> Any:
        w, ids, _ = _route(
            gating_output, topk, renormalize, scoring_func, e_score_correction_bias, indices_type
        )
        return w, ids

    def get_kv_cache_torch_dtype(cache_dtype: Any, model_dtype: Any = None) -> Any:
        if isinstance(cache_dtype, str):
            if cache_dtype == "auto":
                return (
                    model_dtype if isinstance(model_dtype, torch.dtype) else getattr(torch, str(model_dtype))
                )
            if cache_dtype == "fp8":
                return torch.uint8
            return {"half": torch.half, "bfloat16": torch.bfloat16, "float": torch.float}[cache_dtype]
        return cache_dtype

    def _random_fp8(t: Any, low: float, high: float) -> None:
        tmp = torch.empty_like(t, dtype=torch.float16)
        tmp.uniform_(low, high)
        ops.convert_fp8(t, tmp)

    def create_kv_caches_with_random(
        num_blocks: int,
        block_size: int,
        num_layers: int,
        num_heads: int,
        head_size: int,
        cache_dtype: Any,
        model_dtype: Any = None,
        seed: int | None = None,
        device: str = "cuda",
    ) -> Any:
        if cache_dtype == "fp8" and head_size % 16:
            raise ValueError(f"Does not support key cache of type fp8 with head_size {head_size}")
        _set_random_seed(seed)
        dtype = get_kv_cache_torch_dtype(cache_dtype, model_dtype)
        scale = head_size**-0.5
        x = 16 // torch.tensor([], dtype=dtype).element_size()
        shapes = (
            (num_blocks, num_heads, head_size // x, block_size, x),
            (num_blocks, num_heads, head_size, block_size),
        )
        caches: tuple[list[Any], list[Any]] = ([], [])
        for shape, out in zip(shapes, caches, strict=True):
            for _ in range(num_layers):
                c = torch.empty(size=shape, dtype=dtype, device=device)
                if cache_dtype == "fp8":
                    _random_fp8(c, -scale, scale)
                else:
                    c.uniform_(-scale, scale)
                out.append(c)
        return caches

    def create_kv_caches_with_random_flash(
        num_blocks: int,
        block_size: int,
        num_layers: int,
        num_heads: int,
        head_size: int,
        cache_dtype: Any,
        model_dtype: Any = None,
        seed: int | None = None,
        device: str = "cuda",
        cache_layout: str | None = "NHD",
    ) -> Any:
        _set_random_seed(seed)
        dtype = get_kv_cache_torch_dtype(cache_dtype, model_dtype)
        shape = (num_blocks, 2, block_size, num_heads, head_size)
        order = (0, 1, 2, 3, 4) if cache_layout in (None, "NHD") else (0, 1, 3, 2, 4)
        scale = head_size**-0.5
        keys, values = [], []
        for _ in range(num_layers):
            kv = torch.empty(size=tuple(shape[i] for i in order), dtype=dtype, device=device).permute(*order)
            if cache_dtype == "fp8":
                _random_fp8(kv, -scale, scale)
            else:
                kv.uniform_(-scale, scale)
            keys.append(kv[:, 0])
            values.append(kv[:, 1])
        return keys, values

    def opcheck(
        op: Any,
        args: Any,
        kwargs: Any = None,
        *,
        test_utils: Any = None,
        raise_exception: bool = True,
        cond: bool = True,
    ) -> Any:
        """vLLM's opcheck runs torch.library.opcheck on its own _C ops; here the op (opmux's
        compat function behind ``torch.ops._C_cache_ops.<name>``) is simply called, on deep
        copies of the arguments: torch.library.opcheck copies them for each of its checks, so
        the caller's tensors are left as they are (a test may compare them afterwards, e.g. the
        residual of ``fused_add_rms_norm_static_fp8_quant``, which a second call would add to
        again)."""
        if cond:
            import copy

            a, k = copy.deepcopy((tuple(args), dict(kwargs or {})))
            op(*a, **k)
        return None

    _module("vllm.platforms", current_platform=_Platform())
    _module("vllm.utils", round_up=_round_up, cdiv=lambda a, b: -(-a // b))
    _module("vllm.utils.math_utils", round_up=_round_up, cdiv=lambda a, b: -(-a // b))
    # vLLM's names of cache dtypes (vllm/utils/torch_utils.py): fp8 caches are bytes
    str_dtypes = {
        "float32": torch.float32,
        "half": torch.half,
        "bfloat16": torch.bfloat16,
        "float": torch.float,
    }
    str_dtypes |= {n: torch.uint8 for n in ("fp8", "fp8_e4m3", "fp8_e5m2", "fp8_ds_mla")}
    str_dtypes |= {"int8": torch.int8, "fp8_inc": torch.float8_e4m3fn}
    _module(
        "vllm.utils.torch_utils",
        STR_DTYPE_TO_TORCH_DTYPE=str_dtypes,
        set_random_seed=_set_random_seed,
        get_kv_cache_torch_dtype=get_kv_cache_torch_dtype,
        create_kv_caches_with_random=create_kv_caches_with_random,
        create_kv_caches_with_random_flash=create_kv_caches_with_random_flash,
    )
    try:
        import triton
        import triton.language as tl

        _module("vllm.triton_utils", triton=triton, tl=tl)
    except ImportError:
        pass
    _module(
        "vllm.model_executor.layers.fused_moe.moe_align_block_size",
        moe_align_block_size=moe_align_block_size,
        batched_moe_align_block_size=batched_moe_align_block_size,
    )
    _module("vllm.model_executor.layers.fused_moe.router.fused_topk_router", fused_topk=fused_topk)
    # unified_attention (opmux.compat.vllm's: attention.paged_prefill), at its older and its v1 path
    # and the legacy-layout prefix prefill / chunked prefill (opmux.compat.vllm's, the same op)
    for path in ("vllm.attention.ops", "vllm.v1.attention.ops"):
        _module(f"{path}.triton_unified_attention", unified_attention=ops.unified_attention)
        _module(f"{path}.prefix_prefill", context_attention_fwd=ops.context_attention_fwd)
        _module(f"{path}.triton_decode_attention", decode_attention_fwd=ops.decode_attention_fwd)
        _module(
            f"{path}.chunked_prefill_paged_decode",
            chunked_prefill_paged_decode=ops.chunked_prefill_paged_decode,
        )
    _vllm_sampler_shims()
    # fused_moe.py's entry points (opmux.compat.vllm's), also as the package's names; the
    # submodule first: making it sets the package's ``fused_moe`` attribute, the function wins
    moe_names = dict(fused_experts=ops.fused_experts, fused_moe=ops.fused_moe, fused_topk=ops.fused_topk)
    _module("vllm.model_executor.layers.fused_moe.fused_moe", **moe_names)
    _module("vllm.model_executor.layers.fused_moe", **moe_names)
    _module(
        "vllm.model_executor.layers.fused_moe.router.fused_topk_bias_router", fused_topk_bias=fused_topk_bias
    )
    _module(
        "tests.kernels.utils", opcheck=opcheck, DEFAULT_OPCHECK_TEST_UTILS=("test_schema", "test_faketensor")
    )
    _register_cache_ops(ops)
    _FIXTURES.update(
        kv_cache_factory=create_kv_caches_with_random,
        kv_cache_factory_flashinfer=create_kv_caches_with_random_flash,
    )
    # tests/kernels/{quant_utils,allclose_default}.py fetched beside the test folder: imported as
    # they are (tests.kernels.utils stays the shim)
    kernels = sys.modules["tests.kernels"]
    kernels.__path__ = [str(d) for d in _UPSTREAM_DIRS]  # type: ignore[attr-defined]
    installed = [
        "vllm.platforms, vllm.utils, vllm.triton_utils, vllm.model_executor.layers.fused_moe "
        "(fused_experts, fused_moe, fused_topk, moe_align_block_size, router), vllm.v1.sample.ops "
        "(topk_topp_sampler, topk_topp_triton), tests.kernels.utils, torch.ops._C_cache_ops: shims",
        *_load_sibling("engine_compat_vllm").install(ops, _module),
        *_load_sibling("engine_compat_vllm_moe").install(ops, _module),
    ]
    return installed + _upstream_test_utils(opcheck)


def _vllm_sampler_shims() -> None:
    """``vllm.v1.sample.ops.topk_topp_sampler`` (TopKTopPSampler, apply_top_k_top_p, random_sample)
    and ``topk_topp_triton.apply_top_k_top_p_triton``: opmux.compat.vllm_sampler's. The module's
    sort-based ``apply_top_k_top_p_pytorch`` / ``apply_top_k_only`` are vLLM's torch form, the
    reference its tests compare the Triton entry with: taken from vLLM's own
    ``topk_topp_sampler.py`` when it was fetched beside the tests (``_upstream_functions``; never
    committed), else absent (the tests importing them fail naming them)."""
    sampler = importlib.import_module("opmux.compat.vllm_sampler")
    reference = _upstream_functions("topk_topp_sampler.py", ("apply_top_k_top_p_pytorch", "apply_top_k_only"))
    ops = "vllm.v1.sample.ops"
    _module(f"{ops}.topk_topp_triton", apply_top_k_top_p_triton=sampler.apply_top_k_top_p_triton)
    _module(
        f"{ops}.topk_topp_sampler",
        TopKTopPSampler=sampler.TopKTopPSampler,
        apply_top_k_top_p=sampler.apply_top_k_top_p,
        apply_top_k_top_p_triton=sampler.apply_top_k_top_p_triton,
        random_sample=sampler.random_sample,
        **reference,
    )
    triton_utils = sys.modules.get("vllm.triton_utils")
    if triton_utils is not None:
        triton_utils.HAS_TRITON = hasattr(triton_utils, "triton")  # type: ignore[attr-defined]


def _upstream_functions(filename: str, names: tuple[str, ...]) -> dict[str, Any]:
    """The top-level functions ``names`` of an upstream source file fetched beside the tests (the
    first ``filename`` in the test folder or its parent), defined alone: the file's other imports
    (the engine's package) are not run; the functions see ``torch``."""
    import ast

    import torch

    found = [d / filename for d in _UPSTREAM_DIRS if (d / filename).is_file()]
    if not found:
        return {}
    tree = ast.parse(found[0].read_text(encoding="utf-8"), str(found[0]))
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
    namespace: dict[str, Any] = {"torch": torch}
    exec(compile(ast.Module(body=defs, type_ignores=[]), str(found[0]), "exec"), namespace)
    return {n: namespace[n] for n in names if n in namespace}


def _upstream_test_utils(opcheck: Any) -> list[str]:
    """vLLM's own ``tests/kernels/utils.py`` when it was fetched beside the test folder (the MoE
    tests take their references from it: ``torch_moe``, ``torch_experts``): imported as it is in
    place of the shim, with ``opcheck`` kept the runner's call-through (torch.library.opcheck's
    schema / fake-tensor checks are about vLLM's own C++ op registrations)."""
    found = [d / "utils.py" for d in _UPSTREAM_DIRS if (d / "utils.py").is_file()]
    if not found:
        return []
    sys.modules.pop("tests.kernels.utils", None)
    upstream = importlib.import_module("tests.kernels.utils")
    upstream.opcheck = opcheck  # type: ignore[attr-defined]
    return [f"tests.kernels.utils: upstream's {found[0]} (opcheck: the runner's call-through)"]


_UPSTREAM_DIRS: list[Path] = []


def _load_sibling(name: str) -> Any:
    """tools/<name>.py (the runner runs as a script, tools/ is not necessarily importable)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


_FIXTURES: dict[str, Any] = {}
_LIB: list[Any] = []


def _register_cache_ops(ops: Any) -> None:
    """``torch.ops._C_cache_ops.<name>`` for the vLLM cache ops opmux.compat.vllm has."""
    import torch

    if _LIB:
        return
    lib = torch.library.Library("_C_cache_ops", "FRAGMENT")  # type: ignore[no-untyped-call]
    _LIB.append(lib)
    schema = (
        "(Tensor key, Tensor value, Tensor(a!) key_cache, Tensor(a!) value_cache, Tensor slot_mapping, "
        "str kv_cache_dtype, Tensor k_scale, Tensor v_scale) -> ()"
    )
    schemas = {
        "reshape_and_cache": schema,
        "reshape_and_cache_flash": schema,
        # vLLM's csrc/torch_bindings.cpp
        "copy_blocks": "(Tensor(a!)[] key_caches, Tensor(b!)[] value_caches, Tensor block_mapping) -> ()",
        "copy_blocks_mla": "(Tensor(a!)[] kv_caches, Tensor block_mapping) -> ()",
        "swap_blocks": "(Tensor src, Tensor(a!) dst, Tensor block_mapping) -> ()",
        "concat_and_cache_mla": "(Tensor kv_c, Tensor k_pe, Tensor(a!) kv_cache, Tensor slot_mapping, "
        "str kv_cache_dtype, Tensor scale) -> ()",
        "gather_cache": "(Tensor src_cache, Tensor(a!) dst, Tensor block_table, Tensor cu_seq_lens, "
        "int batch_size, Tensor? seq_starts=None) -> ()",
    }
    for name, sig in schemas.items():
        if hasattr(ops, name):
            lib.define(name + sig)  # type: ignore[no-untyped-call]
            lib.impl(name, getattr(ops, name), "CompositeExplicitAutograd")  # type: ignore[no-untyped-call]


class _Fixtures:
    """vLLM's conftest fixtures the kernel tests take (the KV cache factories)."""

    @staticmethod
    def _get(name: str) -> Any:
        if name not in _FIXTURES:
            import pytest

            pytest.skip(f"engine-compat: no {name} (vllm shims not installed)")
        return _FIXTURES[name]


def _fixture_plugin() -> Any:
    import pytest

    class Plugin:
        @pytest.fixture
        def kv_cache_factory(self) -> Any:
            return _Fixtures._get("kv_cache_factory")

        @pytest.fixture
        def kv_cache_factory_flashinfer(self) -> Any:
            return _Fixtures._get("kv_cache_factory_flashinfer")

        @pytest.fixture
        def default_vllm_config(self) -> Any:
            """vLLM's conftest sets a default VllmConfig for CustomOp dispatch; the shim layers
            dispatch to the CUDA path (opmux) without one."""
            return None

        @pytest.fixture
        def workspace_init(self) -> Any:
            """vLLM's conftest sets up its v1 workspace manager (scratch buffers of its Triton MoE
            path); opmux's op allocates its own."""
            return None

        @pytest.fixture
        def dist_init(self) -> Any:
            """vLLM's conftest starts a one-process distributed group; nothing here needs one."""
            return None

    return Plugin()


def _cpu_device_mode() -> Any:
    """A torch function mode that sends every CUDA device argument to the CPU."""
    import torch
    from torch.overrides import TorchFunctionMode

    def cpu(d: Any) -> Any:
        if isinstance(d, bool):
            return d
        if isinstance(d, int) or (isinstance(d, str) and d.startswith("cuda")):
            return "cpu"
        if isinstance(d, torch.device) and d.type == "cuda":
            return torch.device("cpu")
        return d

    moves = {torch.Tensor.to, torch.Tensor.cuda}
    topks = {torch.topk, torch.Tensor.topk}

    def cuda_topk(x: Any, k: int, dim: int = -1, largest: bool = True, sorted: bool = True) -> Any:
        """torch.topk with CUDA's order of equal values, the lower index first (a stable sort).
        On the CPU torch.topk leaves their order to its selection algorithm (nth_element /
        partial_sort), so a test's torch.topk reference breaks ties as no GPU does."""
        # contiguous, as torch.topk's outputs (a narrowed sort is a strided view: `.view(-1)`
        # on it, as vLLM's torch_experts does, would fail)
        idx = torch.sort(x, dim=dim, descending=largest, stable=True).indices.narrow(dim, 0, k).contiguous()
        return torch.return_types.topk((x.gather(dim, idx), idx))

    class CpuDevice(TorchFunctionMode):
        def __torch_function__(
            self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
        ) -> Any:
            kwargs = dict(kwargs or {})
            if "device" in kwargs:
                kwargs["device"] = cpu(kwargs["device"])
            if func is torch.Tensor.cuda:
                return args[0]
            if func in topks and "out" not in kwargs and isinstance(args[0], torch.Tensor):
                return cuda_topk(*args, **kwargs)
            if func in moves and len(args) > 1:
                args = (args[0], cpu(args[1]), *args[2:])
            return func(*args, **kwargs)

    # torch.Generator("cuda:0") / Generator(device="cuda"): a CPU generator (a subclass, so
    # `generator=` arguments and clone_state() take it as any CPU generator)
    base = torch.Generator

    class CpuGenerator(base):  # type: ignore[misc, valid-type]
        def __new__(cls, device: Any = "cpu") -> Any:
            return base.__new__(cls, cpu(device))

        def __init__(self, device: Any = "cpu") -> None:
            pass

    torch.Generator = CpuGenerator  # type: ignore[misc]
    for name in ("synchronize", "empty_cache"):  # no device to wait for
        setattr(torch.cuda, name, lambda *a, **k: None)
    torch.accelerator.synchronize = lambda *a, **k: None  # type: ignore[assignment]
    torch.accelerator.empty_cache = lambda *a, **k: None  # type: ignore[assignment]
    torch.accelerator.current_device_index = lambda: 0  # type: ignore[assignment]
    # one device, as on a one-GPU machine (vLLM's tests parametrize over cuda:0 and cuda:1 when
    # the count is not 1: the same CPU twice)
    torch.cuda.device_count = lambda: 1  # type: ignore[assignment]
    torch.accelerator.device_count = lambda: 1  # type: ignore[assignment]
    set_default = torch.set_default_device
    torch.set_default_device = lambda device: set_default(cpu(device))  # type: ignore[assignment]
    return CpuDevice()


class _Plugin:
    def __init__(self, device: str, shadow: bool, flashinfer: bool = False) -> None:
        self.device, self.shadow, self.flashinfer = device, shadow, flashinfer
        self.mode: Any = None
        self.outcomes: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        self.reasons: collections.Counter[str] = collections.Counter()

    def pytest_configure(self, config: Any) -> None:
        for line in install_shims(self.shadow, self.flashinfer):
            print(f"engine-compat: {line}")
        if self.device == "cpu":
            self.mode = _cpu_device_mode()
            self.mode.__enter__()  # for collection too: parametrize lists may build tensors
            print("engine-compat: CUDA device arguments run on the CPU")

    def pytest_unconfigure(self, config: Any) -> None:
        if self.mode is not None:
            self.mode.__exit__(None, None, None)

    def pytest_runtest_logreport(self, report: Any) -> None:
        if report.when != "call" and not (report.failed or report.skipped):
            return
        name = report.nodeid.split("::")[0]
        outcome = "error" if report.failed and report.when != "call" else report.outcome
        self.outcomes[name][outcome] += 1
        if report.failed:
            text = str(getattr(report.longrepr, "reprcrash", None) and report.longrepr.reprcrash.message)
            self.reasons[f"{outcome}: {text.splitlines()[0][:160] if text else '?'}"] += 1
        elif report.skipped and isinstance(report.longrepr, tuple):
            self.reasons[f"skipped: {str(report.longrepr[2])[:160]}"] += 1

    def pytest_collectreport(self, report: Any) -> None:
        if report.failed:
            name = report.nodeid or "?"
            self.outcomes[name]["collection error"] += 1
            text = str(report.longrepr).strip().splitlines()
            self.reasons[f"collection error: {text[-1][:160] if text else '?'}"] += 1

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        tr = terminalreporter
        tr.section("engine-compat summary")
        for name, counts in sorted(self.outcomes.items()):
            tr.write_line(f"{name}: " + ", ".join(f"{v} {k}" for k, v in sorted(counts.items())))
        tr.write_line("")
        for reason, n in self.reasons.most_common(25):
            tr.write_line(f"{n:6d}  {reason}")


#: named pytest -k selections (``--preset NAME``), for runs with a bounded time; a ``-k`` after
#: ``--`` replaces the preset's. The vLLM MoE ones are for vLLM v0.19.1's tests/kernels/moe
#: (docs/compat.md): the issue's three tests, ``test_fused_moe``, ``test_mixtral_moe``,
#: ``test_w8a8_block_fp8_fused_moe``
PRESETS = {
    # vLLM tests/kernels/attention/test_triton_unified_attention.py at 3a04cf8 (imports only
    # unified_attention and current_platform): every bf16 case (2 x 2 x 2 x 4 x 2 x 2 = 128); the
    # fp8-query cases (q_dtype1) are refused by opmux (fp8 queries / q_descale)
    "vllm-unified-attention": "test_triton_unified_attn and not q_dtype1",
    # SGLang test/registered/attention/test_triton_attention_kernels.py at 0c0c7e76 (docs/compat.md):
    # test_decode_attention (against the file's own torch reference), test_build_unified_kv_indices,
    # test_grouped_decode_attention (one function over every config, MLA 576 / 512 among them) and
    # test_context_attention (against SDPA, causal and not). Left out: test_extend_attention and
    # test_extend_attention_sliding_window (19 requests of up to 12k tokens: a GPU run),
    # test_extend_attention_unified_vs_regular (its unified indices point at other pool rows than
    # k_extend: passes or not by the data)
    "sgl-triton-attention": (
        "test_decode_attention or test_build_unified_kv_indices or test_grouped_decode_attention "
        "or test_context_attention"
    ),
    # vLLM tests/kernels/attention/test_triton_decode_attention.py (16ef2eba): a quarter of its
    # grid on two CPU cores (about 40 s); its D_QK 128 / 192 with D_V 512 cases are the op's
    # ValueError (a value head dim above the key's)
    "vllm-triton-decode-cpu": "1025-3]",
    # sgl-kernel tests/test_sampling.py at 059cddc1 on two CPU cores (78 cases, about 70 s): every
    # case at vocab 111, and at 32000 the alignment (from_logits == from_probs) and renorm cases;
    # the 1000-draw cases at 32000 / 128256 take minutes each here (a GPU run)
    "sgl-sampling-cpu": (
        "111 or (32000 and not test_top_k_top_p_joint_sampling_from_probs and not test_min_p_sampling)"
    ),
    # FlashInfer tests/utils/test_sampling.py at fb28d72 (0.6.18), with --flashinfer, on two CPU
    # cores (about 5 min): every case at vocab 111 but chain_speculative_sampling (not an opmux op);
    # the 1000-draw cases at 32,000 / 128,256 take minutes each here (a GPU run)
    "flashinfer-sampling-cpu": "111 and not chain_speculative_sampling",
    # vLLM v0.20.0 tests/v1/sample/test_topk_topp_sampler.py: all of it (89 cases; the one
    # FlashInfer comparison is skipped by the file itself)
    "vllm-topk-topp-sampler": "not test_flashinfer_sampler",
    # all three (120 + 2 + 180 cases)
    "vllm-moe": "test_mixtral_moe or (test_fused_moe and not wn16 and not int64) or test_w8a8_block_fp8_fused_moe",
    # a cross-section for one bounded GPU call (125 cases): every Mixtral case; test_fused_moe at
    # M 1 / 33 (E 8, 64), 32768 (E 64) and 40000 (E 192: the CUDA-graph cases), both paddings,
    # with and without expert_map, top-2 and top-6; block fp8 at 8 of its 20 (M, N, K) (decode,
    # DeepSeek-V3's K 7168 and N 4608, M up to 8192), every E and top-k, and (83, 4608, 7168) at
    # E 2 (the shape where opmux's roundings differ from the reference's on the CPU)
    "vllm-moe-h200": (
        "test_mixtral_moe or (test_fused_moe and not wn16 and not int64 and (-8-1- or -8-33- or -64-33- "
        "or -64-32768- or -192-40000-)) or (test_w8a8_block_fp8_fused_moe and (-1-128-128] or -1-128-7168] "
        "or -1-4608-7168] or -2-83-4608-7168] or -83-512-512] or -83-4608-512] or -128-1024-7168] "
        "or -2048-128-128] or -8192-128-128]))"
    ),
    # what two CPU cores run in about 8 minutes (164 cases; the torch references of the larger
    # shapes take minutes each there)
    "vllm-moe-cpu": (
        "test_mixtral_moe or (test_fused_moe and not wn16 and not int64 and not 32768 and not 40000) "
        "or (test_w8a8_block_fp8_fused_moe and not 2048- and not 8192- and not 83-4608-7168] "
        "and not 128-4608-7168])"
    ),
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("folder", type=Path, help="a folder of upstream test files (or one file)")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda when available")
    p.add_argument("--shadow", action="store_true", help="shim even where sgl_kernel / vllm are installed")
    p.add_argument(
        "--flashinfer",
        action="store_true",
        help="also resolve flashinfer.sampling to opmux.compat.flashinfer",
    )
    p.add_argument("--preset", choices=sorted(PRESETS), help="a named -k selection (PRESETS)")
    args = p.parse_args(argv)
    if args.preset:
        extra = ["-k", PRESETS[args.preset], *extra]
    if not args.folder.exists():
        p.error(f"{args.folder} does not exist")
    top = args.folder.resolve() if args.folder.is_dir() else args.folder.resolve().parent
    _UPSTREAM_DIRS[:] = [top, top.parent]
    device = args.device
    if device is None:
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    import os

    # the device decides: Triton's interpreter on the CPU, compiled kernels on a GPU (whatever the
    # caller's environment says; triton reads it when its kernels are defined, i.e. later)
    os.environ["TRITON_INTERPRET"] = "1" if device == "cpu" else "0"
    import tempfile

    import pytest

    plugin = _Plugin(device, args.shadow, args.flashinfer)
    # rootdir at the folder and an empty ini of our own: the upstream files run under pytest's
    # defaults, not under this repo's conftests or its pyproject settings (warnings as errors,
    # strict markers), also when the folder lies inside the checkout (an ignored `.upstream/`)
    with tempfile.TemporaryDirectory(prefix="opmux-compat-") as tmp:
        ini = Path(tmp) / "pytest.ini"
        ini.write_text("[pytest]\n")
        return int(
            pytest.main(
                [
                    str(args.folder),
                    "-c",
                    str(ini),
                    "-p",
                    "no:cacheprovider",
                    "--continue-on-collection-errors",
                    "--rootdir",
                    str(args.folder if args.folder.is_dir() else args.folder.parent),
                    # -c moves pytest's confcutdir to the ini's folder: keep it at the files'
                    "--confcutdir",
                    str(top),
                    *extra,
                ],
                plugins=[plugin, _fixture_plugin()],
            )
        )


if __name__ == "__main__":
    sys.exit(main())
