"""The CPU host path's shortcuts keep the contract: prototype allocation (``_checks.PROTOS``),
the public function's CPU block, and the fall-through of everything else."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from opmux.kernels.ops import _checks, layernorm, moe
from opmux.kernels.ops.moe import _contracts as moe_contracts
from opmux.kernels.ops.moe import op as mop


def test_protos_allocate_like_empty() -> None:
    dev = torch.device("cpu")
    p = _checks.protos(dev)
    assert _checks.PROTOS[dev] is p
    for dtype, proto in p.items():
        assert proto.dtype == dtype and proto.device == dev and proto.numel() == 0
        t = proto.new_empty(3, 5)
        ref = torch.empty(3, 5, dtype=dtype, device=dev)
        assert (t.shape, t.stride(), t.dtype, t.device) == (ref.shape, ref.stride(), ref.dtype, ref.device)
        assert not t.requires_grad and t.untyped_storage().data_ptr() != proto.untyped_storage().data_ptr()


def test_protos_made_outside_inference_mode() -> None:
    dev = torch.device("meta")  # a device no other test fills first
    _checks.PROTOS.pop(dev, None)
    with torch.inference_mode():
        p = _checks.protos(dev)
    assert not any(t.is_inference() for t in p.values())


def test_protos_never_cached_fake() -> None:
    dev = torch.device("meta")
    _checks.PROTOS.pop(dev, None)
    with FakeTensorMode():
        _checks.protos(dev)
    assert dev not in _checks.PROTOS


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_topk_outputs_fresh_and_dense(dtype: torch.dtype) -> None:
    g = torch.randn(3, 16).to(dtype)
    w, ids = moe.topk_softmax(g, 4)
    w2, ids2 = moe.topk_softmax(g, 4)
    assert (w.dtype, ids.dtype, w.shape, ids.shape) == (torch.float32, torch.int32, (3, 4), (3, 4))
    assert w.stride() == ids.stride() == (4, 1)
    ptrs = {t.untyped_storage().data_ptr() for t in (w, ids, w2, ids2)}
    assert len(ptrs) == 4  # four allocations: no output shares memory with another
    torch.testing.assert_close(w, w2)
    assert torch.equal(ids, ids2)
    ref_w, ref_ids = mop.topk_softmax.reference(g, 4)
    assert torch.equal(ref_ids.to(ids.dtype), ids)
    torch.testing.assert_close(ref_w, w)
    with torch.inference_mode():
        wi, _ = moe.topk_softmax(g, 4)
    assert wi.is_inference() and not w.is_inference()


def test_topk_fake_tensors_keep_empty() -> None:
    with FakeTensorMode() as mode:
        g = mode.from_tensor(torch.randn(2, 8))
        _, (w, ids) = moe_contracts.check_topk_softmax("moe.topk_softmax", g, 2)
    assert type(w) is not torch.Tensor and type(ids) is not torch.Tensor  # fake, like their input
    assert (w.dtype, ids.dtype, w.shape) == (torch.float32, torch.int32, (2, 2))


def test_cpu_block_errors_unchanged() -> None:
    x, w = torch.randn(2, 8), torch.randn(8)
    layernorm.rmsnorm(x, w)  # the CPU cache holds float32 now
    with pytest.raises(TypeError, match="x"):
        layernorm.rmsnorm("x", w)  # not a tensor: the full dispatch names it
    with pytest.raises(ValueError, match="weight"):
        layernorm.rmsnorm(x, torch.randn(7))  # the contract, inside the CPU block
    with pytest.raises(TypeError, match="int32"):
        layernorm.rmsnorm(x.int(), w.int())  # a dtype the cache never holds: the full dispatch


def test_non_cpu_tensors_fall_through() -> None:
    x, w = torch.randn(2, 8), torch.randn(8)
    layernorm.rmsnorm(x, w)  # the CPU cache holds float32 now
    # a meta tensor of that dtype never reaches the CPU kernel (whose C++ checks refuse a
    # non-CPU tensor): the selection runs for its own device
    y = layernorm.rmsnorm(x.to("meta"), w.to("meta"))
    assert y.device.type == "meta" and y.shape == x.shape
