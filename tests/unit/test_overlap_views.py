"""The overlap part of the contract: views of one buffer that touch no common element are
accepted whatever the strides of their size-1 dimensions, and real overlaps are refused."""

from __future__ import annotations

import pytest
import torch

from opmux.kernels.ops import layernorm


@pytest.mark.parametrize("tokens", [1, 3])
def test_q_and_k_views_of_one_qkv_buffer(tokens: int) -> None:
    qkv = torch.randn(tokens, 48 * 16)
    q = qkv[:, : 32 * 16].view(tokens, 32, 16)  # token stride 768, head stride 16
    k = qkv[:, 32 * 16 : 40 * 16].view(tokens, 8, 16)
    expect_q, expect_k = q.clone(), k.clone()
    layernorm.qk_norm(expect_q, expect_k, torch.ones(16), torch.ones(16), 1e-6, backend="torch")
    layernorm.qk_norm(q, k, torch.ones(16), torch.ones(16), 1e-6, backend="torch")
    torch.testing.assert_close(q, expect_q)
    torch.testing.assert_close(k, expect_k)


def test_overlapping_head_views_are_refused() -> None:
    qkv = torch.randn(1, 48 * 16)
    q = qkv[:, : 32 * 16].view(1, 32, 16)
    k = qkv[:, 31 * 16 : 39 * 16].view(1, 8, 16)  # shares q's last head
    with pytest.raises(ValueError, match="q and k overlap in memory"):
        layernorm.qk_norm(q, k, torch.ones(16), torch.ones(16), 1e-6)


def test_views_with_no_byte_in_common_are_accepted_whatever_their_strides() -> None:
    """torch's overlap test gives up on non-dense views of one buffer ("too hard"); two whose byte
    ranges do not meet share nothing, whatever their strides (the native lanes' rule too)."""
    buf = torch.randn(4 * 32 + 4 * 48)
    x = buf[: 4 * 32].view(4, 32)[:, :16]  # row stride 32
    out = buf[4 * 32 :].view(4, 48)[:, :16]  # row stride 48: strides differ, bytes apart
    want = layernorm.rmsnorm(x.clone(), torch.ones(16), 1e-6, backend="torch")
    for backend in ("torch", None):
        out.zero_()
        layernorm.rmsnorm(x, torch.ones(16), 1e-6, out=out, backend=backend)
        torch.testing.assert_close(out, want)
