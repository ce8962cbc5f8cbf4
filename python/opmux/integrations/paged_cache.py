"""A paged KV cache owned by opmux, for a continuous-batching loop over a model's layers.

Pages are blocks of ``page_size`` token slots in one ``[num_blocks, page_size, Hkv, D]`` key and
value tensor per layer (vLLM's flash layout, what ``kvcache.reshape_and_cache`` writes and the
``attention.paged_*`` ops read). Each request owns a list of blocks (its block-table row) and a
length; pages are taken from a free list as a request grows and given back when it ends, so a
later request reuses them.

    cache = PagedKVCache(layers, num_blocks=64, page_size=16, num_kv_heads=2, head_dim=64,
                         dtype=torch.float32, device="cpu")
    step = cache.schedule([("a", 7), ("b", 1)])   # 7 prompt tokens of a, one decode token of b
    out = cache.attend(layer, q, k, v, step)      # per layer: write k/v, attend over the pages
    cache.release("a")                            # a is done: its pages go back to the free list

``schedule`` is the only place lengths and pages change; everything a layer needs for one forward
(slot of each new token, block tables, lengths, query offsets, positions) is in the returned
``PagedStep``, computed once per step and shared by all layers.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch
    from torch import Tensor

__all__ = ["PagedKVCache", "PagedStep"]


@dataclass(frozen=True)
class PagedStep:
    """One forward's view of the cache: ``T`` new tokens of ``B`` requests, packed in request order."""

    cache: PagedKVCache
    requests: tuple[Hashable, ...]
    slot_mapping: Tensor  # int64 [T]: block * page_size + offset of each new token
    block_tables: Tensor  # int32 [B, max_blocks]: each request's pages (rows padded with block 0)
    seq_lens: Tensor  # int32 [B]: cached prefix + new tokens
    cu_seqlens_q: Tensor  # int32 [B + 1]: request b's new tokens are rows cu[b]:cu[b + 1]
    positions: Tensor  # int64 [T]: each new token's position in its request (for RoPE)
    last_rows: Tensor  # int64 [B]: row of each request's last new token (whose logits are sampled)

    @property
    def decode(self) -> bool:
        """Every request brings exactly one token: ``paged_decode`` rather than ``paged_prefill``."""
        return self.slot_mapping.shape[0] == len(self.requests)


class PagedKVCache:
    """Per-layer key/value pages plus the block bookkeeping of the requests that use them."""

    def __init__(
        self,
        num_layers: int,
        *,
        num_blocks: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        import torch

        self.page_size = page_size
        self.device = torch.device(device)
        shape = (num_blocks, page_size, num_kv_heads, head_dim)
        self.key = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        self.value = [torch.zeros(shape, dtype=dtype, device=self.device) for _ in range(num_layers)]
        # a stack: the most recently freed pages are handed out first (reuse shows up at once)
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))
        self._blocks: dict[Hashable, list[int]] = {}
        self._lens: dict[Hashable, int] = {}

    @classmethod
    def for_config(
        cls, config: Any, *, num_blocks: int, page_size: int, dtype: torch.dtype, device: torch.device | str
    ) -> PagedKVCache:
        """Sized from a Hugging Face decoder config (layers, KV heads, head_dim)."""
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        return cls(
            config.num_hidden_layers,
            num_blocks=num_blocks,
            page_size=page_size,
            num_kv_heads=kv_heads,
            head_dim=head_dim,
            dtype=dtype,
            device=device,
        )

    @property
    def num_blocks(self) -> int:
        return self.key[0].shape[0] if self.key else 0

    @property
    def num_free_blocks(self) -> int:
        return len(self._free)

    def seq_len(self, request: Hashable) -> int:
        return self._lens.get(request, 0)

    def blocks(self, request: Hashable) -> list[int]:
        """The request's block-table row (a copy)."""
        return list(self._blocks.get(request, ()))

    def blocks_needed(self, request: Hashable, new_tokens: int) -> int:
        """Pages ``request`` must still take to hold ``new_tokens`` more tokens."""
        have = len(self._blocks.get(request, ()))
        return max(0, -(-(self.seq_len(request) + new_tokens) // self.page_size) - have)

    def schedule(self, new_tokens: Sequence[tuple[Hashable, int]]) -> PagedStep:
        """Take pages for each ``(request, n)`` (``n >= 1`` new tokens), advance the lengths and
        return the step's tensors. Raises MemoryError, changing nothing, when the free pages do not
        cover the step (the caller's scheduler should have asked ``blocks_needed``)."""
        import torch

        if not new_tokens or any(n < 1 for _, n in new_tokens):
            raise ValueError(f"a step needs at least one request, each with >= 1 new token: {new_tokens}")
        if len({r for r, _ in new_tokens}) != len(new_tokens):
            raise ValueError(f"a request appears twice in one step: {[r for r, _ in new_tokens]}")
        need = sum(self.blocks_needed(r, n) for r, n in new_tokens)
        if need > len(self._free):
            raise MemoryError(f"the step needs {need} pages, {len(self._free)} are free")
        slots: list[int] = []
        positions: list[int] = []
        seq_lens: list[int] = []
        cu = [0]
        for r, n in new_tokens:
            blocks = self._blocks.setdefault(r, [])
            blocks += [self._free.pop() for _ in range(self.blocks_needed(r, n))]
            start = self._lens.get(r, 0)
            for pos in range(start, start + n):
                slots.append(blocks[pos // self.page_size] * self.page_size + pos % self.page_size)
                positions.append(pos)
            self._lens[r] = start + n
            seq_lens.append(start + n)
            cu.append(cu[-1] + n)
        width = max(len(self._blocks[r]) for r, _ in new_tokens)
        table = [self._blocks[r] + [0] * (width - len(self._blocks[r])) for r, _ in new_tokens]

        def t(values: Any, dtype: torch.dtype) -> Tensor:
            return torch.tensor(values, dtype=dtype).to(self.device, non_blocking=True)

        return PagedStep(
            cache=self,
            requests=tuple(r for r, _ in new_tokens),
            slot_mapping=t(slots, torch.int64),
            block_tables=t(table, torch.int32),
            seq_lens=t(seq_lens, torch.int32),
            cu_seqlens_q=t(cu, torch.int32),
            positions=t(positions, torch.int64),
            last_rows=t([c - 1 for c in cu[1:]], torch.int64),
        )

    def release(self, request: Hashable) -> None:
        """The request is done: its pages go back to the free list (their contents stay, unread)."""
        self._free += reversed(self._blocks.pop(request, []))
        self._lens.pop(request, None)

    def attend(
        self,
        layer: int,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        step: PagedStep,
        *,
        scale: float = 0.0,
        softcap: float = 0.0,
        window_left: int = -1,
        sinks: Tensor | None = None,
    ) -> Tensor:
        """Write the step's new ``key`` / ``value`` ``[T, Hkv, D]`` into ``layer``'s pages
        (``kvcache.reshape_and_cache``), then attend ``query [T, Hq, D]`` over each request's
        pages: ``attention.paged_decode`` when every request brings one token, else
        ``attention.paged_prefill`` (prompt chunks on a cached prefix, decode tokens beside them).
        ``sinks [Hq]``: float32 attention-sink logits (gpt-oss). Returns ``[T, Hq, D]``."""
        from opmux.kernels import ops

        kc, vc = self.key[layer], self.value[layer]
        ops.kvcache.reshape_and_cache(key, value, kc, vc, step.slot_mapping)
        args = (kc, vc, step.block_tables, step.seq_lens)
        extra = {"scale": scale, "softcap": softcap, "window_left": window_left, "sinks": sinks}
        out: Tensor
        if step.decode:
            out = ops.attention.paged_decode(query, *args, **extra)
        else:
            out = ops.attention.paged_prefill(query, *args, step.cu_seqlens_q, **extra)
        return out
