"""A continuous-batching generation loop on opmux alone, checked token for token against Hugging Face.

A random-weight Llama or Qwen3-MoE is built from a small transformers config (no download, fixed
seed). Its untouched copy generates each request greedily (``generate(do_sample=False)``, eager
attention): the reference. The other copy is ``kernelize``d (RMSNorm, gated MLP / sparse MoE,
RoPE on opmux ops) and runs attention through opmux's paged KV cache (the ``"opmux"`` attention
implementation: ``kvcache.reshape_and_cache`` writes, ``attention.paged_prefill`` for prompt chunks,
``attention.paged_decode`` for decode steps). The loop:

* requests arrive at different steps, with different prompt lengths and output lengths;
* each step packs every running request's new tokens into one row: one token per decoding request,
  then prompt chunks within a token budget (a long prompt is prefilled over several steps, on top of
  its cached prefix);
* a request is admitted when the free pages cover its whole length (no preemption), and gives its
  pages back when it finishes; later requests reuse them.

It prints each request's agreement with the reference (fp32: identical tokens; bf16: every token
HF eager's greedy choice on the run's own prefix, or a tie of HF's own logits there, as wide as
the widest tie HF's SDPA attention takes from HF eager in the same run, at least one ulp: where
HF's rounding and opmux's fp32 accumulation may go either way) and the median decode-step time
beside HF's
eager decode step at the same batch and context (timing is printed, never checked).

    PYTHONPATH=python python examples/generate_paged.py --model llama --dtype float32 --device cpu
    PYTHONPATH=python python examples/generate_paged.py --model qwen3-moe --size tiny

Exits 1 when a request's tokens differ from the reference.
"""

from __future__ import annotations

import argparse
import copy
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import transformers

from opmux.integrations.paged_cache import PagedKVCache
from opmux.integrations.transformers import KernelizeResult, kernelize, register_paged_attention

#: per model: the config class, the model class, the config fields beyond the size's
MODELS: dict[str, tuple[str, str, dict[str, Any]]] = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen3-moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {"num_experts": 8, "num_experts_per_tok": 2, "decoder_sparse_step": 1},
    ),
}
#: model sizes (GQA everywhere); "tiny" is what CI runs on the CPU
SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(
        vocab_size=97, hidden_size=64, intermediate_size=96,
        num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
    ),
    "small": dict(
        vocab_size=512, hidden_size=256, intermediate_size=512,
        num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=32,
    ),
    # Llama-3.2-1B's shape (vocabulary cut to 32,000): a GPU size, where the decode step is the
    # kernels' time rather than the host's
    "1b": dict(
        vocab_size=32000, hidden_size=2048, intermediate_size=8192,
        num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8, head_dim=64,
    ),
}  # fmt: skip


@dataclass
class Request:
    rid: int
    prompt: list[int]
    max_new_tokens: int
    arrival: int  # the step at which it reaches the scheduler
    fed: int = 0  # prompt tokens in the cache
    out: list[int] = field(default_factory=list)
    admitted: int = -1
    finished: int = -1
    pages: list[int] = field(default_factory=list)  # its block-table row when it finished

    @property
    def done(self) -> bool:
        return len(self.out) >= self.max_new_tokens


def build_model(name: str, size: str, dtype: torch.dtype, device: str, seed: int = 0) -> Any:
    """A random-weight model from its config, eager attention, no EOS (requests stop at their length)."""
    cfg_name, model_name, extra = MODELS[name]
    fields = dict(SIZES[size], max_position_embeddings=256, eos_token_id=None, pad_token_id=0, **extra)
    if "num_experts" in extra:  # experts half the dense MLP's width
        fields["moe_intermediate_size"] = fields["intermediate_size"] // 2
    torch.manual_seed(seed)
    config = getattr(transformers, cfg_name)(**fields)
    model = getattr(transformers, model_name)(config)
    model.set_attn_implementation("eager")
    with torch.no_grad():  # routers with clearly separated logits: no near-tie between experts
        for pname, p in model.named_parameters():
            if pname.endswith("mlp.gate.weight"):
                p.normal_(0.0, 0.5)
    model.generation_config.eos_token_id = None
    model.generation_config.pad_token_id = 0
    return model.eval().to(device=device, dtype=dtype)


def make_requests(n: int, vocab: int, max_prompt: int, max_new: int, seed: int = 1) -> list[Request]:
    """``n`` requests of random prompts (lengths 2..max_prompt), output lengths and arrivals."""
    g = torch.Generator().manual_seed(seed)

    def r(lo: int, hi: int) -> int:
        return int(torch.randint(lo, hi + 1, (1,), generator=g))

    out, arrival = [], 0
    for i in range(n):
        prompt = torch.randint(1, vocab, (r(2, max_prompt),), generator=g).tolist()
        out.append(Request(i, prompt, r(2, max_new), arrival))
        arrival += r(0, 3)
    return out


@torch.no_grad()
def reference_tokens(model: Any, requests: list[Request]) -> dict[int, list[int]]:
    """Each request alone through the untouched model's greedy ``generate``."""
    dev = next(model.parameters()).device
    ref = {}
    for q in requests:
        ids = torch.tensor([q.prompt], device=dev)
        out = model.generate(ids, max_new_tokens=q.max_new_tokens, do_sample=False)
        ref[q.rid] = out[0, len(q.prompt) :].tolist()
    return ref


@torch.no_grad()
def agreement(model: Any, q: Request, ref: list[int], tie_ulps: float = 1.0) -> tuple[bool, str, float]:
    """Whether ``q``'s tokens agree with the reference, how, and the widest tie it took (in ulps of
    the dtype). fp32: identical. A lower precision also accepts a run that leaves the reference's
    tokens where HF cannot tell two tokens apart, and checks every token after that on the run's
    own prefix: each must be HF eager's greedy token for that prefix, or within ``tie_ulps`` of
    it in HF's own logits (the caller measures how far HF's other attention implementation
    strays from HF eager the same way: ``main``)."""
    if q.out == ref:
        return True, "identical", 0.0
    i = next(j for j, (a, b) in enumerate(zip(q.out, ref, strict=True)) if a != b)
    dtype = next(model.parameters()).dtype
    kind = str(dtype).removeprefix("torch.")
    if dtype == torch.float32:
        return False, f"DIFFERENT from token {i}\n    opmux {q.out}\n    HF    {ref}", math.inf
    device = next(model.parameters()).device
    ties: list[str] = []
    widest = 0.0
    for j in range(i, len(q.out)):  # HF's greedy choice on the run's own prefix, token by token
        ids = torch.tensor([q.prompt + q.out[:j]], device=device)
        logits = model(ids, logits_to_keep=1).logits[0, -1].float()
        best, tok = int(logits.argmax()), q.out[j]
        if tok == best:
            continue
        want, got = float(logits[best]), float(logits[tok])
        ulp = torch.finfo(dtype).eps * 2.0 ** math.floor(math.log2(max(abs(want), abs(got), 2.0**-126)))
        ulps = (want - got) / ulp
        how = f"token {j}: HF's logits {want:.6g} / {got:.6g}, {ulps:.0f} {kind} ulp apart"
        if ulps > tie_ulps:
            return (
                False,
                f"DIFFERENT at {how} (HF eager's greedy token {best})\n    opmux {q.out}\n    HF    {ref}",
                ulps,
            )
        ties.append(how)
        widest = max(widest, ulps)
    return (
        True,
        f"identical to token {i}, then HF eager's greedy choice on its own prefix but at ties ({'; '.join(ties)})",
        widest,
    )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def run_loop(
    model: Any, cache: PagedKVCache, requests: list[Request], token_budget: int
) -> list[tuple[int, float]]:
    """Serve ``requests`` (filled in place) on ``model`` (attention "opmux") over ``cache``;
    returns ``(batch size, seconds)`` of every decode-only step."""
    dev = cache.device
    waiting = sorted(requests, key=lambda q: q.arrival)
    running: list[Request] = []
    reserved = 0  # pages promised to running requests but not yet taken
    decode_times: list[tuple[int, float]] = []
    step = 0
    while waiting or running:
        # admit, in arrival order, while the free pages cover a request's whole length
        while waiting and waiting[0].arrival <= step:
            q = waiting[0]
            need = cache.blocks_needed(q.rid, len(q.prompt) + q.max_new_tokens)
            if need > cache.num_blocks:
                raise MemoryError(f"request {q.rid} needs {need} pages, the cache has {cache.num_blocks}")
            if need > cache.num_free_blocks - reserved:
                break
            running.append(waiting.pop(0))
            q.admitted, reserved = step, reserved + need
        # this step's tokens: one per decoding request, then prompt chunks within the budget
        batch: list[tuple[Request, list[int]]] = [(q, q.out[-1:]) for q in running if q.fed == len(q.prompt)]
        budget = token_budget - len(batch)
        for q in running:
            if q.fed < len(q.prompt) and budget > 0:
                chunk = q.prompt[q.fed : q.fed + budget]
                batch.append((q, chunk))
                budget -= len(chunk)
        if not batch:
            step += 1
            continue
        for q, toks in batch:
            reserved -= cache.blocks_needed(q.rid, len(toks))
        plan = cache.schedule([(q.rid, len(toks)) for q, toks in batch])
        ids = torch.tensor([[t for _, toks in batch for t in toks]], device=dev)
        decode_only = plan.decode
        _sync(dev)
        t0 = time.perf_counter()
        logits = model(
            ids,
            position_ids=plan.positions[None],
            use_cache=False,
            logits_to_keep=plan.last_rows,
            opmux_step=plan,
        ).logits[0]
        nxt = logits.float().argmax(-1).tolist()
        _sync(dev)
        if decode_only:
            decode_times.append((len(batch), time.perf_counter() - t0))
        for (q, toks), tok in zip(batch, nxt, strict=True):
            if q.fed < len(q.prompt):
                q.fed += len(toks)
                if q.fed < len(q.prompt):
                    continue  # a prompt chunk: no token yet
            q.out.append(tok)
            if q.done:
                q.pages, q.finished = cache.blocks(q.rid), step
                cache.release(q.rid)
                running.remove(q)
        step += 1
    return decode_times


def serve(
    model: Any,
    requests: list[Request],
    page_size: int,
    num_blocks: int,
    token_budget: int,
    cache_cls: type[PagedKVCache] = PagedKVCache,
) -> tuple[KernelizeResult, list[tuple[int, float]]]:
    """Run ``requests`` on a kernelized copy of ``model`` with the "opmux" attention over a fresh
    ``cache_cls`` (``num_blocks`` pages of ``page_size`` per layer); returns what kernelize
    swapped (already reverted: it patches the modeling module's RoPE, shared with ``model``) and
    ``run_loop``'s decode-step times."""
    served = copy.deepcopy(model)
    result = kernelize(served)
    served.set_attn_implementation(register_paged_attention())
    dtype = next(model.parameters()).dtype
    cache = cache_cls.for_config(
        served.config, num_blocks=num_blocks, page_size=page_size, dtype=dtype, device=served.device
    )
    try:
        return result, run_loop(served, cache, requests, token_budget)
    finally:
        result.revert()


@torch.no_grad()
def hf_decode_step(
    model: Any, batch: int, context: int, steps: int = 8, forward: Callable | None = None
) -> float:
    """Median seconds of one decode step of the untouched model (its own KV cache), ``batch``
    sequences after a ``context``-token prompt."""
    dev = next(model.parameters()).device
    fwd = forward if forward is not None else model
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(1, model.config.vocab_size, (batch, context), generator=g).to(dev)
    out = fwd(ids, use_cache=True)
    # transformers renamed past_key_values to cache (5.2x); either works here
    name = "cache" if getattr(out, "cache", None) is not None else "past_key_values"
    cache, tok = getattr(out, name), out.logits[:, -1].argmax(-1, keepdim=True)
    times = []
    for _ in range(steps):
        _sync(dev)
        t0 = time.perf_counter()
        out = fwd(tok, use_cache=True, **{name: cache})
        tok = out.logits[:, -1].argmax(-1, keepdim=True)
        _sync(dev)
        times.append(time.perf_counter() - t0)
        cache = getattr(out, name)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="llama")
    p.add_argument("--size", choices=sorted(SIZES), default="small")
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--requests", type=int, default=6)
    p.add_argument("--max-prompt", type=int, default=40)
    p.add_argument("--max-new", type=int, default=16)
    p.add_argument("--page-size", type=int, default=8)
    p.add_argument("--num-blocks", type=int, default=24, help="pages per layer (small: requests wait)")
    p.add_argument("--token-budget", type=int, default=32, help="tokens per step (prompts are chunked)")
    p.add_argument("--compile", action="store_true", help="also time HF under torch.compile")
    p.add_argument(
        "--hf-sdpa",
        action="store_true",
        help="print how each request generated with HF's SDPA attention leaves HF eager's tokens "
        "(below fp32 that run always sets the tie allowed to opmux)",
    )
    args = p.parse_args(argv)
    dtype = getattr(torch, args.dtype)

    model = build_model(args.model, args.size, dtype, args.device)
    requests = make_requests(args.requests, model.config.vocab_size, args.max_prompt, args.max_new)
    ref = reference_tokens(model, requests)

    result, decode_times = serve(model, requests, args.page_size, args.num_blocks, args.token_budget)

    print(f"{args.model} ({args.size}, {args.dtype}, {args.device}): {result.counts()} + paged attention")
    tie_ulps = 1.0
    if dtype != torch.float32:  # how far HF's own other attention implementation strays, same weights
        sdpa = copy.deepcopy(model)
        sdpa.set_attn_implementation("sdpa")
        alt = reference_tokens(sdpa, requests)
        del sdpa
        spread = [agreement(model, replace(q, out=alt[q.rid]), ref[q.rid], math.inf) for q in requests]
        tie_ulps = max([tie_ulps, *(w for _, _, w in spread)])
        split = sum(how != "identical" for _, how, _ in spread)
        print(
            f"  HF sdpa leaves HF eager's greedy tokens in {split} of {len(requests)} requests, "
            f"at ties up to {tie_ulps:.0f} {args.dtype} ulp: the tie allowed below"
        )
        if args.hf_sdpa:
            for q, (_, how, _) in zip(requests, spread, strict=True):
                print(f"  HF sdpa, request {q.rid}: {how}")
    verdicts = [agreement(model, q, ref[q.rid], tie_ulps) for q in requests]
    for q, (_, how, _) in zip(requests, verdicts, strict=True):
        print(
            f"  request {q.rid}: prompt {len(q.prompt):3d}, new {q.max_new_tokens:3d}, arrived {q.arrival:2d}, "
            f"steps {q.admitted:2d}-{q.finished:2d}, pages {q.pages}: {how}"
        )
    ok = all(v for v, _, _ in verdicts)
    if decode_times:
        bs = round(statistics.mean(b for b, _ in decode_times))
        ctx = round(statistics.mean(len(q.prompt) + q.max_new_tokens // 2 for q in requests))
        line = f"decode step: opmux {1e3 * statistics.median(t for _, t in decode_times):.2f} ms (median, "
        line += f"batch ~{bs}); HF eager {1e3 * hf_decode_step(model, bs, ctx):.2f} ms (batch {bs}, context {ctx})"
        if args.compile:
            compiled = torch.compile(model, dynamic=True)
            hf_decode_step(model, bs, ctx, steps=2, forward=compiled)  # compiles
            line += f"; HF torch.compile {1e3 * hf_decode_step(model, bs, ctx, forward=compiled):.2f} ms"
        print(line)
    print("all requests agree with HF eager" if ok else "MISMATCH: some requests differ from HF eager")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
