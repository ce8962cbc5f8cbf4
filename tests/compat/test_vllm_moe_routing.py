"""opmux.compat.vllm's sigmoid routing and batched alignment (vLLM's ``topk_sigmoid``,
``batched_moe_align_block_size``) on every CPU backend, against references written here the way
vLLM's kernel tests write theirs; and the runner's shims for them (``fused_topk`` with
``scoring_func="sigmoid"``, ``batched_moe_align_block_size``, CUDA's tie order of torch.topk)."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from subprocess import CompletedProcess

import pytest
import torch

import opmux.compat.vllm as vllm

SIGNATURES = {
    "topk_sigmoid": [
        "topk_weights", "topk_ids", "token_expert_indices", "gating_output", "renormalize",
        "e_score_correction_bias",
    ],
    "batched_moe_align_block_size": [
        "max_tokens_per_batch", "block_size", "expert_num_tokens", "sorted_ids", "expert_ids",
        "num_tokens_post_pad",
    ],
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(SIGNATURES))
def test_signature_is_vllms(name: str) -> None:
    assert list(inspect.signature(getattr(vllm, name)).parameters) == SIGNATURES[name]


def _gating(t: int, e: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    return torch.randn(t, e, generator=torch.Generator().manual_seed(seed)).to(dtype)


@pytest.mark.parametrize("ids_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_sigmoid_into_the_callers_buffers(
    backend: str, ids_dtype: torch.dtype, dtype: torch.dtype
) -> None:
    t, e, k = 9, 16, 4
    g = _gating(t, e, dtype, seed=3)
    w, ids = torch.full((t, k), -1.0), torch.full((t, k), -1, dtype=ids_dtype)
    tei = torch.full((t, k), -1, dtype=torch.int32)
    ptrs = (w.data_ptr(), ids.data_ptr(), tei.data_ptr())
    vllm.topk_sigmoid(w, ids, tei, g, False)
    s = torch.sigmoid(g.float())
    ref_w, ref_ids = torch.topk(s, k, -1)  # vLLM's test: torch.topk over the sigmoid scores
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(w, ref_w, atol=1e-6, rtol=1e-6)
    assert tei.tolist() == [[j * t + i for j in range(k)] for i in range(t)]
    assert (w.data_ptr(), ids.data_ptr(), tei.data_ptr()) == ptrs
    vllm.topk_sigmoid(w, ids, tei, g, True)
    torch.testing.assert_close(w, ref_w / ref_w.sum(-1, keepdim=True), atol=1e-6, rtol=1e-6)


def test_topk_sigmoid_e_score_correction_bias(backend: str) -> None:
    """DeepSeek-V3's routing: chosen by sigmoid + bias, weighted by the sigmoid (without bias)."""
    t, e, k = 6, 32, 8
    g = _gating(t, e, torch.float32, seed=5)
    bias = torch.linspace(0.5, -0.5, e)
    w, ids = torch.empty(t, k), torch.empty(t, k, dtype=torch.int32)
    vllm.topk_sigmoid(w, ids, torch.empty(t, k, dtype=torch.int32), g, True, bias)
    s = torch.sigmoid(g)
    ref_ids = torch.topk(s + bias, k, -1).indices
    assert not torch.equal(ref_ids, torch.topk(s, k, -1).indices), "the bias changes the choice here"
    ref_w = s.gather(-1, ref_ids)
    assert torch.equal(ids.long(), ref_ids)
    torch.testing.assert_close(w, ref_w / ref_w.sum(-1, keepdim=True))
    with pytest.raises(ValueError, match="correction_bias"):
        vllm.topk_sigmoid(w, ids, torch.empty(t, k, dtype=torch.int32), g, True, bias[:-1])


def test_topk_sigmoid_ties_go_to_the_lower_expert(backend: str) -> None:
    g = torch.tensor([[0.0, 1, 0, 1, 0, 1], [2.0, 2, 2, 2, 2, 2]], dtype=torch.bfloat16)
    w, ids = torch.empty(2, 4), torch.empty(2, 4, dtype=torch.int32)
    vllm.topk_sigmoid(w, ids, torch.empty(2, 4, dtype=torch.int32), g, False)
    assert ids.tolist() == [[1, 3, 5, 0], [0, 1, 2, 3]]


def _vllm_batched_reference(counts: torch.Tensor, m: int, bs: int) -> tuple[list[int], list[int], int]:
    """vLLM's test_batched_moe_align_block_size ref_outputs, in lists."""
    e = counts.numel()
    n = -(-m // bs) * bs * e
    sorted_ids, expert_ids = [e * m] * n, [-1] * (n // bs)
    i = 0
    for x, c in enumerate(counts.tolist()):
        for j in range(c):
            sorted_ids[i] = x * m + j
            i += 1
        i = -(-i // bs) * bs
    pos = 0
    for x, c in enumerate(counts.tolist()):
        padded = -(-c // bs) * bs
        for b in range(padded // bs):
            expert_ids[pos // bs + b] = x
        pos += padded
    return sorted_ids, expert_ids, i


@pytest.mark.parametrize(("m", "e", "bs"), [(13, 8, 8), (16, 16, 16), (512, 32, 64), (5, 3, 1)])
def test_batched_moe_align_block_size(backend: str, m: int, e: int, bs: int) -> None:
    counts = torch.randint(0, m + 1, (e,), generator=torch.Generator().manual_seed(m + e), dtype=torch.int32)
    counts[::3] = 0  # empty batches
    n = -(-m // bs) * bs * e
    sorted_ids = torch.full((n,), 7, dtype=torch.int32)
    expert_ids = torch.full((n // bs,), 7, dtype=torch.int32)
    post = torch.full((1,), 7, dtype=torch.int32)
    vllm.batched_moe_align_block_size(m, bs, counts, sorted_ids, expert_ids, post)
    ref_sorted, ref_experts, ref_post = _vllm_batched_reference(counts, m, bs)
    assert sorted_ids.tolist() == ref_sorted
    assert expert_ids.tolist() == ref_experts  # unused blocks: -1 here (vLLM's batched kernel)
    assert post.tolist() == [ref_post]


def test_batched_moe_align_block_size_rejects_bad_counts(backend: str) -> None:
    counts = torch.tensor([2, 9, 0], dtype=torch.int32)
    bufs = (
        torch.empty(24, dtype=torch.int32),
        torch.empty(3, dtype=torch.int32),
        torch.empty(1, dtype=torch.int32),
    )
    with pytest.raises(ValueError, match=r"expert_num_tokens\[1\] = 9 is out of range \[0, 8\]"):
        vllm.batched_moe_align_block_size(8, 8, counts, *bufs)
    with pytest.raises(ValueError, match="sorted_ids has shape \\(24,\\), expected a vector of at least 48"):
        vllm.batched_moe_align_block_size(16, 8, counts, *bufs)


# The runner's shims for these ops, in a file written like vLLM's test_fused_topk.py and
# test_moe_align_block_size.py, run by tools/engine_compat.py on the CPU.
VLLM_STYLE = """
import pytest
import torch

from vllm.model_executor.layers.fused_moe.moe_align_block_size import batched_moe_align_block_size
from vllm.model_executor.layers.fused_moe.router.fused_topk_bias_router import fused_topk_bias
from vllm.model_executor.layers.fused_moe.router.fused_topk_router import fused_topk


def test_fused_topk_sigmoid():
    g = torch.randn(5, 16, device="cuda")
    w, ids, tei = fused_topk(g, g, 4, False, scoring_func="sigmoid")
    ref_w, ref_ids = torch.topk(torch.sigmoid(g), 4, dim=-1)
    assert torch.equal(ids.long(), ref_ids) and tei[1, 2] == 2 * 5 + 1
    torch.testing.assert_close(w, ref_w)
    bias = torch.randn(16, device="cuda")
    wb, idsb = fused_topk_bias(g, g, bias, 4, False, scoring_func="sigmoid")
    assert torch.equal(idsb.long(), torch.topk(torch.sigmoid(g) + bias, 4, dim=-1).indices)


def test_batched_align():
    counts = torch.tensor([3, 0, 16, 5], dtype=torch.int32, device="cuda")
    s, e, n = batched_moe_align_block_size(16, 8, counts)
    assert s.numel() == 64 and e.tolist() == [0, 2, 2, 3, -1, -1, -1, -1] and n.tolist() == [32]
    assert s[:4].tolist() == [0, 1, 2, 64] and s[8:24].tolist() == list(range(32, 48))


def test_topk_orders_ties_as_cuda():
    x = torch.tensor([[0.0, 1, 0, 1, 0, 0], [5.0, 5, 5, 5, 5, 5]], device="cuda")
    assert torch.topk(x, 4).indices.tolist() == [[1, 3, 0, 2], [0, 1, 2, 3]]
    assert x.topk(2, dim=1, largest=False).indices.tolist() == [[0, 2], [0, 1]]
    assert torch.topk(x, 1, 0).values.tolist() == [[5.0, 5, 5, 5, 5, 5]]
"""


def test_runner_shims_sigmoid_routing_and_batched_align(
    tmp_path: Path, run_engine_compat: Callable[[Path, Path], CompletedProcess[str]]
) -> None:
    (tmp_path / "test_vllm_routing.py").write_text(VLLM_STYLE)
    proc = run_engine_compat(tmp_path, tmp_path)
    assert "test_vllm_routing.py: 3 passed" in proc.stdout, proc.stdout + proc.stderr
    assert proc.returncode == 0, proc.stdout
