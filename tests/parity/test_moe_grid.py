"""moe.fused_experts on a GPU at serving sizes: every backend that runs on the device against the
op's definition, M (tokens) from 1 to 16,384, bf16 / fp16 weights and fp8 block-scaled ones,
expert_map, empty experts, the three activations; vLLM's tolerances (atol 2e-2 on outputs of
order 1; fp8 blocks: mean |out - ref| / mean |ref| < 0.035, as its block-fp8 MoE test). And ids
that no expert explains (past E, negative, mapped past E): on CUDA the routing skips them (no sync
to check them), so the call must write the definition's result without those terms and touch no
memory out of bounds (``compute-sanitizer`` runs these cases, ``benchmarks/h200_run.sh``'s
sanitize stage). On the CPU the small parity samples run instead (the interpreter would take
hours here)."""

from __future__ import annotations

import pytest
import torch

from opmux.kernels import registry
from opmux.kernels.explain import op_instance
from opmux.kernels.ops.moe._experts import reference

OP = "moe.fused_experts"
#: (M, E, N, K, topk, form, activation)
GRID = (
    (1, 8, 1024, 512, 2, "bf16", "silu"),
    (7, 64, 256, 384, 6, "bf16", "gelu"),
    (33, 8, 512, 1024, 2, "fp16", "silu"),
    (222, 16, 320, 512, 4, "bf16", "swigluoai"),
    (1024, 64, 768, 2048, 8, "bf16", "silu"),
    (4096, 8, 1024, 1024, 2, "bf16", "silu"),
    (16384, 16, 256, 512, 2, "bf16", "silu"),
    (1, 32, 512, 1024, 8, "fp8", "silu"),
    (83, 16, 384, 896, 4, "fp8", "silu"),
    (1024, 32, 768, 1024, 8, "fp8", "silu"),
    (4096, 8, 200, 1000, 2, "fp8", "silu"),
)


def _case(m: int, e: int, n: int, k: int, topk: int, form: str, seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator(device="cuda").manual_seed(seed)
    dt = torch.float16 if form == "fp16" else torch.bfloat16
    hidden = torch.randn(m, k, device="cuda", generator=g).to(dt)
    w1 = torch.randn(e, 2 * n, k, device="cuda", generator=g) * k**-0.5
    w2 = torch.randn(e, k, n, device="cuda", generator=g) * n**-0.5
    logits = torch.randn(m, e, device="cuda", generator=g)
    tw, ti = torch.topk(torch.softmax(logits, -1), topk, -1)
    case = {"hidden": hidden, "topk_weights": tw.contiguous(), "topk_ids": ti.to(torch.int32).contiguous()}
    if form != "fp8":
        case |= {"w1": w1.to(dt), "w2": w2.to(dt)}
        return case
    for name, w in (("w1", w1), ("w2", w2)):
        r, c = w.shape[1:]
        p = torch.nn.functional.pad(w, (0, -c % 128, 0, -r % 128))
        blocks = p.view(e, p.shape[1] // 128, 128, p.shape[2] // 128, 128)
        scale = blocks.abs().amax(dim=(2, 4)).clamp_min(1e-8) / 448.0
        q = (blocks / scale[:, :, None, :, None]).view(p.shape)[:, :r, :c]
        case[name], case[name + "_scale"] = q.to(torch.float8_e4m3fn), scale.contiguous()
    return case


def _args(c: dict[str, torch.Tensor]) -> tuple[tuple[torch.Tensor, ...], dict[str, torch.Tensor]]:
    args = (c["hidden"], c["w1"], c["w2"], c["topk_weights"], c["topk_ids"])
    kw = {k: c[k] for k in ("w1_scale", "w2_scale") if k in c}
    return args, kw


def _check(got: torch.Tensor, want: torch.Tensor, fp8: bool, what: str) -> None:
    if fp8:
        err = float((got.float() - want.float()).abs().mean() / want.float().abs().mean())
        assert err < 0.035, f"{what}: mean relative error {err:.3g}"
    else:
        torch.testing.assert_close(
            got.float(), want.float(), atol=2e-2, rtol=2e-2, msg=lambda m: f"{what}: {m}"
        )


def _backends() -> list[str]:
    return ["default", *[b.name for b in registry.get(OP).backends if "cuda" in b.requires.devices]]


def _takes(backend: str, args: tuple[torch.Tensor, ...], kw: dict[str, torch.Tensor]) -> bool:
    """Whether a forced backend takes this call: the CUTLASS one runs the fp8 form with whole
    128-blocks only, the native CUDA one decode sizes with 16-byte rows (their predicates say why
    not; dispatch then runs the next backend)."""
    if backend == "cutlass":
        from opmux.kernels.ops.moe.fused_experts_cutlass import supports

        return supports(*args[:3], **kw) is None
    if backend == "cuda":
        from opmux.kernels.ops.moe.fused_experts_cuda import supports as takes

        return takes(*args) is None
    return True


@pytest.mark.parametrize("backend", _backends())
def test_serving_grid(backend: str, device_type: str) -> None:
    if device_type == "cpu":
        pytest.skip("the serving grid runs on a GPU (the CPU runs the op's small parity samples)")
    op = op_instance(OP)
    fn = op if backend == "default" else op.impl(backend)
    ran = 0
    for i, (m, e, n, k, topk, form, act) in enumerate(GRID):
        if backend == "torch" and m > 1024:
            continue  # the per-expert loop at 16k tokens proves nothing more
        c = _case(m, e, n, k, topk, form, i)
        args, kw = _args(c)
        if not _takes(backend, args, kw):
            continue
        ran += 1
        got = fn(*args, activation=act, **kw)
        rows = slice(0, min(m, 2048))  # the definition's loop on the first rows
        want = reference(*(a[rows] if a.shape[0] == m else a for a in args), activation=act, **kw)
        _check(got[rows], want, form == "fp8", f"{backend} M={m} E={e} N={n} K={k} {form} {act}")
    assert ran >= 3, f"{backend} took {ran} of the grid's cases"


@pytest.mark.parametrize("backend", _backends())
def test_expert_map_and_empty_experts(backend: str, device_type: str) -> None:
    if device_type == "cpu":
        pytest.skip("a GPU case (the CPU runs the op's parity samples with an expert_map)")
    op = op_instance(OP)
    fn = op if backend == "default" else op.impl(backend)
    form = "fp8" if backend == "cutlass" else "bf16"
    m = 48 if backend == "cuda" else 300  # the native CUDA backend takes decode sizes
    c = _case(m, 8, 256, 512, 2, form, 7)
    ids = torch.randint(0, 16, (m, 2), device="cuda", dtype=torch.int32)
    ids[:40] = 3  # global 3 is on another rank: those tokens' outputs are 0
    emap = torch.tensor(
        [0, 1, -1, -1, 2, 3, 4, -1, 5, 6, 7, -1, -1, -1, -1, -1], device="cuda", dtype=torch.int32
    )
    args = (c["hidden"], c["w1"], c["w2"], c["topk_weights"], ids)
    kw = _args(c)[1]
    got = fn(*args, expert_map=emap, **kw)
    _check(got, reference(*args, expert_map=emap, **kw), form == "fp8", f"{backend} expert_map")
    assert bool((got[:40] == 0).all())


@pytest.mark.parametrize("backend", _backends())
def test_ids_outside_the_experts_touch_nothing(backend: str, device_type: str) -> None:
    """CUDA skips ids no expert explains (a check would synchronise): the result is the
    definition's over the valid slots, and nothing is read or written out of bounds."""
    if device_type == "cpu":
        pytest.skip("on the CPU such ids raise ValueError (the parity harness's invalid cases)")
    if backend == "torch":
        pytest.skip("the torch loop indexes by expert and never sees such ids")
    op = op_instance(OP)
    fn = op if backend == "default" else op.impl(backend)
    form = "fp8" if backend == "cutlass" else "bf16"
    c = _case(64, 8, 256, 512, 2, form, 11)
    kw = _args(c)[1]
    ids = c["topk_ids"].clone()
    ids[3, 1], ids[10, 0], ids[20, 1] = 8, -1, 1 << 30
    args = (c["hidden"], c["w1"], c["w2"], c["topk_weights"], ids)
    got = fn(*args, **kw)
    torch.cuda.synchronize()
    valid = (ids >= 0) & (ids < 8)
    want = reference(c["hidden"], c["w1"], c["w2"], c["topk_weights"] * valid, ids.clamp(0, 7), **kw)
    _check(got, want, form == "fp8", f"{backend} bad ids")
    emap = torch.tensor([0, 1, 2, 3, 4, 5, 6, 99], device="cuda", dtype=torch.int32)  # 99: past E
    got = fn(c["hidden"], c["w1"], c["w2"], c["topk_weights"], c["topk_ids"], expert_map=emap, **kw)
    torch.cuda.synchronize()
    assert bool(got.isfinite().all())


#: the Triton backend's decode path (``DECODE: 1``: a program per slot) with explicit configs,
#: whatever the tables pick: (M, E, N, K, topk, form, up rows, down rows, K step)
DECODE_GRID = (
    (1, 8, 1024, 512, 2, "bf16", 16, 8, 256),
    (1, 128, 768, 2048, 8, "bf16", 8, 4, 512),
    (3, 16, 200, 1000, 4, "fp16", 32, 16, 128),
    (1, 32, 512, 1024, 8, "fp8", 16, 8, 128),
    (4, 16, 200, 1000, 4, "fp8", 16, 8, 128),
    (1, 16, 2048, 7168, 8, "fp8", 64, 2, 256),
    (2, 8, 384, 640, 1, "fp8", 32, 4, 512),
    (8, 16, 256, 512, 8, "fp8", 16, 16, 128),
)


def _decode(out: torch.Tensor, c: dict[str, torch.Tensor], config: dict[str, int], **kw: object) -> None:
    from opmux.kernels.ops.moe.fused_experts_triton import launch_fused_experts

    empty = torch.empty(0, device="cuda")
    emap = kw.get("expert_map", torch.empty(0, device="cuda", dtype=torch.int32))
    launch_fused_experts(
        out, c["hidden"], c["w1"], c["w2"], c["topk_weights"], kw.get("ids", c["topk_ids"]),
        c.get("w1_scale", empty), c.get("w2_scale", empty), emap, "silu", False, config,
    )  # fmt: skip


def test_decode_path_grid(device_type: str) -> None:
    if device_type == "cpu":
        pytest.skip("a GPU case (tests/unit/test_fused_experts_triton.py runs the decode path on the CPU)")
    for i, (m, e, n, k, topk, form, up, down, bk) in enumerate(DECODE_GRID):
        c = _case(m, e, n, k, topk, form, 100 + i)
        config = {"DECODE": 1, "BLOCK_SIZE_M": down, "BLOCK_SIZE_N": up, "BLOCK_SIZE_K": bk}
        config |= {"GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}
        out = torch.full((m, k), float("nan"), device="cuda", dtype=c["hidden"].dtype)
        _decode(out, c, config)
        args, kw = _args(c)
        _check(out, reference(*args, **kw), form == "fp8", f"decode M={m} E={e} N={n} K={k} {form}")


@pytest.mark.parametrize("form", ["bf16", "fp8"])
def test_decode_path_bad_ids(form: str, device_type: str) -> None:
    # ids past E, negative and huge, and an expert_map entry past E: those slots add nothing and
    # nothing is read through them (the fp8 kernels gather each tile row's expert on their own)
    if device_type == "cpu":
        pytest.skip("a GPU case (tests/unit/test_fused_experts_triton.py runs the decode path on the CPU)")
    c = _case(2, 8, 256, 512, 4, form, 120)
    ids = c["topk_ids"].clone()
    ids[0, 1], ids[1, 0], ids[1, 3] = 8, -1, 1 << 30
    config = {"DECODE": 1, "BLOCK_SIZE_M": 8, "BLOCK_SIZE_N": 16, "BLOCK_SIZE_K": 256}
    config |= {"GROUP_SIZE_M": 1, "num_warps": 4, "num_stages": 3}
    out = torch.empty((2, 512), device="cuda", dtype=torch.bfloat16)
    _decode(out, c, config, ids=ids)
    torch.cuda.synchronize()
    valid = (ids >= 0) & (ids < 8)
    args, kw = _args(c)
    want = reference(args[0], args[1], args[2], c["topk_weights"] * valid, ids.clamp(0, 7), **kw)
    _check(out, want, form == "fp8", f"decode bad ids {form}")
    emap = torch.tensor([0, 1, 2, 3, 4, 5, 6, 99], device="cuda", dtype=torch.int32)  # 99: past E
    _decode(out, c, config, expert_map=emap)
    torch.cuda.synchronize()
    assert bool(out.isfinite().all())


#: the native CUDA backend's decode kernels with each columns-per-warp choice (up, down; 0: the
#: unit's own) over the decode grid's shapes it takes, the three activations, the router weight
#: on the input and vLLM's rounding
CUDA_SPLITS = ((0, 0), (1, 1), (2, 2), (4, 4), (4, 8))


def _cuda_decode(out: torch.Tensor, c: dict[str, torch.Tensor], split: tuple[int, int], **kw: object) -> None:
    from opmux.kernels.ops.moe.fused_experts_cuda import launch

    empty = torch.empty(0, device="cuda")
    emap = kw.pop("expert_map", torch.empty(0, device="cuda", dtype=torch.int32))
    ids = kw.pop("ids", c["topk_ids"])
    act = str(kw.pop("activation", "silu"))
    on_input = bool(kw.pop("apply_router_weight_on_input", False))
    launch(
        out, c["hidden"], c["w1"], c["w2"], c["topk_weights"], ids, c.get("w1_scale", empty),
        c.get("w2_scale", empty), emap, act, on_input, rows_per_warp=split, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


def _fp8_spread_scales(m: int, e: int, n: int, k: int, topk: int, seed: int) -> dict[str, torch.Tensor]:
    """An fp8 case whose block scales are powers of two from 2^-14 to 2^-5 (each block its own)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    case = {"hidden": torch.randn(m, k, device="cuda", generator=g).to(torch.bfloat16)}
    for name, (r, cols) in (("w1", (2 * n, k)), ("w2", (k, n))):
        q = (torch.randn(e, r, cols, device="cuda", generator=g) * 64).clamp(-448, 448)
        blocks = (e, -(-r // 128), -(-cols // 128))
        scale = torch.exp2(torch.randint(-14, -4, blocks, device="cuda", generator=g).float())
        case[name], case[name + "_scale"] = q.to(torch.float8_e4m3fn), scale
    logits = torch.randn(m, e, device="cuda", generator=g)
    tw, ti = torch.topk(torch.softmax(logits, -1), topk, -1)
    return case | {"topk_weights": tw.contiguous(), "topk_ids": ti.to(torch.int32).contiguous()}


def test_cuda_decode_grid(device_type: str) -> None:
    if device_type == "cpu":
        pytest.skip(
            "a GPU case (tests/unit/test_fused_experts_cuda.py checks the backend's rules on the CPU)"
        )
    from opmux.kernels.ops.moe.fused_experts_cuda import supports

    ran = 0
    for i, (m, e, n, k, topk, form, *_) in enumerate(DECODE_GRID):
        c = _case(m, e, n, k, topk, form, 200 + i)
        args, kw = _args(c)
        if supports(*args) is not None:
            continue
        want = reference(*args, **kw)
        for split in CUDA_SPLITS:
            out = torch.full((m, k), float("nan"), device="cuda", dtype=c["hidden"].dtype)
            _cuda_decode(out, c, split)
            _check(out, want, form == "fp8", f"cuda decode {split} M={m} E={e} N={n} K={k} {form}")
            ran += 1
    assert ran >= 4 * len(CUDA_SPLITS), ran
    # fp8 with partial 128-groups (K, N multiples of 16, not of 128) and block scales spread over
    # ten octaves, so a scale read from the wrong block or group cannot hide
    for i, (m, e, n, k, topk) in enumerate(((2, 8, 80, 208, 4), (5, 16, 144, 400, 2))):
        c = _fp8_spread_scales(m, e, n, k, topk, 260 + i)
        args, kw = _args(c)
        assert supports(*args) is None
        want = reference(*args, **kw)
        for split in ((0, 0), (1, 8), (4, 2)):
            out = torch.full((m, k), float("nan"), device="cuda", dtype=torch.bfloat16)
            _cuda_decode(out, c, split)
            _check(out, want, True, f"cuda decode fp8 spread scales {split} M={m} N={n} K={k}")
    for form in ("bf16", "fp8"):
        for act in ("gelu", "swigluoai"):
            c = _case(3, 16, 256, 512, 4, form, 230)
            args, kw = _args(c)
            out = torch.empty((3, 512), device="cuda", dtype=torch.bfloat16)
            _cuda_decode(out, c, (0, 0), activation=act)
            _check(out, reference(*args, activation=act, **kw), form == "fp8", f"cuda decode {form} {act}")
        c = _case(5, 16, 256, 512, 1, form, 231)
        args, kw = _args(c)
        out = torch.empty((5, 512), device="cuda", dtype=torch.bfloat16)
        _cuda_decode(out, c, (2, 4), apply_router_weight_on_input=True)
        want = reference(*args, apply_router_weight_on_input=True, **kw)
        _check(out, want, form == "fp8", f"cuda decode {form} weight on input")
        _cuda_decode(out, c, (1, 2), vllm_rounding=True)
        _check(
            out,
            reference(*args, vllm_rounding=True, **kw),
            form == "fp8",
            f"cuda decode {form} vLLM rounding",
        )


def test_cuda_decode_every_split_and_the_tuner(device_type: str, tmp_path: object) -> None:
    """Every (up, down) columns-per-warp value the tables may name (``_decode_split``: the
    unit's instantiations) launches and matches the definition; a value the unit does not
    instantiate is its ValueError; the tuner's ``--backend cuda`` writes a valid table for a small
    shape and keeps its entries on a rerun."""
    if device_type == "cpu":
        pytest.skip("a GPU case (tests/unit/test_tuned_moe.py checks the tables' rules on the CPU)")
    from pathlib import Path

    from opmux.kernels import tuned
    from opmux.kernels.ops.moe import _decode_split as split
    from opmux.kernels.tune.moe import tune_moe

    c = _case(3, 16, 256, 512, 4, "fp8", 240)
    args, kw = _args(c)
    want = reference(*args, **kw)
    for up in (split.AUTO, *split.UP_ROWS):
        for down in (split.AUTO, *split.DOWN_ROWS):
            out = torch.full((3, 512), float("nan"), device="cuda", dtype=torch.bfloat16)
            _cuda_decode(out, c, (up, down))
            _check(out, want, True, f"cuda decode split {up}x{down}")
    for bad in ((3, 1), (1, 16)):
        with pytest.raises(ValueError, match="rows_per_warp"):
            _cuda_decode(torch.empty((3, 512), device="cuda", dtype=torch.bfloat16), c, bad)
    out_dir = Path(str(tmp_path))
    report = tune_moe([(16, 256, 512, 4, "bf16")], [1, 2], out=out_dir, budget_s=20.0, backend="cuda")
    assert not report.unfinished and not report.refused and len(report.entries) == 2
    (path,) = out_dir.iterdir()
    key = tuned.TableKey.parse("moe.fused_experts", path.name)
    table = tuned.read_table(path, key)
    assert set(table) == {1, 2} and all(
        tuned.validate_entry("moe.fused_experts", "cuda", e, ()) == [] for e in table.values()
    )
    again = tune_moe([(16, 256, 512, 4, "bf16")], [1, 2], out=out_dir, budget_s=5.0, backend="cuda")
    assert all(e.skipped for e in again.entries) and tuned.read_table(path, key) == table


@pytest.mark.parametrize("form", ["bf16", "fp8"])
def test_cuda_decode_bad_ids(form: str, device_type: str) -> None:
    # ids past E, negative and huge, and an expert_map entry past E: those slots add nothing and
    # nothing is read through them (compute-sanitizer runs this test)
    if device_type == "cpu":
        pytest.skip("a GPU case (on the CPU such ids raise ValueError)")
    c = _case(2, 8, 256, 512, 4, form, 240)
    ids = c["topk_ids"].clone()
    ids[0, 1], ids[1, 0], ids[1, 3] = 8, -1, 1 << 30
    args, kw = _args(c)
    valid = (ids >= 0) & (ids < 8)
    want = reference(args[0], args[1], args[2], c["topk_weights"] * valid, ids.clamp(0, 7), **kw)
    for split in CUDA_SPLITS:
        out = torch.empty((2, 512), device="cuda", dtype=torch.bfloat16)
        _cuda_decode(out, c, split, ids=ids)
        torch.cuda.synchronize()
        _check(out, want, form == "fp8", f"cuda decode bad ids {form} {split}")
    # int64 ids read as 64-bit: 2^32 + 1 is past E (its low word, 1, would be a valid expert)
    ids64 = ids.to(torch.int64)
    ids64[0, 2] = (1 << 32) + 1
    valid64 = (ids64 >= 0) & (ids64 < 8)
    want64 = reference(args[0], args[1], args[2], c["topk_weights"] * valid64, ids64.clamp(0, 7), **kw)
    out = torch.empty((2, 512), device="cuda", dtype=torch.bfloat16)
    _cuda_decode(out, c, (1, 2), ids=ids64)
    torch.cuda.synchronize()
    _check(out, want64, form == "fp8", f"cuda decode int64 ids past 2^32 {form}")
    emap = torch.tensor([0, 1, 2, 3, 4, 5, 6, 99], device="cuda", dtype=torch.int32)  # 99: past E
    out = torch.empty((2, 512), device="cuda", dtype=torch.bfloat16)
    _cuda_decode(out, c, (0, 0), expert_map=emap)
    torch.cuda.synchronize()
    assert bool(out.isfinite().all())
