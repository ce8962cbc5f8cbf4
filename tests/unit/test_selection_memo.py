"""FusedOp.select_for memoizes select() (a pure function of its inputs): a repeated call reuses
the Selection, and every input that changes the choice (the call's predicates, failures, the
forced backends, the size class) gives a fresh one."""

from __future__ import annotations

import torch

from opmux.kernels.explain import op_instance


def _args(dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, ...]:
    h = torch.randn(4, 256, dtype=dtype)
    w1 = torch.randn(8, 512, 256, dtype=dtype)
    w2 = torch.randn(8, 256, 256, dtype=dtype)
    return h, w1, w2, torch.rand(4, 2), torch.randint(0, 8, (4, 2), dtype=torch.int32)


def test_repeated_calls_reuse_the_selection_and_changed_inputs_do_not() -> None:
    op = op_instance("moe.fused_experts")
    op.invalidate()
    args = _args()
    first = op.select_for(args, {})
    assert op.select_for(args, {}) is first
    assert op.select_for(_args(), {}) is first  # same dtype, shape class and predicates
    forced = op.select_for(args, {}, backend="torch")
    assert forced is not first and forced.chosen == "torch"
    assert op.select_for(_args(torch.float16), {}) is not first
    chosen = first.chosen
    op._failed[chosen] = "failed at run time (test)"
    try:
        again = op.select_for(args, {})
        assert again is not first and again.chosen != chosen
    finally:
        op._failed.pop(chosen)
    assert op.select_for(args, {}).chosen == chosen
    op.invalidate()
    assert op.select_for(args, {}) is not first  # invalidate drops the memo
