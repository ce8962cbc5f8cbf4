"""Out-of-range indices of the KV cache block ops on every backend: CPU tensors raise ValueError
before anything is written; CUDA kernels (no host sync to check) skip the bad pairs, sequences or
tokens and do the rest, never touching memory out of bounds (run under compute-sanitizer on a GPU)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from opmux.kernels import registry
from opmux.kernels.errors import BackendUnavailable
from opmux.kernels.explain import op_instance

_TORCH_DEVICE = {"cpu": "cpu", "cuda": "cuda", "hip": "cuda", "xpu": "xpu", "npu": "npu"}
BACKENDS = ("aot", "jit", "triton", "torch")


def _run(op_name: str, backend: str, device_type: str, *args: Any, **kwargs: Any) -> None:
    spec = registry.get(op_name)
    if (
        backend not in {b.name for b in spec.backends}
        or device_type not in spec.backend(backend).requires.devices
    ):
        pytest.skip(f"{op_name} has no {backend} backend on {device_type}")
    op = op_instance(op_name)
    sel = op.select_for(args, kwargs, backend)
    if sel.chosen != backend:
        pytest.skip(f"{backend} cannot run here: {sel.decision(backend).detail}")
    try:
        op.impl(backend)(*args, **kwargs)
    except BackendUnavailable as exc:
        pytest.skip(str(exc))
    if device_type != "cpu":
        torch.cuda.synchronize()


def _raises_or_skips(
    device_type: str, op_name: str, backend: str, args: tuple[Any, ...], pattern: str
) -> bool:
    """True where the call ran (CUDA: bad entries skipped), False where it raised as it must (CPU)."""
    if device_type == "cpu":
        with pytest.raises(ValueError, match=pattern):
            _run(op_name, backend, device_type, *args)
        return False
    _run(op_name, backend, device_type, *args)
    return True


@pytest.mark.parametrize("backend", BACKENDS)
def test_copy_blocks(backend: str, device_type: str) -> None:
    dev = _TORCH_DEVICE[device_type]
    cache = torch.randn(6, 4, 16, device=dev)
    before = cache.clone()
    pairs = torch.tensor([[0, 1], [7, 2], [3, -1], [4, 5]], device=dev)
    if _raises_or_skips(
        device_type, "kvcache.copy_blocks", backend, (cache, pairs), r"block_mapping\[1, 0\] = 7"
    ):
        want = before.clone()
        want[1], want[5] = before[0], before[4]
        assert torch.equal(cache, want)
    else:
        assert torch.equal(cache, before)


@pytest.mark.parametrize("backend", BACKENDS)
def test_concat_and_cache_mla(backend: str, device_type: str) -> None:
    dev = _TORCH_DEVICE[device_type]
    kv_c, k_pe = torch.randn(3, 32, device=dev), torch.randn(3, 8, device=dev)
    cache = torch.zeros(2, 4, 40, device=dev)
    slots = torch.tensor([5, 8, -4], device=dev)
    args = (kv_c, k_pe, cache, slots)
    if _raises_or_skips(device_type, "kvcache.concat_and_cache_mla", backend, args, r"slot_mapping\[1\] = 8"):
        want = torch.zeros_like(cache)
        want[1, 1] = torch.cat([kv_c[0], k_pe[0]])
        assert torch.equal(cache, want)
    else:
        assert not cache.any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_gather_cache(backend: str, device_type: str) -> None:
    dev = _TORCH_DEVICE[device_type]
    src = torch.randn(4, 2, 8, device=dev)
    dst = torch.zeros(9, 8, device=dev)
    i32 = {"dtype": torch.int32, "device": dev}
    # sequence 0: fine; 1: block id 9 for its second token; 2: past dst's rows; 3: empty
    table = torch.tensor([[1, 2], [3, 9], [0, 0], [2, 3]], **i32)
    cu = torch.tensor([0, 3, 6, 12, 12], **i32)
    args = (src, dst, table, cu)
    if _raises_or_skips(
        device_type, "kvcache.gather_cache", backend, args, "cu_seq_lens\\[3\\] = 12 exceeds dst's 9 rows"
    ):
        want = torch.zeros_like(dst)
        want[0:2], want[2] = src[1], src[2, 0]
        want[3:5] = src[3]
        assert torch.equal(dst, want)
    else:
        assert not dst.any()
