"""opmux.integrations.transformers.kernelize on small random-weight models of each family:
logits and greedy tokens match the untouched model, the swaps are reported, revert() restores."""

from __future__ import annotations

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
)

FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, "rmsnorm", "silu_and_mul"),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}, "rmsnorm", "silu_and_mul"),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}, "rmsnorm", "silu_and_mul"),
    "mistral": ("MistralConfig", "MistralForCausalLM", {}, "rmsnorm", "silu_and_mul"),
    "gemma": ("GemmaConfig", "GemmaForCausalLM", {"hidden_activation": "gelu_pytorch_tanh"}, "gemma_rmsnorm",
              "gelu_tanh_and_mul"),
}  # fmt: skip


def _model(family: str) -> Any:
    cfg_name, model_name, extra, _, _ = FAMILIES[family]
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_name)(**SMALL, **extra)
    model = getattr(transformers, model_name)(cfg).eval()
    with torch.no_grad():  # random norm weights: a swap that ignored them would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    return model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_kernelized_model_matches(family: str) -> None:
    model = _model(family)
    ids = torch.randint(0, 97, (2, 9), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want = model(ids).logits
        want_tokens = model.generate(ids, max_new_tokens=6, do_sample=False)
        result = kernelize(model)
        with tracing.capture() as calls:
            got = model(ids).logits
        got_tokens = model.generate(ids, max_new_tokens=6, do_sample=False)
    counts = result.counts()
    norm_kind, act_kind = FAMILIES[family][3], FAMILIES[family][4]
    layers = SMALL["num_hidden_layers"]
    expected_norms = 2 * layers + 1 + (2 * layers if family == "qwen3" else 0)  # + q_norm/k_norm
    assert counts.get(norm_kind) == expected_norms, str(result)
    assert counts.get(act_kind) == layers, str(result)
    assert counts.get("rotary_embedding") == 1, str(result)
    assert not result.skipped, str(result)
    ran = {c.op for c in calls}  # the swapped code really ran the opmux ops
    assert {f"layernorm.{norm_kind}", f"activation.{act_kind}", "rope.rotary_embedding"} <= ran, ran
    torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert torch.equal(got_tokens, want_tokens)
    assert kernelize(model) is result  # once
    result.revert()
    with torch.no_grad():
        assert torch.equal(model(ids).logits, want)  # the model's own code again, bit for bit


def test_a_module_the_probe_rejects_is_left_alone() -> None:
    class OddRMSNorm(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(8))
            self.eps = 1e-6

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2  # not an RMSNorm at all

    model = torch.nn.Sequential(OddRMSNorm())
    result = kernelize(model)
    assert result.swaps == [] and result.skipped and "matches neither" in result.skipped[0][1]
    x = torch.randn(2, 8)
    assert torch.equal(model(x), x * 2)


def test_grad_mode_falls_back_to_the_modules_own_code() -> None:
    model = _model("llama")
    kernelize(model)
    ids = torch.randint(0, 97, (1, 5))
    loss = model(ids).logits.sum()  # trainable weights under grad mode: the original forwards
    loss.backward()
    assert model.model.norm.weight.grad is not None
