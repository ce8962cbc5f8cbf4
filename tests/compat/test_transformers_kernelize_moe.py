"""kernelize on small random-weight Mixtral and Qwen3-MoE models: the sparse MoE blocks run
``moe.topk_softmax`` + ``moe.fused_experts``; logits, router logits and greedy tokens match the
untouched model; revert() restores it. Also the per-expert layout of older transformers (a
linear router over a ModuleList of expert MLPs), on a block written as those releases wrote it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from opmux.integrations.transformers import kernelize  # noqa: E402
from opmux.kernels import tracing  # noqa: E402

SMALL = dict(
    vocab_size=97,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=64,
    num_experts_per_tok=2,
)
FAMILIES = {
    "mixtral": ("MixtralConfig", "MixtralForCausalLM", dict(num_local_experts=8)),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(num_experts=4, moe_intermediate_size=48)),
    "qwen3_moe_unnormalized": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        dict(num_experts=8, moe_intermediate_size=48, norm_topk_prob=False),
    ),
}


@pytest.fixture(autouse=True)
def _torch_moe() -> Iterator[None]:
    """The moe ops' torch backend (the routing's C++ kernel would be compiled first: slow here)."""
    import opmux.kernels as K

    with K.use_backends("moe.*=torch"):
        yield


def _model(family: str, dtype: torch.dtype) -> Any:
    cfg_name, model_name, extra = FAMILIES[family]
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_name)(**SMALL, **extra)
    model = getattr(transformers, model_name)(cfg).eval().to(dtype)
    with torch.no_grad():  # routers with clearly separated logits (no near-ties between experts)
        for name, p in model.named_parameters():
            if name.endswith(("mlp.gate.weight", "block_sparse_moe.gate.weight")):  # 5.x, 4.x Mixtral
                p.normal_(0.0, 0.5)
    return model


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_kernelized_moe_model_matches(family: str, dtype: torch.dtype) -> None:
    model = _model(family, dtype)
    ids = torch.randint(0, 97, (2, 7), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids, output_router_logits=True)
        want_tokens = (
            model.generate(ids, max_new_tokens=5, do_sample=False) if dtype == torch.float32 else None
        )
        result = kernelize(model, norms=False, mlp=False, rope=False)
        with tracing.capture() as calls:
            got = model(ids, output_router_logits=True)
        got_tokens = (
            model.generate(ids, max_new_tokens=5, do_sample=False) if dtype == torch.float32 else None
        )
    assert result.counts() == {"moe": SMALL["num_hidden_layers"]} and not result.skipped, str(result)
    assert {"moe.topk_softmax", "moe.fused_experts"} <= {c.op for c in calls}
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.logits, want.logits, atol=tol, rtol=tol)
    assert len(got.router_logits) == len(want.router_logits)  # the aux-loss outputs are still recorded
    torch.testing.assert_close(got.router_logits[0], want.router_logits[0], atol=tol, rtol=tol)  # same input
    for g, w in zip(got.router_logits[1:], want.router_logits[1:], strict=True):  # bf16: the sums' roundings
        torch.testing.assert_close(g, w, atol=10 * tol, rtol=tol)
    assert got.aux_loss is not None
    if dtype == torch.float32:
        assert torch.equal(got_tokens, want_tokens)
    result.revert()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want.logits)  # the model's own code again


@pytest.mark.parametrize("norm", [False, True])
def test_a_peaked_router_keeps_its_rule(norm: bool) -> None:
    """Large router weights (a peaked softmax: the top expert takes nearly all the weight) must not
    pass plain top-k weights off as renormalized ones, or the reverse: Qwen3-MoE's default is
    ``norm_topk_prob=False``."""
    torch.manual_seed(0)
    cfg = transformers.Qwen3MoeConfig(
        **{**SMALL, "hidden_size": 256}, num_experts=8, moe_intermediate_size=48, norm_topk_prob=norm
    )
    model = transformers.Qwen3MoeForCausalLM(cfg).eval()
    block = model.model.layers[0].mlp
    with torch.no_grad():
        block.gate.weight.normal_(0.0, 2.0)  # unit inputs: logits of spread ~32, one expert takes all
        x = torch.randn(1, 9, 256, generator=torch.Generator().manual_seed(1)) / 32  # spread ~1 here
        want = block(x)
        result = kernelize(model, norms=False, mlp=False, rope=False)
        got = block(x)
    assert result.counts() == {"moe": SMALL["num_hidden_layers"]}, str(result)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_grad_mode_falls_back_to_the_blocks_own_code() -> None:
    model = _model("mixtral", torch.float32)
    kernelize(model, norms=False, mlp=False, rope=False)
    ids = torch.randint(0, 97, (1, 5))
    with tracing.capture() as calls:
        model(ids).logits.sum().backward()
    assert "moe.fused_experts" not in {c.op for c in calls}
    layer = model.model.layers[0]
    block = layer.mlp if hasattr(layer, "mlp") else layer.block_sparse_moe  # 4.x Mixtral's name
    # 5.x: one fused weight per projection; 4.x: per-expert modules, only the routed ones' grads
    assert any(p.grad is not None for p in block.experts.parameters()), "the experts' own backward"


# -- the per-expert layout (transformers 4.x's MixtralSparseMoeBlock / Qwen3MoeSparseMoeBlock) --
class _Expert(torch.nn.Module):
    def __init__(self, h: int, n: int, mixtral: bool) -> None:
        super().__init__()
        names = ("w1", "w3", "w2") if mixtral else ("gate_proj", "up_proj", "down_proj")
        for name, (i, o) in zip(names, ((h, n), (h, n), (n, h)), strict=True):
            setattr(self, name, torch.nn.Linear(i, o, bias=False))
        self.names = names
        self.act_fn = torch.nn.SiLU()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u, d = (getattr(self, n) for n in self.names)
        return d(self.act_fn(g(x)) * u(x))


class OldSparseMoeBlock(torch.nn.Module):
    """The routing of those releases: softmax in fp32, top-k, renormalized (Mixtral always,
    Qwen3 per ``norm_topk_prob``), the weights cast to the activations' dtype; returns
    ``(hidden, router_logits)``."""

    def __init__(self, h: int, n: int, e: int, k: int, mixtral: bool, norm: bool = True) -> None:
        super().__init__()
        self.top_k, self.num_experts = k, e
        if not mixtral:
            self.norm_topk_prob = norm
        self.gate = torch.nn.Linear(h, e, bias=False)
        self.experts = torch.nn.ModuleList(_Expert(h, n, mixtral) for _ in range(e))

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        b, s, h = hidden_states.shape
        x = hidden_states.view(-1, h)
        router_logits = self.gate(x)
        weights = torch.softmax(router_logits, dim=1, dtype=torch.float)
        weights, selected = torch.topk(weights, self.top_k, dim=-1)
        if getattr(self, "norm_topk_prob", True):
            weights /= weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.where(selected == e)
            out.index_add_(0, tok, expert(x[tok]) * weights[tok, slot, None])
        return out.view(b, s, h), router_logits


@pytest.mark.parametrize(("mixtral", "norm"), [(True, True), (False, False)])
def test_per_expert_layout(mixtral: bool, norm: bool) -> None:
    torch.manual_seed(0)
    model = torch.nn.Sequential()
    model.add_module("block", OldSparseMoeBlock(64, 48, 4, 2, mixtral, norm))
    model.eval()
    x = torch.randn(2, 5, 64)
    with torch.no_grad():
        want, want_logits = model.block(x)
        result = kernelize(model)
        assert result.counts() == {"moe": 1} and not result.skipped, str(result)  # no MLP swaps inside
        with tracing.capture() as calls:
            got, got_logits = model.block(x)
    assert "moe.fused_experts" in {c.op for c in calls}
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(got_logits, want_logits)
    result.revert()
    with torch.no_grad():
        assert torch.equal(model.block(x)[0], want)
