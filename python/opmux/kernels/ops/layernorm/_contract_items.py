"""The argument statements the norms share (one each; their contracts combine them)."""

from __future__ import annotations

from .._contract import FLOATS, Arg, Rule, Scalar

#: the rows to normalize, [*T, H]
X = Arg("x", "*T, H", dtypes=FLOATS)
#: the per-channel weight: a dense [H] of x's dtype and device
WEIGHT = Arg("weight", "H", like="x", layout="vector", note=" (x's last dim)")
#: the variance epsilon, finite and > 0
EPS = Scalar("eps", "positive")
#: the fused adds' residual, x's shape, dtype and device
RESIDUAL = Arg("residual", "=x", like="x")
#: the CUDA kernels take a row's width as an int (one launch: at most 2^30 elements a row)
CUDA_HIDDEN = Rule("H <= 2**30", "hidden size {H} exceeds 2^30", device="cuda", name="norm_hidden")
