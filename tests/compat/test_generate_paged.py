"""examples/generate_paged.py on tiny random-weight Llama and Qwen3-MoE models (CPU, fp32): the
continuous-batching loop over opmux's paged KV cache (kernelize + the "opmux" attention) gives
every request the untouched model's greedy tokens, through kvcache / attention ops; a wrong block
table or a misplaced cache write breaks that. Plus the cache's page bookkeeping."""

from __future__ import annotations

import importlib.util
import math
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

pytest.importorskip("transformers")

from opmux.integrations.paged_cache import PagedKVCache, PagedStep
from opmux.kernels import tracing, use_backends

ROOT = Path(__file__).resolve().parents[2]
#: tiny workload: prompts up to 12 tokens (chunked by the 8-token budget), 8 pages of 4 slots (too
#: few for every request at once: later ones wait for, then reuse, freed pages)
LOOP = dict(page_size=4, num_blocks=8, token_budget=8)


def _example() -> Any:
    name = "generate_paged_example"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ROOT / "examples" / "generate_paged.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module  # dataclasses resolve the module's annotations through it
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return sys.modules[name]


#: the ops' torch backends (the CPU default would JIT-compile the C++ units first: slow here); the
#: triton case runs the paged attention and cache writes as on CUDA, in the interpreter
TORCH = "*=torch"
TRITON = "*=torch;attention.*=triton;kvcache.*=triton"


@pytest.fixture(autouse=True)
def _torch_backends() -> Iterator[None]:
    with use_backends(TORCH):
        yield


def _run(model_name: str, cache_cls: type[PagedKVCache] = PagedKVCache) -> tuple[Any, list[Any], dict]:
    gp = _example()
    model = gp.build_model(model_name, "tiny", torch.float32, "cpu")
    requests = gp.make_requests(5, model.config.vocab_size, max_prompt=12, max_new=8)
    ref = gp.reference_tokens(model, requests)
    gp.serve(model, requests, cache_cls=cache_cls, **LOOP)
    return model, requests, ref


@pytest.mark.parametrize(
    ("model_name", "backends"),
    [("llama", TORCH), ("qwen3-moe", TORCH), ("llama", TRITON)],
    ids=["llama", "qwen3-moe", "llama-triton"],
)
def test_loop_gives_hf_greedy_tokens(model_name: str, backends: str) -> None:
    with use_backends(backends), tracing.capture() as calls:
        model, requests, ref = _run(model_name)
    gp = _example()
    bad = {q.rid: (q.out, ref[q.rid]) for q in requests if q.out != ref[q.rid]}
    assert not bad, f"requests whose tokens differ from HF eager (opmux, HF): {bad}"
    assert all(gp.agreement(model, q, ref[q.rid]) == (True, "identical", 0.0) for q in requests)
    ops = {c.op for c in calls}
    want = "triton" if backends == TRITON else "torch"
    assert {c.backend for c in calls if c.op.startswith(("attention.", "kvcache."))} == {want}
    assert {"kvcache.reshape_and_cache", "attention.paged_prefill", "attention.paged_decode"} <= ops
    assert {"layernorm.rmsnorm", "rope.rotary_embedding"} <= ops
    assert ("moe.fused_experts" if model_name == "qwen3-moe" else "activation.silu_and_mul") in ops
    # the workload does what it is there for: chunked prompts, requests that wait, pages reused
    assert any(len(q.prompt) > LOOP["token_budget"] for q in requests)
    assert any(q.admitted > q.arrival for q in requests)
    used = [p for q in requests for p in q.pages]
    assert len(used) > len(set(used)), "no page served two requests"
    assert len({q.finished for q in requests}) > 1


class _RolledTables(PagedKVCache):
    """Each request reads the next request's pages (a wrong block table)."""

    def schedule(self, new_tokens: Any) -> PagedStep:
        step = super().schedule(new_tokens)
        return _replace(step, block_tables=step.block_tables.roll(1, dims=0).contiguous())


class _ShiftedSlots(PagedKVCache):
    """Each new token's K/V lands one slot later than the block table says (an off-by-one write)."""

    def schedule(self, new_tokens: Any) -> PagedStep:
        step = super().schedule(new_tokens)
        capacity = self.num_blocks * self.page_size
        return _replace(step, slot_mapping=(step.slot_mapping + 1) % capacity)


def _replace(step: PagedStep, **changes: Any) -> PagedStep:
    import dataclasses

    return dataclasses.replace(step, **changes)


@pytest.mark.parametrize("cache_cls", [_RolledTables, _ShiftedSlots], ids=["rolled-tables", "shifted-slots"])
def test_a_broken_cache_gives_other_tokens(cache_cls: type[PagedKVCache]) -> None:
    _, requests, ref = _run("llama", cache_cls)
    assert any(q.out != ref[q.rid] for q in requests), "the loop ignores its paged cache"


def test_cache_pages_slots_and_reuse() -> None:
    cache = PagedKVCache(
        1, num_blocks=4, page_size=2, num_kv_heads=1, head_dim=2, dtype=torch.float32, device="cpu"
    )
    step = cache.schedule([("a", 3), ("b", 1)])
    assert cache.blocks("a") == [0, 1] and cache.blocks("b") == [2]
    assert step.slot_mapping.tolist() == [0, 1, 2, 4]
    assert step.block_tables.tolist() == [[0, 1], [2, 0]] and step.block_tables.dtype == torch.int32
    assert step.seq_lens.tolist() == [3, 1] and step.cu_seqlens_q.tolist() == [0, 3, 4]
    assert step.positions.tolist() == [0, 1, 2, 0] and step.last_rows.tolist() == [2, 3]
    assert not step.decode
    step = cache.schedule([("a", 1), ("b", 1)])  # a fills its second page, b its first
    assert step.decode and step.slot_mapping.tolist() == [3, 5] and cache.num_free_blocks == 1
    with pytest.raises(MemoryError):  # 2 pages needed, 1 free: nothing changes
        cache.schedule([("a", 1), ("b", 1)])
    assert cache.seq_len("a") == 4 and cache.seq_len("b") == 2 and cache.num_free_blocks == 1
    cache.release("a")
    cache.schedule([("c", 5)])  # takes a's freed pages first, then the one never used
    assert cache.blocks("c") == [0, 1, 3] and cache.num_free_blocks == 0
    with pytest.raises(ValueError, match="twice"):
        cache.schedule([("b", 1), ("b", 1)])


@pytest.mark.parametrize("tokens", [[("a", 5), ("b", 3)], [("a", 1), ("b", 1)]], ids=["prefill", "decode"])
def test_attention_forward_takes_gpt_oss_sinks(tokens: list[tuple[str, int]]) -> None:
    """gpt-oss hands its attention sinks to the attention function as ``s_aux``: they enter the
    softmax's denominator (dropping them silently changes every output row)."""
    from opmux.integrations.transformers import paged_attention_forward
    from opmux.kernels.ops.attention import _prefill

    cache = PagedKVCache(
        1, num_blocks=4, page_size=4, num_kv_heads=2, head_dim=8, dtype=torch.float32, device="cpu"
    )
    step = cache.schedule(tokens)
    g = torch.Generator().manual_seed(3)
    t = step.slot_mapping.shape[0]
    q, k, v = (torch.randn(1, h, t, 8, generator=g) for h in (4, 2, 2))
    sinks = torch.tensor([1.0, -0.5, 2.0, 0.0], dtype=torch.bfloat16)

    class Layer:
        layer_idx = 0

    got, _ = paged_attention_forward(Layer(), q, k, v, None, scaling=0.3, opmux_step=step, s_aux=sinks)
    want = _prefill.reference(
        q[0].transpose(0, 1),
        cache.key[0],
        cache.value[0],
        step.block_tables,
        step.seq_lens,
        step.cu_seqlens_q,
        scale=0.3,
        sinks=sinks.float(),
    )
    torch.testing.assert_close(got[0], want, atol=1e-5, rtol=1e-5)


def test_bf16_agreement_rules() -> None:
    """The lower-precision check: a run that leaves HF's tokens is accepted only at a tie no wider
    than allowed (the run measures it from HF's SDPA attention), and every later token must then be
    HF eager's greedy choice on the run's own prefix or such a tie; fp32 accepts identical tokens
    only, whatever the tie."""
    gp = _example()
    model = gp.build_model("llama", "tiny", torch.bfloat16, "cpu")
    q = gp.make_requests(1, model.config.vocab_size, max_prompt=8, max_new=2)[0]

    @torch.no_grad()
    def logits(prefix: list[int]) -> torch.Tensor:
        return model(torch.tensor([q.prompt + prefix]), logits_to_keep=1).logits[0, -1].float()

    first = logits([])
    order = first.argsort(descending=True).tolist()
    ulp = torch.finfo(torch.bfloat16).eps * 2.0 ** math.floor(math.log2(float(first[order[0]].abs())))
    tok = next(t for t in order[1:] if float(first[order[0]] - first[t]) > 2 * ulp)  # not a one-ulp tie
    ulps = float(first[order[0]] - first[tok]) / ulp
    then = int(logits([tok]).argmax())  # HF's greedy choice after the split
    ref = [order[0], int(logits([order[0]]).argmax())]
    q.out = [tok, then]
    ok, how, _ = gp.agreement(model, q, ref)  # one-ulp ties only
    assert not ok and how.startswith("DIFFERENT at token 0") and "ulp apart" in how
    assert not gp.agreement(model, q, ref, ulps - 0.5)[0]
    ok, how, widest = gp.agreement(model, q, ref, ulps + 0.5)
    assert ok and how.startswith("identical to token 0") and abs(widest - ulps) < 0.01, how
    q.out = [tok, int(logits([tok]).argsort()[0])]  # then HF's least likely token: caught
    ok, how, _ = gp.agreement(model, q, ref, ulps + 0.5)
    assert not ok and how.startswith("DIFFERENT at token 1"), how
    q.out = list(ref)
    assert gp.agreement(model, q, ref) == (True, "identical", 0.0)
    fp32 = gp.build_model("llama", "tiny", torch.float32, "cpu")
    q.out = [tok, then]
    assert gp.agreement(fp32, q, ref, math.inf)[1].startswith("DIFFERENT from token 0")
