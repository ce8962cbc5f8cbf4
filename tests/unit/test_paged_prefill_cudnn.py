"""attention.paged_prefill's ``cudnn`` backend: the batch's positions gathered through the block
table into dense keys / values, the query, key, value, output and lse rows at ragged offsets, one
plan per batch (made again when an index tensor changes in place), one graph per shape class,
what planning refuses (and remembers), and the predicate. cuDNN needs a GPU: a
stand-in ``cudnn`` module (a graph that records what is declared and, on execute, reads the pack
through the declared dims, strides and offsets as cuDNN does, then attends in torch) runs the
backend's calls on the CPU here; the real library's results are the GPU parity grid's."""

from __future__ import annotations

import math
import sys
import types
from collections.abc import Iterator
from typing import Any, ClassVar

import pytest
import torch

from opmux.kernels.errors import CallRefused
from opmux.kernels.ops import attention
from opmux.kernels.ops.attention import paged_prefill_cudnn as cdp

I32 = torch.int32


class _T:
    """A graph tensor: its declared dims, strides and ragged offset."""

    def __init__(self, name: str, dim: Any = None, stride: Any = None, data_type: Any = None) -> None:
        self.name, self.dim, self.stride, self.ragged = name, tuple(dim or ()), tuple(stride or ()), None
        self.data_type = data_type

    def set_ragged_offset(self, t: _T) -> _T:
        self.ragged = t
        return self

    def set_output(self, _: bool) -> _T:
        return self

    def set_dim(self, dim: Any) -> _T:
        self.dim = tuple(dim)
        return self

    def set_stride(self, stride: Any) -> _T:
        self.stride = tuple(stride)
        return self

    def set_data_type(self, _: Any) -> _T:
        return self


class _Graph:
    made: ClassVar[list[_Graph]] = []
    executed: ClassVar[int] = 0

    def __init__(self, **kw: Any) -> None:
        self.kw, self.sdpa_kw = kw, {}
        _Graph.made.append(self)

    def tensor(self, name: str, **kw: Any) -> _T:
        return _T(name, **kw)

    def sdpa(self, **kw: Any) -> tuple[_T, _T | None]:
        self.sdpa_kw = kw
        self.o, self.stats = _T("o"), _T("stats") if kw["generate_stats"] else None
        return self.o, self.stats

    def validate(self) -> None: ...
    def build_operation_graph(self) -> None: ...
    def create_execution_plans(self, _: Any) -> None: ...
    def check_support(self) -> None: ...
    def build_plans(self) -> None: ...

    def get_workspace_size(self) -> int:
        return 64

    def execute(self, pack: dict[_T, torch.Tensor], ws: torch.Tensor, handle: Any = None) -> None:
        """cuDNN's semantics: Q / K / V / O rows at their ragged element offsets through the declared
        strides, lengths from tensors, the causal mask aligned bottom-right."""
        _Graph.executed += 1
        kw = self.sdpa_kw
        q_t, k_t, v_t = kw["q"], kw["k"], kw["v"]
        assert "paged_attention_k_table" not in kw  # dense ragged keys (the gathered positions)
        assert kw["use_padding_mask"] is True  # the lengths from tensors bound every sequence
        assert ws.numel() >= self.get_workspace_size()
        for t, x in pack.items():  # what is declared int32 (lengths, offsets) is given as int32
            if t.data_type == "i32":
                assert x.dtype == torch.int32, (t.name, x.dtype)
            if t.ragged is not None:
                assert pack[t.ragged].dtype == torch.int32, t.ragged.name
        b, hq, s_q, d = q_t.dim
        hkv, s_kv = k_t.dim[1], k_t.dim[2]
        q_lens, kv_lens = pack[kw["seq_len_q"]].flatten(), pack[kw["seq_len_kv"]].flatten()
        assert int(q_lens.max()) <= s_q and int(kv_lens.max()) <= s_kv

        def rows(t: _T, i: int, n: int, heads: int, dim: int) -> torch.Tensor:
            start = int(pack[t.ragged].flatten()[i])
            flat = pack[t].view(-1)
            assert start + (n - 1) * t.stride[2] + (heads - 1) * t.stride[1] + dim <= flat.numel(), t.name
            return flat[start:].as_strided((n, heads, dim), (t.stride[2], t.stride[1], 1))

        for i in range(b):
            n, m = int(kv_lens[i]), int(q_lens[i])
            if m == 0:
                continue
            qs = rows(q_t, i, m, hq, d).float()
            keys, vals = rows(k_t, i, n, hkv, d).float(), rows(v_t, i, n, hkv, d).float()
            g = hq // hkv
            s = torch.einsum("thgd,nhd->thgn", qs.view(m, hkv, g, d), keys) * kw["attn_scale"]
            if kw["use_causal_mask_bottom_right"]:
                pos = torch.arange(n)
                hide = pos[None, :] > (n - m + torch.arange(m))[:, None]
                s = s.masked_fill(hide[:, None, None, :], float("-inf"))
            o = torch.einsum("thgn,nhd->thgd", s.softmax(-1), vals).reshape(m, hq, d)
            if self.stats is not None:  # the natural log of each row's softmax denominator
                rows(self.stats, i, m, hq, 1).copy_(s.logsumexp(-1).reshape(m, hq, 1))
            dst = rows(self.o, i, m, hq, d)
            dst.copy_(o.to(dst.dtype))


def _stand_in_module() -> types.ModuleType:
    mod = types.ModuleType("cudnn")
    mod.backend_version = lambda: 92400  # type: ignore[attr-defined]
    mod.data_type = types.SimpleNamespace(BFLOAT16="bf16", HALF="fp16", FLOAT="fp32", INT32="i32")  # type: ignore[attr-defined]
    mod.heur_mode = types.SimpleNamespace(A="A", FALLBACK="FALLBACK")  # type: ignore[attr-defined]
    mod.pygraph = _Graph  # type: ignore[attr-defined]
    mod.create_handle = lambda: object()  # type: ignore[attr-defined]
    mod.set_stream = lambda handle, stream: None  # type: ignore[attr-defined]
    return mod


@pytest.fixture
def stand_in(monkeypatch: pytest.MonkeyPatch) -> Iterator[type[_Graph]]:
    monkeypatch.setitem(sys.modules, "cudnn", _stand_in_module())
    monkeypatch.setattr(cdp, "refusal", lambda **kw: None)  # CPU tensors: the device check aside
    monkeypatch.setattr(cdp, "_handle", lambda device: None)
    cdp._cudnn.cache_clear()
    for d in (cdp._PLANS, cdp._GRAPHS, cdp._REFUSED):
        d.clear()
    _Graph.made.clear()
    _Graph.executed = 0
    yield _Graph
    cdp._cudnn.cache_clear()
    for d in (cdp._PLANS, cdp._GRAPHS, cdp._REFUSED):
        d.clear()


def _batch(
    q_lens: list[int], prefix: list[int], hq: int, hkv: int, d: int, page: int, hnd: bool
) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(sum(q_lens) + page)
    lens = [a + b for a, b in zip(q_lens, prefix, strict=True)]
    width = max(1, max(-(-n // page) for n in lens)) + 1  # a spare column: lengths below capacity
    nb = len(lens) * width + 2
    shape = (nb, hkv, page, d) if hnd else (nb, page, hkv, d)
    kc, vc = (torch.randn(shape, generator=g).to(torch.bfloat16) for _ in range(2))
    if hnd:
        kc, vc = kc.transpose(1, 2), vc.transpose(1, 2)
    table = torch.randperm(nb, generator=g)[: len(lens) * width].view(len(lens), width).to(I32)
    q = torch.randn(sum(q_lens), hq, d, generator=g).to(torch.bfloat16)
    cu = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=I32)
    return [q, kc, vc, table, torch.tensor(lens, dtype=I32), cu]


def _run(args: list[torch.Tensor], causal: bool = True, lse: torch.Tensor | None = None) -> torch.Tensor:
    q, kc, vc, table, lens, cu = args
    out, e = torch.empty_like(q), torch.empty(0)
    scale = 1 / math.sqrt(q.shape[-1])
    cdp.paged_prefill(
        out, e if lse is None else lse, lse is not None, q, kc, vc, table, lens, cu, e, False, lens, lens,
        False, scale, 0.0, -1, cu, cu, False, True, causal,
    )  # fmt: skip
    return out


def _close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.float(), want.float(), atol=1.6e-2, rtol=1.6e-2)


@pytest.mark.parametrize("hnd", [False, True], ids=["nhd", "hnd"])
def test_runs_match_the_op_plan_once_per_batch_and_share_graphs(stand_in: type[_Graph], hnd: bool) -> None:
    """A ragged batch: a plain prefill, an extend over a prefix, a sequence with no new token, one
    new token over a long prefix."""
    args = _batch([13, 6, 0, 1], [0, 21, 9, 40], 8, 2, 64, 16, hnd)
    _close(_run(args), attention.paged_prefill(*args, backend="torch"))
    assert len(stand_in.made) == 1 and len(cdp._PLANS) == 1
    _run(args)  # the next layer of the same step: no new plan, no new graph
    assert len(stand_in.made) == 1 and len(cdp._PLANS) == 1 and stand_in.executed == 2
    args[4].add_(1)  # the engine's next step, in place (each prefix one longer): planned again
    _close(_run(args), attention.paged_prefill(*args, backend="torch"))
    assert len(cdp._PLANS) == 2 and len(stand_in.made) == 1  # the same shape class: its graph
    _close(_run(args, causal=False), attention.paged_prefill(*args, causal=False, backend="torch"))
    assert len(stand_in.made) == 2 and stand_in.made[-1].sdpa_kw["use_causal_mask_bottom_right"] is False


def test_a_chunk_over_a_long_prefix_is_declined(stand_in: type[_Graph]) -> None:
    """Past GATHER_PER_ROW cached positions a new token, the copy is declined (the paged readers)."""
    args = _batch([4, 3], [2000, 1500], 4, 2, 64, 16, False)
    with pytest.raises(CallRefused, match="the gather would copy more than"):
        _run(args)
    assert not stand_in.made


def test_lse_is_cudnns_statistics_at_the_rows_offsets(stand_in: type[_Graph]) -> None:
    args = _batch([13, 6, 0, 1], [0, 21, 9, 40], 8, 2, 64, 16, False)
    want_lse = torch.empty(args[0].shape[:2])
    want = attention.paged_prefill(*args, lse=want_lse, backend="torch")
    got_lse = torch.full_like(want_lse, float("nan"))
    _close(_run(args, lse=got_lse), want)
    torch.testing.assert_close(got_lse, want_lse, atol=1e-3, rtol=1e-3)
    assert len(stand_in.made) == 1 and stand_in.made[0].sdpa_kw["generate_stats"] is True
    _run(args)  # without lse: its own graph (no statistics)
    assert len(stand_in.made) == 2 and stand_in.made[1].sdpa_kw["generate_stats"] is False


def test_lengths_past_the_capacity_are_clamped_as_the_kernels_clamp(stand_in: type[_Graph]) -> None:
    args = _batch([5, 3], [4, 0], 4, 2, 64, 4, False)
    cap = args[3].shape[1] * 4
    want = attention.paged_prefill(*args[:4], torch.tensor([cap, 3], dtype=I32), args[5], backend="torch")
    args[4] = torch.tensor([1 << 20, 3], dtype=I32)
    _close(_run(args), want)


def test_planning_refuses_what_cudnn_would_read_out_of_bounds(stand_in: type[_Graph]) -> None:
    """Each refusal declines that call only (CallRefused: dispatch keeps the backend)."""
    q, kc, vc, table, lens, cu = _batch([5, 3], [4, 0], 4, 2, 64, 4, False)
    bad_table = table.clone()
    bad_table[1, 0] = kc.shape[0]
    negative = table.clone()
    negative[0, 1] = -1
    cases = [
        ([q, kc, vc, bad_table, lens, cu], r"outside \[0, "),
        ([q, kc, vc, negative, lens, cu], r"outside \[0, "),
        ([q, kc, vc, table, torch.tensor([9, 2], dtype=I32), cu], "more new tokens than its length"),
        ([q, kc, vc, table, lens, torch.tensor([0, 5, 7], dtype=I32)], "query's 8 rows"),
        ([q, kc, vc, table, lens, torch.tensor([0, 9, 8], dtype=I32)], "does not rise"),
    ]
    for args, words in cases:
        with pytest.raises(CallRefused, match=words):
            _run(args)
    assert not stand_in.made  # refused before any graph was built
    # an id past a sequence's used pages is never read: not refused
    unused = table.clone()
    unused[1, -1] = 1 << 30
    _close(
        _run([q, kc, vc, unused, lens, cu]),
        attention.paged_prefill(q, kc, vc, table, lens, cu, backend="torch"),
    )


def test_a_build_cudnn_refuses_is_remembered(stand_in: type[_Graph], monkeypatch: pytest.MonkeyPatch) -> None:
    builds = []

    def refuse(*a: Any, **k: Any) -> None:
        builds.append(1)
        raise RuntimeError("cudnnGraphNotSupportedError: no engine for page size 5")

    monkeypatch.setattr(cdp, "_build", refuse)
    args = _batch([5, 3], [4, 0], 4, 2, 64, 5, False)
    for _ in range(2):
        with pytest.raises(CallRefused, match="no engine for page size 5"):
            _run(args)
        args[4].add_(0)  # a new plan each time (version bumped): the class is declined unbuilt
    assert len(builds) == 1


def test_inference_tensors_plan_every_call(stand_in: type[_Graph]) -> None:
    args = _batch([4, 3], [2, 5], 4, 2, 64, 4, False)
    _run(args)
    ((pinned),) = [p.pinned for p in cdp._PLANS.values()]
    assert [t is a for t, a in zip(pinned, (args[3], args[4], args[5]), strict=True)] == [True] * 3
    with torch.inference_mode():
        inf = [t.clone() for t in args]
        want = attention.paged_prefill(*inf, backend="torch")
        for _ in range(2):
            _close(_run(inf), want)
    assert len(cdp._PLANS) == 1 and len(stand_in.made) == 1  # no plan kept; the class's graph reused


def test_run_length() -> None:
    assert [cdp.run_length(n) for n in (0, 1, 128, 129, 4096, 4097)] == [128, 128, 128, 256, 4096, 8192]
    assert cdp.run_length(5000, 4112) == 4112 and cdp.run_length(3, 64) == 64


def _facts(**kw: Any) -> dict[str, Any]:
    base = dict(device="cuda", dtype="bfloat16", cache_dtype="bfloat16", head_dim=128, value_dim=128,
                layouts=("NHD", "NHD"), dense=True, softcap=False, window=False, sinks=False, lse=False,
                mask=False, capturing=False)  # fmt: skip
    return {**base, **kw}


@pytest.mark.parametrize(
    ("change", "words"),
    [
        ({"device": "cpu"}, "CUDA tensors"),
        ({"dtype": "float32", "cache_dtype": "float32"}, "bf16 / fp16"),
        ({"cache_dtype": "float8_e4m3fn"}, "bf16 / fp16"),
        ({"head_dim": 96, "value_dim": 96}, "head dim 96"),
        ({"value_dim": 64}, "MLA"),
        ({"layouts": ("NHD", "HND")}, "NHD caches or HND views"),
        ({"layouts": (None, None)}, "NHD caches or HND views"),
        ({"dense": False}, "dense query"),
        ({"softcap": True}, "softcap"),
        ({"window": True}, "sliding window"),
        ({"sinks": True}, "sinks"),
        ({"mask": True}, "custom mask"),
        ({"capturing": True}, "CUDA-graph capture"),
    ],
)
def test_refusal_names_the_reason(change: dict[str, Any], words: str) -> None:
    assert cdp.refusal(**_facts()) is None
    why = cdp.refusal(**_facts(**change))
    assert why is not None and words in why


def test_the_predicate_reads_the_public_arguments() -> None:
    q, kc, vc, table, lens, cu = _batch([5, 3], [4, 0], 4, 2, 64, 4, False)
    assert "CUDA tensors" in cdp.supports(q, kc, vc, table, lens, cu)
    assert cdp.supports("not a tensor", kc, vc) is None  # the contract names that problem


def test_release_drops_what_the_backend_keeps(stand_in: type[_Graph]) -> None:
    """What runs at exit: no plan or graph left alive for the frontend's bindings to report."""
    _run(_batch([4, 3], [2, 5], 4, 2, 64, 4, False))
    assert cdp._PLANS and cdp._GRAPHS
    cdp.release()
    assert not cdp._PLANS and not cdp._GRAPHS and not cdp._HANDLES and not cdp._WORKSPACES


def test_an_empty_batch_builds_nothing(stand_in: type[_Graph]) -> None:
    q, kc, vc, table, lens, cu = _batch([3], [2], 4, 2, 64, 4, False)
    empty = [q[:0], kc, vc, table[:0], lens[:0], cu[:1]]
    assert _run(empty).shape == (0, 4, 64)
    assert not stand_in.made and not cdp._PLANS


def test_the_gather_limit_and_a_declined_batch_are_remembered(
    stand_in: type[_Graph], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Up to GATHER_PER_ROW positions a new token (at least MIN_RUN tokens counted) run; one more is
    declined, and the batch's later layers are declined without reading the host again."""
    limit = cdp.GATHER_PER_ROW * cdp.MIN_RUN
    at = _batch([2, 2], [limit // 2 - 2, limit // 2 - 2], 4, 2, 64, 16, False)
    _close(_run(at), attention.paged_prefill(*at, backend="torch"))
    over = _batch([2, 2], [limit // 2 - 2, limit // 2 - 1], 4, 2, 64, 16, False)
    reads = []
    real = cdp.check_batch
    monkeypatch.setattr(cdp, "check_batch", lambda *a: (reads.append(1), real(*a))[1])
    for _ in range(3):
        with pytest.raises(CallRefused, match="the gather would copy more than"):
            _run(over)
    assert len(reads) == 1
    cdp.release()
    assert not cdp._DECLINED


def test_offsets_past_int32_are_declined(stand_in: type[_Graph], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cdp, "OFFSET_LIMIT", 8 * 4 * 64)  # 8 rows of 4 heads x 64
    with pytest.raises(CallRefused, match="offsets past int32"):
        _run(_batch([5, 3], [4, 0], 4, 2, 64, 4, False))
    _run(_batch([4, 3], [0, 0], 4, 2, 64, 4, False))  # 7 rows: under the limit
    assert len(stand_in.made) == 1


def test_a_cache_of_another_size_is_planned_again(stand_in: type[_Graph]) -> None:
    """The plan holds block ids checked against one cache: another cache (another number of
    blocks) under the same index tensors is checked again."""
    q, kc, vc, table, lens, cu = _batch([5, 3], [4, 0], 4, 2, 64, 4, False)
    _run([q, kc, vc, table, lens, cu])
    bad = int(torch.cat([table[0, :3], table[1, :1]]).max())  # the largest id a sequence uses
    with pytest.raises(CallRefused, match=r"outside \[0, "):
        _run([q, kc[:bad], vc[:bad], table, lens, cu])
    assert len(cdp._PLANS) == 1
