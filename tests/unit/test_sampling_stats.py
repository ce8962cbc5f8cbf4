"""The sampling ops' statistics, on every backend that runs here (torch; the native CPU unit, JIT-built;
Triton in its interpreter).

(a) a sampled id never falls outside the filtered set (ties at the k-th value, p exactly at a
cumulative boundary, one dominant token, uniform rows); (b) over many draws the ids follow the
filtered, renormalised distribution (chi-square at significance 1e-3, cosine > 0.99); (c) the
renorm / mask ops equal an independent reference; (d) a seed and offset give the same ids twice,
other offsets other draws. Rows are short on the Triton interpreter (V <= 512); long ones run on
the torch and native backends only. Every draw is seeded, so a pass is reproducible.

``OPMUX_TEST_DEVICE=cuda`` runs the same tests on a GPU (``jit``: the native CUDA unit; Triton
compiled; ``flashinfer`` where installed: its samplers behind opmux's ops, no greedy, float32
rows), the references staying on the CPU.
"""

from __future__ import annotations

import importlib.util
import math
import os
from collections.abc import Callable
from typing import Any

import pytest
import torch

from opmux.kernels.ops import sampling as _sampling

ALPHA = 1e-3
#: where the ops run (the rows are built, and the references computed, on the CPU)
DEVICE = torch.device(os.environ.get("OPMUX_TEST_DEVICE", "cpu"))
#: FlashInfer's samplers where they can run (a GPU, the package installed)
VENDOR = ("flashinfer",) if DEVICE.type == "cuda" and importlib.util.find_spec("flashinfer") else ()
BACKENDS = ("torch", "jit", "triton", *VENDOR)


class _OnDevice:
    """The sampling ops with their tensor arguments on DEVICE and their results back on the CPU
    (on the CPU: the very same tensors, so caller buffers stay the results)."""

    def __getattr__(self, name: str) -> Callable[..., Any]:
        op = getattr(_sampling, name)

        def call(*args: Any, **kwargs: Any) -> Any:
            def there(v: Any) -> Any:
                return v.to(DEVICE) if isinstance(v, torch.Tensor) else v

            got = op(*map(there, args), **{k: there(v) for k, v in kwargs.items()})
            return got.cpu() if isinstance(got, torch.Tensor) else got

        return call


S = _OnDevice()


# -- an independent reference (python loops over sorted rows) ------------------------------------
def _row_keep(row: torch.Tensor, k: int, p: float, joint: bool, min_p: float = 0.0) -> torch.Tensor:
    """The kept mask of one float32 row: top-k (ties at the k-th kept), top-p (the smallest set of
    the largest values holding >= p of the mass, ties at the boundary kept), min-p."""
    v = row.numel()
    vals = sorted(row.tolist(), reverse=True)
    t = -math.inf
    if 0 < k < v:
        t = vals[k - 1]
    if p < 1.0:
        pool = vals if joint else [x for x in vals if x >= t]
        # float32 sums in the sorted order, as the definition's cumsum
        csum = torch.tensor(pool, dtype=torch.float32).cumsum(0)
        need = torch.tensor(p, dtype=torch.float32) * csum[-1]
        m = int((csum < need).sum().clamp(max=len(pool) - 1))
        t = max(t, pool[m])
    keep = row >= t
    if min_p > 0:
        keep &= row >= torch.tensor(min_p, dtype=torch.float32) * row.max()
    return keep


def _keep(
    probs: torch.Tensor, k: int = 0, p: float = 1.0, joint: bool = False, min_p: float = 0.0
) -> torch.Tensor:
    return torch.stack([_row_keep(r, k, p, joint, min_p) for r in probs])


def _renormed(probs: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    q = torch.where(keep, probs, 0.0)
    return q / q.sum(1, keepdim=True)


# -- chi-square -------------------------------------------------------------------------------------
def _gammaincc(a: float, x: float) -> float:
    """The regularised upper incomplete gamma Q(a, x) (series below a + 1, a continued fraction
    above: Numerical Recipes' gser / gcf)."""
    if x <= 0:
        return 1.0
    lg = math.lgamma(a)
    if x < a + 1:
        term = total = 1.0 / a
        n = a
        for _ in range(10_000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * 1e-15:
                break
        return 1.0 - total * math.exp(-x + a * math.log(x) - lg)
    tiny = 1e-300
    b = x + 1 - a
    c = 1 / tiny
    d = 1 / b
    h = d
    for i in range(1, 10_000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1 / d
        delta = d * c
        h *= delta
        if abs(delta - 1) < 1e-15:
            break
    return math.exp(-x + a * math.log(x) - lg) * h


def chi2_sf(stat: float, dof: int) -> float:
    """P(chi2_dof >= stat): scipy's when installed, else the regularised gamma above."""
    try:
        from scipy.stats import chi2
    except ImportError:
        return _gammaincc(dof / 2, stat / 2)
    return float(chi2.sf(stat, dof))


def test_chi2_fallback_matches_known_values() -> None:
    # chi2 quantiles: P(chi2_1 >= 3.841) = 0.05, P(chi2_10 >= 29.588) = 0.001, P(chi2_30 >= 59.703) = 0.001
    for stat, dof, want in (
        (3.841459, 1, 0.05),
        (29.58830, 10, 0.001),
        (59.70306, 30, 0.001),
        (5.0, 10, 0.8911780),
    ):
        assert _gammaincc(dof / 2, stat / 2) == pytest.approx(want, rel=1e-4)


def _assert_follows(ids: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    """``ids`` (N draws) against the distribution ``expected`` [V]: nothing outside its support,
    chi-square p-value >= ALPHA over the support, cosine of the frequencies > 0.99."""
    v = expected.numel()
    counts = torch.bincount(ids.long(), minlength=v).double()
    n = counts.sum()
    support = expected > 0
    assert counts[~support].sum() == 0, (
        f"{what}: draws outside the kept set: {counts[~support].nonzero().tolist()}"
    )
    exp = expected.double()[support] * n
    assert exp.min() >= 5, f"{what}: the test needs >= 5 expected draws per kept token"
    stat = float(((counts[support] - exp) ** 2 / exp).sum())
    dof = int(support.sum()) - 1
    if dof:
        pval = chi2_sf(stat, dof)
        assert pval >= ALPHA, f"{what}: chi-square {stat:.1f} on {dof} dof, p = {pval:.2e}"
    cos = torch.nn.functional.cosine_similarity(counts / n, expected.double(), dim=0)
    assert cos > 0.99, f"{what}: cosine {float(cos):.4f}"


def _dist(v: int, seed: int, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(v, generator=g) * scale, 0)


# -- (a) never outside the mask --------------------------------------------------------------------
def _adversarial(v: int = 32) -> torch.Tensor:
    rows = []
    rows.append(torch.full((v,), 1.0 / v))  # uniform: every value tied
    dom = torch.full((v,), 0.01 / (v - 1))
    dom[7] = 0.99
    rows.append(dom)  # one dominant token
    ties = torch.zeros(v)
    ties[:4] = 0.125  # 4 x 0.125 = 0.5, exactly (dyadic: every partial sum exact)
    ties[4:12] = 0.0625  # 8 x 0.0625 = 0.5: ties straddle k = 5 .. 11 and p = 0.5 .. 1
    rows.append(ties[torch.randperm(v, generator=torch.Generator().manual_seed(1))])
    steps = torch.zeros(v)
    steps[3], steps[10], steps[20], steps[30] = 0.5, 0.25, 0.125, 0.125  # cumulative 0.5, 0.75, 0.875, 1
    rows.append(steps)
    for s in range(4):
        rows.append(_dist(v, 100 + s, 3.0))
    return torch.stack(rows)


MASK_CASES = [
    ("k5", {"top_k": 5}),
    ("k1", {"top_k": 1}),
    ("p0.5-boundary", {"top_p": 0.5}),
    ("p0.75-boundary", {"top_p": 0.75}),
    ("k6-p0.75", {"top_k": 6, "top_p": 0.75}),
    ("k6-p0.75-joint", {"top_k": 6, "top_p": 0.75, "filter_apply_order": "joint"}),
    ("k12-p0.9-joint", {"top_k": 12, "top_p": 0.9, "filter_apply_order": "joint"}),
]


@pytest.mark.parametrize("backend", BACKENDS)
def test_ids_stay_in_the_mask(backend: str) -> None:
    base = _adversarial()
    reps = 24  # each row 24 times: 24 independent draws per launch
    probs = base.repeat_interleave(reps, 0)
    for name, kw in MASK_CASES:
        keep = _keep(base, kw.get("top_k", 0), kw.get("top_p", 1.0), kw.get("filter_apply_order") == "joint")
        keep = keep.repeat_interleave(reps, 0)
        for offset in (0, 1):
            ids = S.top_k_top_p_sampling_from_probs(probs, seed=17, offset=offset, backend=backend, **kw)
            assert ids.dtype == torch.int32 and ids.shape == (probs.shape[0],)
            ok = keep.gather(1, ids.long()[:, None])[:, 0]
            assert ok.all(), f"{name}: rows {(~ok).nonzero()[:, 0].tolist()} drew ids {ids[~ok].tolist()}"
    for min_p in (0.0, 0.5, 1.0):
        keep = _keep(base, min_p=min_p).repeat_interleave(reps, 0)
        ids = S.min_p_sampling_from_probs(probs, min_p=min_p, seed=3, backend=backend)
        assert keep.gather(1, ids.long()[:, None]).all(), f"min_p {min_p}"


@pytest.mark.parametrize("backend", ["torch", "jit"])
def test_ids_stay_in_the_mask_long_rows(backend: str) -> None:
    probs = torch.softmax(torch.randn(4, 30_000, generator=torch.Generator().manual_seed(5)) * 4, -1)
    # top-k first: the native CUDA unit's top-p search and draw over the cluster's kept entries
    # (k 40), and over the slices where they pass its list of 1,024 (a cluster of 4 on an H100 /
    # H200: k 2500 fills no block's list but their union, k 6000 every block's)
    cases = (
        {"top_k": 40},
        {"top_p": 0.3},
        {"top_k": 40, "top_p": 0.5},
        {"top_k": 2500, "top_p": 0.9},
        {"top_k": 6000, "top_p": 0.9},
        {"top_k": 1000, "top_p": 0.5, "filter_apply_order": "joint"},
    )
    for kw in cases:
        keep = _keep(probs, kw.get("top_k", 0), kw.get("top_p", 1.0), kw.get("filter_apply_order") == "joint")
        for offset in range(3):
            ids = S.top_k_top_p_sampling_from_probs(probs, offset=offset, backend=backend, **kw)
            assert keep.gather(1, ids.long()[:, None]).all(), kw


# -- (b) the distribution --------------------------------------------------------------------------
N = 4000
DIST_CASES = [
    ("k8-p0.8", 32, 0, {"top_k": 8, "top_p": 0.8}),
    ("k10-p0.6-joint", 48, 1, {"top_k": 10, "top_p": 0.6, "filter_apply_order": "joint"}),
    ("k5", 16, 2, {"top_k": 5}),
    ("p0.7", 64, 3, {"top_p": 0.7}),
    ("unfiltered", 24, 4, {}),
]


def _expected(dist: torch.Tensor, kw: dict[str, object]) -> torch.Tensor:
    keep = _keep(
        dist[None], kw.get("top_k", 0), kw.get("top_p", 1.0), kw.get("filter_apply_order") == "joint"
    )  # type: ignore[arg-type]
    return _renormed(dist[None], keep)[0]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(("name", "v", "seed", "kw"), DIST_CASES, ids=[c[0] for c in DIST_CASES])
def test_draws_follow_the_renormalised_probs(
    backend: str, name: str, v: int, seed: int, kw: dict[str, object]
) -> None:
    dist = _dist(v, seed)
    probs = dist.expand(N, v).contiguous()  # N rows: N independent draws (a stream per row)
    ids = S.top_k_top_p_sampling_from_probs(probs, seed=1000 + seed, offset=seed, backend=backend, **kw)  # type: ignore[arg-type]
    _assert_follows(ids, _expected(dist, kw), f"{backend} {name}")


@pytest.mark.parametrize("backend", BACKENDS)
def test_draws_over_offsets_follow_the_renormalised_probs(backend: str) -> None:
    """One row, many steps: the draws of successive offsets (a decode loop) follow the row too."""
    dist = _dist(20, 9)
    kw: dict[str, object] = {"top_k": 12, "top_p": 0.9}
    probs = dist.expand(100, 20).contiguous()
    offset = torch.zeros(1, dtype=torch.int64)
    seed = torch.tensor([77], dtype=torch.int64)
    draws = []
    for _ in range(20):  # 20 steps x 100 rows; the offset tensor bumped in place (a graph's replay)
        draws.append(
            S.top_k_top_p_sampling_from_probs(
                probs,
                seed_tensor=seed,
                offset_tensor=offset,
                backend=backend,
                **kw,  # type: ignore[arg-type]
            )
        )
        offset += 1
    _assert_follows(torch.cat(draws), _expected(dist, kw), f"{backend} offsets")


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_row_parameters(backend: str) -> None:
    """Tensors of k / p per row: each block of rows follows its own filtered distribution."""
    v, n = 24, 2000
    dist = _dist(v, 21)
    probs = dist.expand(2 * n, v).contiguous()
    k = torch.tensor([4] * n + [0] * n, dtype=torch.int32)
    p = torch.tensor([1.0] * n + [0.7] * n)
    ids = S.top_k_top_p_sampling_from_probs(probs, top_k_arr=k, top_p_arr=p, seed=5, backend=backend)
    _assert_follows(ids[:n], _expected(dist, {"top_k": 4}), f"{backend} k=4 rows")
    _assert_follows(ids[n:], _expected(dist, {"top_p": 0.7}), f"{backend} p=0.7 rows")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("min_p", [0.0, 0.2])
def test_min_p_draws(backend: str, min_p: float) -> None:
    v = 40
    dist = _dist(v, 31, 0.8)
    probs = dist.expand(N, v).contiguous()
    ids = S.min_p_sampling_from_probs(probs, min_p=min_p, seed=8, offset=1, backend=backend)
    _assert_follows(ids, _renormed(dist[None], _keep(dist[None], min_p=min_p))[0], f"{backend} min_p {min_p}")


# -- (c) renorm / mask against the reference -------------------------------------------------------
def _shapes(backend: str) -> list[tuple[int, int]]:
    return [(33, 64), (5, 500)] + ([(4, 20_000)] if backend != "triton" else [])


@pytest.mark.parametrize("backend", BACKENDS)
def test_renorm_and_mask_equal_the_reference(backend: str) -> None:
    g = torch.Generator().manual_seed(3)
    for b, v in _shapes(backend):
        probs = torch.softmax(torch.randn(b, v, generator=g) * 3, -1)
        for k in (1, 7, v // 3, v):
            want = _renormed(probs, _keep(probs, k)) if k < v else probs
            got = S.top_k_renorm_probs(probs, top_k=k, backend=backend)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6, msg=lambda m, k=k: f"k={k}: {m}")
        for p in (0.05, 0.5, 0.95):
            want = _renormed(probs, _keep(probs, p=p, joint=True))
            got = S.top_p_renorm_probs(probs, top_p=p, backend=backend)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6, msg=lambda m, p=p: f"p={p}: {m}")
        for dt in (torch.float32,) if backend in VENDOR else (torch.float32, torch.bfloat16):
            logits = (torch.randn(b, v, generator=g) * 4).to(dt)
            keep = _keep(logits.float(), 9)
            want = torch.where(keep, logits, torch.tensor(-torch.inf, dtype=dt))
            torch.testing.assert_close(
                S.top_k_mask_logits(logits, top_k=9, backend=backend), want, atol=0, rtol=0
            )
            if backend in VENDOR:
                continue  # no greedy there
            torch.testing.assert_close(
                S.greedy(logits, backend=backend), logits.float().argmax(1).int(), atol=0, rtol=0
            )


@pytest.mark.parametrize("backend", BACKENDS)
def test_renorm_ties_and_boundaries(backend: str) -> None:
    base = _adversarial()
    for k in (1, 4, 5, 8, 12):
        want = _renormed(base, _keep(base, k))
        torch.testing.assert_close(
            S.top_k_renorm_probs(base, top_k=k, backend=backend), want, atol=1e-6, rtol=1e-6
        )
    for p in (0.5, 0.75, 0.875, 0.3):
        want = _renormed(base, _keep(base, p=p, joint=True))
        torch.testing.assert_close(
            S.top_p_renorm_probs(base, top_p=p, backend=backend), want, atol=1e-6, rtol=1e-6
        )
    # ties at the k-th value are all kept: the uniform row keeps everything for every k
    assert (S.top_k_renorm_probs(base[:1], top_k=3, backend=backend) > 0).all()


#: Qwen's vocabulary: on a GPU a few such rows take a cluster of 8 blocks each (a slice per block)
LONG_V = 151_936


def _mid_p(probs: torch.Tensor, p: float) -> torch.Tensor:
    """Per row, a top-p near ``p`` halfway between two cumulative masses (largest first, in
    float64) that are at least 4e-4 apart (the boundary moved toward the larger values until the
    step is that wide): far beyond any float32 summation order's error (~1e-5 over 151,936
    entries), so every backend keeps the same set."""
    vals = probs.double().sort(1, descending=True).values
    cs = vals.cumsum(1) / vals.sum(1, keepdim=True)
    out = []
    for r in range(probs.shape[0]):
        m = int(
            torch.searchsorted(cs[r], torch.tensor([p], dtype=torch.float64))[0].clamp(1, cs.shape[1] - 1)
        )
        while m > 1 and float(cs[r, m] - cs[r, m - 1]) < 4e-4:
            m -= 1
        out.append(float((cs[r, m - 1] + cs[r, m]) / 2))
    return torch.tensor(out)


def _spread_row(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A long row whose mass sits on 16 tokens spread over the whole row (so over every block's
    slice of a cluster), the rest tiny; and those 16 positions."""
    g = torch.Generator().manual_seed(seed)
    heavy = torch.arange(16) * (LONG_V // 16) + torch.randint(0, LONG_V // 16, (16,), generator=g)
    row = torch.full((LONG_V,), 1e-9)
    row[heavy] = torch.rand(16, generator=g) + 0.2
    return row / row.sum(), heavy


@pytest.mark.parametrize("backend", ["torch", "jit"])
def test_long_rows_few_rows(backend: str) -> None:
    """Few rows of a 151,936-token vocabulary (the native CUDA unit splits each over a cluster of
    blocks): renorm and mask equal the reference, greedy takes the first of two tied maxima in far
    apart slices, sampled ids stay in the mask."""
    g = torch.Generator().manual_seed(12)
    for rows in (1, 3):
        probs = torch.softmax(torch.randn(rows, LONG_V, generator=g) * 3, -1)
        for k in (50, 5000):
            want = _renormed(probs, _keep(probs, k))
            torch.testing.assert_close(
                S.top_k_renorm_probs(probs, top_k=k, backend=backend), want, atol=1e-6, rtol=1e-6
            )
        for p in (0.3, 0.9):
            # p well inside a step of each row's cumulative mass: the kept set is the same
            # whatever order a backend sums in (the exact-boundary cases are the dyadic rows')
            p_rows = _mid_p(probs, p)
            want = torch.stack(
                [
                    _renormed(r[None], _keep(r[None], p=float(q), joint=True))[0]
                    for r, q in zip(probs, p_rows, strict=True)
                ]
            )
            got = S.top_p_renorm_probs(probs, top_p_arr=p_rows, backend=backend)
            torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
        for dt in (torch.float32, torch.bfloat16):
            logits = (torch.randn(rows, LONG_V, generator=g) * 4).to(dt)
            logits[:, 100_000] = logits[:, 7] = 50.0  # tied maxima, slices apart: the first wins
            want = torch.where(_keep(logits.float(), 40), logits, torch.tensor(-torch.inf, dtype=dt))
            torch.testing.assert_close(
                S.top_k_mask_logits(logits, top_k=40, backend=backend), want, atol=0, rtol=0
            )
            assert S.greedy(logits, backend=backend).tolist() == [7] * rows
        kw = {"top_k": 1000, "top_p": 0.8}
        keep = _keep(probs, 1000, 0.8)
        for offset in range(4):
            ids = S.top_k_top_p_sampling_from_probs(probs, seed=4, offset=offset, backend=backend, **kw)
            assert keep.gather(1, ids.long()[:, None]).all(), offset
        keep = _keep(probs, min_p=0.1)
        ids = S.min_p_sampling_from_probs(probs, min_p=0.1, seed=4, backend=backend)
        assert keep.gather(1, ids.long()[:, None]).all()


def _top_k_first_keep(probs: torch.Tensor, k: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    """The kept mask of top-k then top-p, vectorised (k: int per row, 0 off; p: float per row, 1
    off): _row_keep's rule over many long rows (p chosen inside a step of the cumulative mass)."""
    vals = probs.sort(1, descending=True).values
    kk = torch.where(k > 0, k, probs.shape[1]).long()
    t_k = vals.gather(1, (kk - 1)[:, None])
    pool = torch.where(vals >= t_k, vals, 0.0)
    csum = pool.double().cumsum(1)
    need = p.double()[:, None] * csum[:, -1:]
    m = (csum < need).sum(1, keepdim=True).clamp(max=probs.shape[1] - 1)
    t = torch.maximum(t_k, vals.gather(1, m))
    return probs >= torch.where(p[:, None] < 1.0, t, t_k)


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the native CUDA unit's clusters")
def test_clustered_kept_union_small() -> None:
    """Two rows over clusters of blocks (20,000 entries: 4 a row on an H100 / H200), the top-k-first
    draw over the cluster's kept entries exchanged through distributed shared memory, and over its
    slices past the list: small enough for compute-sanitizer's racecheck (h200_run.sh sampling)."""
    probs = torch.softmax(torch.randn(2, 20_000, generator=torch.Generator().manual_seed(8)) * 3, -1)
    for k in (40, 3000):
        keep = _keep(probs, k, 0.9)
        ids = S.top_k_top_p_sampling_from_probs(probs, top_k=k, top_p=0.9, seed=3, offset=1, backend="jit")
        assert keep.gather(1, ids.long()[:, None]).all(), k


@pytest.mark.skipif(DEVICE.type != "cuda", reason="the native CUDA unit's launch over rows past the L2 cache")
def test_many_long_rows_past_l2() -> None:
    """160 rows of 151,936 float32 entries (97 MB, past an H100's or H200's L2): the native unit
    caches each block's slice over several waves of clusters; renorm and mask equal the
    reference, draws stay in the mask."""
    g = torch.Generator().manual_seed(21)
    rows = 160
    probs = torch.softmax(torch.randn(rows, LONG_V, generator=g) * 3, -1)
    k = torch.randint(1, 300, (rows,), generator=g, dtype=torch.int32)
    k[::7] = 0
    off = torch.ones(rows)
    keep = _top_k_first_keep(probs, k, off)
    got = S.top_k_renorm_probs(probs, top_k_arr=k, backend="jit")
    want = torch.where(k[:, None] > 0, _renormed(probs, keep), probs)  # k = 0: the row unchanged
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    p = _mid_p(probs, 0.9)
    keep = _top_k_first_keep(probs, torch.zeros(rows, dtype=torch.int32), p)
    got = S.top_p_renorm_probs(probs, top_p_arr=p, backend="jit")
    torch.testing.assert_close(got, _renormed(probs, keep), atol=1e-6, rtol=1e-6)
    logits = torch.randn(rows, LONG_V, generator=g) * 4
    keep = _top_k_first_keep(logits, k, off)
    want = torch.where(keep, logits, -torch.inf)
    torch.testing.assert_close(S.top_k_mask_logits(logits, top_k_arr=k, backend="jit"), want, atol=0, rtol=0)
    kept = _top_k_first_keep(probs, k, p)
    for offset in range(3):
        ids = S.top_k_top_p_sampling_from_probs(
            probs, top_k_arr=k, top_p_arr=p, seed=5, offset=offset, backend="jit"
        )
        assert kept.gather(1, ids.long()[:, None]).all(), offset


def test_long_row_draws_follow_the_renormalised_probs() -> None:
    """8 long rows (a cluster of 8 blocks each on a GPU) over 500 offsets: the draws land on the 16
    heavy tokens in their renormalised proportions, whichever slice holds the crossing."""
    row, heavy = _spread_row(41)
    probs = row.expand(8, LONG_V).contiguous()
    draws = []
    offset = torch.zeros(1, dtype=torch.int64)
    for _ in range(500):
        draws.append(
            S.top_k_top_p_sampling_from_probs(probs, top_k=16, seed=9, offset_tensor=offset, backend="jit")
        )
        offset += 1
    ids = torch.cat(draws).long()
    assert torch.isin(ids, heavy).all(), "a draw outside the 16 kept tokens"
    local = (ids[:, None] == heavy[None, :]).int().argmax(1)
    _assert_follows(local.int(), row[heavy] / row[heavy].sum(), "jit long rows")


# -- (d) determinism -------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_same_seed_offset_same_ids_other_offsets_other_draws(backend: str) -> None:
    probs = torch.full((64, 64), 1 / 64)
    draw = S.top_k_top_p_sampling_from_probs
    a = draw(probs, seed=123, offset=10, backend=backend)
    b = draw(probs, seed=123, offset=10, backend=backend)
    assert torch.equal(a, b)
    c = draw(probs, seed=123, offset=11, backend=backend)
    d = draw(probs, seed=124, offset=10, backend=backend)
    assert not torch.equal(a, c) and not torch.equal(a, d)
    # tensors read on the device give the ints' draws; bumping the offset tensor in place draws anew
    seed = torch.tensor([123], dtype=torch.int64)
    offset = torch.tensor([10], dtype=torch.int64)
    assert torch.equal(draw(probs, seed_tensor=seed, offset_tensor=offset, backend=backend), a)
    offset += 1
    assert torch.equal(draw(probs, seed_tensor=seed, offset_tensor=offset, backend=backend), c)
    big = draw(probs, seed=2**62 + 5, offset=2**40, backend=backend)  # 64-bit seeds and offsets
    assert torch.equal(big, draw(probs, seed=2**62 + 5, offset=2**40, backend=backend))
    m1 = S.min_p_sampling_from_probs(probs, min_p=0.0, seed=9, offset=1, backend=backend)
    assert torch.equal(m1, S.min_p_sampling_from_probs(probs, min_p=0.0, seed=9, offset=1, backend=backend))
    assert not torch.equal(
        m1, S.min_p_sampling_from_probs(probs, min_p=0.0, seed=9, offset=2, backend=backend)
    )


# -- contents and buffers --------------------------------------------------------------------------
def test_nan_rows_and_out_of_range_parameters_are_refused_on_cpu() -> None:
    S = _sampling  # the CPU's checks (on CUDA the contents are not read: a synchronisation)
    probs = torch.full((3, 8), 1 / 8)
    probs[1, 2] = torch.nan
    with pytest.raises(ValueError, match="probs row 1 holds NaN"):
        S.top_k_top_p_sampling_from_probs(probs, top_k=2)
    with pytest.raises(ValueError, match="logits row 1 holds NaN"):
        S.greedy(probs)
    with pytest.raises(ValueError, match="NaN"):
        S.top_k_mask_logits(probs, top_k=2)
    ok = torch.full((3, 8), 1 / 8)
    with pytest.raises(ValueError, match=r"top_k_arr\[2\] = 9 is out of range"):
        S.top_k_renorm_probs(ok, top_k_arr=torch.tensor([1, 2, 9], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"top_p_arr\[0\] = 0.0 is out of range"):
        S.top_p_renorm_probs(ok, top_p_arr=torch.tensor([0.0, 0.5, 1.0]))
    with pytest.raises(ValueError, match=r"min_p_arr\[1\]"):
        S.min_p_sampling_from_probs(ok, min_p_arr=torch.tensor([0.0, 1.5, 1.0]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_caller_id_buffers(backend: str) -> None:
    S = _sampling  # the buffers on DEVICE themselves
    probs = torch.zeros(3, 10, device=DEVICE)
    probs[0, 4] = probs[1, 9] = probs[2, 0] = 1.0
    out = torch.full((3,), -7, dtype=torch.int32, device=DEVICE)
    got = S.top_k_top_p_sampling_from_probs(probs, top_k=3, out=out, backend=backend)
    assert got is out and out.tolist() == [4, 9, 0]
    out.fill_(-7)
    assert S.min_p_sampling_from_probs(probs, out=out, backend=backend).tolist() == [4, 9, 0]
    out.fill_(-7)
    if backend not in VENDOR:  # no greedy there
        assert S.greedy(probs, out=out, backend=backend).tolist() == [4, 9, 0]


@pytest.mark.skipif(DEVICE.type != "cpu", reason="the interpreter's packed rows against one row a program")
def test_one_row_per_program_gives_the_packed_result(monkeypatch: pytest.MonkeyPatch) -> None:
    """The GPU's layout (one row per program: a row fills the tile) computes what the packed one does."""
    from opmux.kernels.ops.sampling import triton_kernels as tk

    probs = torch.softmax(torch.randn(3, 200, generator=torch.Generator().manual_seed(2)) * 3, -1)
    logits = torch.randn(3, 200, generator=torch.Generator().manual_seed(3))
    calls = [
        lambda: S.top_k_renorm_probs(probs, top_k=9, backend="triton"),
        lambda: S.top_p_renorm_probs(probs, top_p=0.6, backend="triton"),
        lambda: S.top_k_mask_logits(logits, top_k=9, backend="triton"),
        lambda: S.greedy(logits, backend="triton"),
        lambda: S.top_k_top_p_sampling_from_probs(probs, top_k=20, top_p=0.9, seed=4, backend="triton"),
        lambda: S.min_p_sampling_from_probs(probs, min_p=0.1, seed=4, backend="triton"),
    ]
    packed = [f() for f in calls]
    assert tk._tiles(probs)[1] > 1
    monkeypatch.setattr(tk, "TILE", 64)
    assert tk._tiles(probs)[1] == 1
    for f, want in zip(calls, packed, strict=True):
        torch.testing.assert_close(f(), want, atol=0, rtol=0)
