"""Messages report the real bad value, on every backend: an int32-overflowing argument is named
(not a wrapped expert id), degenerate shapes are named (not called "non-contiguous")."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from opmux.kernels.ops.kvcache import reshape_and_cache  # noqa: E402
from opmux.kernels.ops.moe import moe_align_block_size  # noqa: E402

BACKENDS = [None, "torch", "jit", "triton", "reference"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    ("block_size", "num_experts", "name"), [(1, 2**31, "num_experts"), (2**31, 4, "block_size")]
)
def test_align_int32_overflow_names_the_argument(
    backend: str | None, block_size: int, num_experts: int, name: str
) -> None:
    ids = torch.tensor([[4]], dtype=torch.int32)
    with pytest.raises(ValueError, match=rf"{name} = {2**31} does not fit int32") as info:
        moe_align_block_size(ids, block_size, num_experts, backend=backend)
    assert "out of range" not in str(info.value)


@pytest.mark.parametrize("backend", BACKENDS)
def test_align_with_k_zero_is_not_called_non_contiguous(backend: str | None) -> None:
    ids = torch.zeros(4, 0, dtype=torch.int32)
    sorted_ids, _, post = moe_align_block_size(ids, 16, 8, backend=backend)
    assert int(post[0]) == 0  # no token: nothing padded
    assert sorted_ids.numel() == 8 * (16 - 1)  # vLLM's size: T*k + E*(block_size-1)


def _kv(h: int, d: int) -> tuple[torch.Tensor, ...]:
    t = 3
    k, v = torch.randn(t, h, d), torch.randn(t, h, d)
    kc, vc = torch.zeros(2, 4, h, d), torch.zeros(2, 4, h, d)
    return k, v, kc, vc, torch.arange(t)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("h", "d", "what"), [(0, 8, r"H \(heads\) is 0"), (2, 0, r"D \(head_dim\) is 0")])
def test_kv_cache_degenerate_heads_are_named(backend: str | None, h: int, d: int, what: str) -> None:
    with pytest.raises(ValueError, match=what) as info:
        reshape_and_cache(*_kv(h, d), backend=backend)
    assert "non-contiguous" not in str(info.value)


def test_native_checks_guard_direct_callers() -> None:
    """The C++ side (called directly, past the Python contract) names the same problems."""
    from opmux.kernels import jit

    try:
        moe = jit.load_module("moe_cpu")
        kv = jit.load_module("kvcache_cpu")
    except (jit.JitUnavailable, jit.CompileError, jit.ToolchainNotFound) as exc:
        pytest.skip(f"no JIT build here: {exc}")
    out = (
        torch.empty(1, dtype=torch.int32),
        torch.empty(1, dtype=torch.int32),
        torch.empty(1, dtype=torch.int32),
    )
    with pytest.raises(ValueError, match="must fit int32"):
        ids = torch.tensor(
            [[4]], dtype=torch.int32
        )  # (..., cumsum, has_cumsum, ids, map, has_map, bs, E, pad, fill)
        moe["moe_align_block_size_cpu"](*out, out[2], False, ids, ids, False, 1, 2**31, True, -1)
    with pytest.raises(ValueError, match="H and D must be at least 1"):
        args = _kv(0, 8)
        kv["reshape_and_cache_cpu"](*args, args[4], args[4], False)  # no fp8: scales unread
