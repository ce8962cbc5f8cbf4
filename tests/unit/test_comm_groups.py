"""The comm ops over real process groups: gloo with 2 and 4 processes on this machine's CPU, and
(on a machine with 2+ GPUs) NCCL and the peer-buffer kernels at TP = 2, 4 and 8.

Each worker process joins a gloo group (a FileStore rendezvous in a temporary folder), runs the
ops against the reference (every rank's x gathered and summed in rank order) at the op's
tolerance, checks that every rank got the same result, and that bad input fails alike on every
rank. The fault tests: a rank that never joins the call, or dies, makes the others raise
CommError within OPMUX_COMM_TIMEOUT instead of hanging. The GPU grid: every backend (oneshot,
twoshot, torch) against the reference for T in {1, 16, 128, 1024, 8192} x H in {4096, 8192},
in eager mode and replayed from a CUDA graph with fresh inputs (``OPMUX_TEST_COMM_GPUS=1``
runs it; it skips where fewer than 2 GPUs are visible).
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import time
import traceback
from pathlib import Path
from typing import Any

import pytest

_CTX = mp.get_context("spawn")
#: worker start (torch import) plus the cases, on 2 shared cores
_JOIN_S = 240


def _init(rank: int, world: int, folder: str) -> str:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world)
    assert dist.group.WORLD is not None
    return str(dist.group.WORLD.group_name)


def _parity_worker(rank: int, world: int, folder: str) -> None:
    out = Path(folder) / f"rank{rank}.json"
    try:
        import torch
        import torch.distributed as dist

        from opmux.kernels import explain, registry
        from opmux.kernels.ops import comm
        from opmux.kernels.ops.comm import op as comm_op

        g = _init(rank, world, folder)
        report: dict[str, Any] = {"cases": 0}

        def same_everywhere(t: torch.Tensor) -> None:
            parts = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(parts, t.contiguous())
            for p in parts[1:]:
                assert torch.equal(p.view(torch.uint8), parts[0].view(torch.uint8)), "ranks differ"

        for dtype in (torch.float32, torch.bfloat16, torch.float16):
            atol, rtol = dict(registry.get("comm.all_reduce").tolerances)[str(dtype)[6:]]
            for t, h in ((1, 4096), (16, 4096), (5, 8192)):
                gen = torch.Generator().manual_seed(1000 * rank + t)
                x = torch.randn(t, h, generator=gen).to(dtype)
                res = torch.randn(t, h, generator=torch.Generator().manual_seed(t)).to(dtype)  # replicated
                w = torch.randn(h, generator=torch.Generator().manual_seed(h)).to(dtype)
                want = comm_op.ref_all_reduce(x, g)
                got = comm.all_reduce(x, g)
                torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
                same_everywhere(got)
                y = x.clone()
                assert comm.all_reduce(y, g, out=y) is y  # in place
                torch.testing.assert_close(y, want, atol=atol, rtol=rtol)
                # the fused op against the reference chain, then the quantizing one
                x1, r1, x2, r2 = x.clone(), res.clone(), x.clone(), res.clone()
                comm_op.ref_add_rmsnorm(x1, r1, w, g)
                comm.all_reduce_fused_add_rmsnorm(x2, r2, w, g)
                torch.testing.assert_close(r2, r1, atol=atol, rtol=rtol)
                torch.testing.assert_close(x2, x1, atol=4 * atol, rtol=4 * rtol)
                same_everywhere(x2)
                x3, r3 = x.clone(), res.clone()
                q, s = comm.all_reduce_fused_add_rmsnorm_quant_fp8(x3, r3, w, g)
                assert q.dtype == torch.float8_e4m3fn and s.shape == (t, 1)
                torch.testing.assert_close(x3, x2, atol=0, rtol=0)  # same path, same bits
                torch.testing.assert_close(q.float() * s, x3.float(), atol=4 * atol, rtol=0.07)
                report["cases"] += 4
        # bad input: the same error on every rank (the contract runs before any collective)
        x = torch.ones(2, 8)
        try:
            comm.all_reduce(x, "no-such-group")
        except ValueError as err:
            report["bad_group"] = str(err)
        try:
            comm.all_reduce_fused_add_rmsnorm(x, torch.ones(2, 8), torch.ones(4), g)
        except ValueError as err:
            report["bad_weight"] = str(err)
        report["explain"] = explain("comm.all_reduce", x, g).chosen
        report["world"] = dist.get_world_size()
        dist.destroy_process_group()
        out.write_text(json.dumps(report))
    except BaseException:
        out.write_text(json.dumps({"error": traceback.format_exc()}))
        raise


def _run(world: int, folder: Path, target: Any, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    old = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update(env or {})
    try:
        procs = [_CTX.Process(target=target, args=(r, world, str(folder))) for r in range(world)]
        for p in procs:
            p.start()
        deadline = time.monotonic() + _JOIN_S
        for p in procs:
            p.join(max(1.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join()
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    reports = []
    for r in range(world):
        path = folder / f"rank{r}.json"
        assert path.is_file(), f"rank {r} of {world} wrote no report (killed after {_JOIN_S} s?)"
        reports.append(json.loads(path.read_text()))
    return reports


@pytest.mark.parametrize("world", [2, 4])
def test_ops_match_the_reference_on_every_rank(world: int, tmp_path: Path) -> None:
    reports = _run(world, tmp_path, _parity_worker)
    for r, rep in enumerate(reports):
        assert "error" not in rep, f"rank {r}:\n{rep['error']}"
        assert rep["cases"] == 36 and rep["world"] == world
        assert "names no live process group; live groups:" in rep["bad_group"]
        assert "weight has shape" in rep["bad_weight"]
        assert rep["explain"] == "torch"
    assert len({rep["bad_group"] for rep in reports}) == 1  # the same words on every rank


def _fault_worker(rank: int, world: int, folder: str) -> None:
    """Rank 0 calls all_reduce twice; rank 1 joins the first call, then (by the folder's name)
    dies, or stays away from the second."""
    out = Path(folder) / f"rank{rank}.json"
    import torch

    from opmux.kernels.errors import CommError
    from opmux.kernels.ops import comm

    g = _init(rank, world, folder)
    comm.all_reduce(torch.ones(4, 8), g)
    if rank == 1:
        out.write_text(json.dumps({"joined": True}))
        if Path(folder).name.endswith("dies"):
            os._exit(3)
        done = Path(folder) / "rank0.json"  # never joins the second call: waits for rank 0's verdict
        for _ in range(1200):
            if done.exists():
                break
            time.sleep(0.1)
        os._exit(0)
    start = time.monotonic()
    report: dict[str, Any] = {}
    try:
        comm.all_reduce(torch.ones(4, 8), g)
        report["error"] = "no error"
    except CommError as err:
        report |= {"type": type(err).__name__, "message": str(err), "rank": err.rank, "world": err.world}
    report["elapsed"] = time.monotonic() - start
    out.write_text(json.dumps(report))
    os._exit(0)  # skip the group's teardown: its peer is gone


@pytest.mark.parametrize("fault", ["never-joins", "dies"])
def test_a_missing_rank_fails_the_others_within_the_timeout(fault: str, tmp_path: Path) -> None:
    folder = tmp_path / fault
    folder.mkdir()
    reports = _run(2, folder, _fault_worker, env={"OPMUX_COMM_TIMEOUT": "4"})
    assert reports[1] == {"joined": True}
    rep = reports[0]
    assert rep.get("type") == "CommError", rep
    assert "comm.all_reduce: the collective on group" in rep["message"]
    assert "(rank 0 of 2)" in rep["message"] and "OPMUX_COMM_TIMEOUT" in rep["message"]
    assert (rep["rank"], rep["world"]) == (0, 2)
    assert rep["elapsed"] < 60, rep  # the 4 s timeout (a dead peer: at once), not a hang


def _agree_worker(rank: int, world: int, folder: str) -> None:
    """register()'s agreement step over a gloo group: rank 1 cannot load the kernels."""
    out = Path(folder) / f"rank{rank}.json"
    import torch

    from opmux.kernels.errors import BackendUnavailable
    from opmux.kernels.ops.comm import ipc

    _init(rank, world, folder)
    import torch.distributed as dist

    def library() -> dict[str, Any]:
        if rank == 1:
            raise BackendUnavailable("oneshot", "CompileError: nvcc failed")
        return {}

    ipc.library = library  # type: ignore[assignment]
    try:
        ipc._agree_on_kernels(dist.group.WORLD, "g", rank, world, torch.device("cpu"))
        report = {"error": "no error"}
    except BackendUnavailable as err:
        report = {"message": str(err)}
    out.write_text(json.dumps(report))
    dist.destroy_process_group()


def test_registration_is_all_ranks_or_none(tmp_path: Path) -> None:
    """One rank that cannot load the peer-buffer kernels makes every rank refuse to register
    (else it would run NCCL while its peers wait in a peer-buffer kernel)."""
    reports = _run(2, tmp_path, _agree_worker)
    for rep in reports:
        assert "ranks [1] cannot load the peer-buffer kernels" in rep.get("message", ""), rep
    assert "nvcc failed" in reports[1]["message"] and "nvcc failed" not in reports[0]["message"]


# -- the GPU grid (2+ GPUs) ----------------------------------------------------------------------
_GPU_T = (1, 16, 128, 1024, 8192)
_GPU_H = (4096, 8192)


def _gpu_worker(rank: int, world: int, folder: str) -> None:
    out = Path(folder) / f"rank{rank}.json"
    try:
        import torch
        import torch.distributed as dist

        from opmux.kernels import explain, registry
        from opmux.kernels.explain import op_instance
        from opmux.kernels.ops.comm import ipc
        from opmux.kernels.ops.comm import op as comm_op

        torch.cuda.set_device(rank)
        dist.init_process_group(
            "cpu:gloo,cuda:nccl", init_method=f"file://{folder}/store", rank=rank, world_size=world,
            device_id=torch.device("cuda", rank),
        )  # fmt: skip
        assert dist.group.WORLD is not None
        g = str(dist.group.WORLD.group_name)
        ws = ipc.register(g, 8 << 20)
        ops = {name: op_instance(f"comm.{name}") for name in ("all_reduce", "all_reduce_fused_add_rmsnorm")}
        quant = op_instance("comm.all_reduce_fused_add_rmsnorm_quant_fp8")
        report: dict[str, Any] = {"cases": 0, "graphs": 0, "chosen": {}}

        def same_everywhere(t: torch.Tensor) -> None:
            parts = [torch.empty_like(t) for _ in range(world)]
            dist.all_gather(parts, t.contiguous())
            for p in parts[1:]:
                assert torch.equal(p.view(torch.uint8), parts[0].view(torch.uint8)), "ranks differ"

        def inputs(t: int, h: int, dtype: torch.dtype, seed: int) -> tuple[torch.Tensor, ...]:
            gen = torch.Generator(device="cuda").manual_seed(seed)
            x = torch.randn(t, h, generator=gen, device="cuda").to(dtype)
            gen.manual_seed(7 + t)  # the residual and weight are replicated, as in TP
            res = torch.randn(t, h, generator=gen, device="cuda").to(dtype)
            w = torch.randn(h, generator=gen, device="cuda").to(dtype)
            return x, res, w

        for dtype in (torch.bfloat16, torch.float32):
            atol, rtol = dict(registry.get("comm.all_reduce").tolerances)[str(dtype)[6:]]
            for t in _GPU_T:
                for h in _GPU_H if dtype == torch.bfloat16 else (4096,):
                    x, res, w = inputs(t, h, dtype, 100 * rank + t)
                    report["chosen"][f"{t}x{h}"] = explain("comm.all_reduce", x, g).chosen
                    want = comm_op.ref_all_reduce(x, g)
                    r1, x1 = res.clone(), x.clone()
                    comm_op.ref_add_rmsnorm(x1, r1, w, g)
                    for algo in (*ipc.ALGORITHMS, "torch"):
                        if algo != "torch" and x.numel() * x.element_size() > ws.cap:
                            continue
                        got = ops["all_reduce"].impl(algo)(x, g)
                        torch.testing.assert_close(got, want, atol=atol, rtol=rtol)
                        same_everywhere(got)
                        x2, r2 = x.clone(), res.clone()
                        ops["all_reduce_fused_add_rmsnorm"].impl(algo)(x2, r2, w, g)
                        torch.testing.assert_close(r2, r1, atol=atol, rtol=rtol)
                        torch.testing.assert_close(x2, x1, atol=4 * atol, rtol=4 * rtol)
                        same_everywhere(x2)
                        x3, r3 = x.clone(), res.clone()
                        q, s = quant.impl(algo)(x3, r3, w, g)
                        assert torch.equal(x3, x2), algo
                        torch.testing.assert_close(q.float() * s, x3.float(), atol=4 * atol, rtol=0.07)
                        report["cases"] += 3
        # awkward sizes at this world: fewer rows than ranks, H not a multiple of the vector width
        # or of world x vector (two-shot's clipped shares, the scalar tails), offset views (the
        # unaligned paths: XVEC false, VEC 1)
        for t, h, offset in ((1, 33, 0), (2, 100, 0), (3, 4100, 0), (5, 4096, 1), (world + 1, 7, 3)):
            x_all, res_all, w_all = inputs(t, h + offset, torch.bfloat16, 50 * rank + t + h)
            x = x_all.flatten()[offset : offset + t * h].view(t, h)
            res = res_all.flatten()[offset : offset + t * h].view(t, h)
            w = w_all[offset : offset + h] if offset else w_all[:h]
            want = comm_op.ref_all_reduce(x, g)
            r1, x1 = res.clone(), x.clone()
            comm_op.ref_add_rmsnorm(x1, r1, w, g)
            for algo in ipc.ALGORITHMS:
                got = ops["all_reduce"].impl(algo)(x, g)
                torch.testing.assert_close(got, want, atol=3.2e-2, rtol=3.2e-2)
                same_everywhere(got)
                x2, r2 = x.clone(), res.clone()
                ops["all_reduce_fused_add_rmsnorm"].impl(algo)(x2, r2, w, g)
                torch.testing.assert_close(r2, r1, atol=3.2e-2, rtol=3.2e-2)
                torch.testing.assert_close(x2, x1, atol=0.13, rtol=0.13)
                same_everywhere(x2)
                report["cases"] += 2
        # CUDA graphs: captured once, replayed with fresh inputs in the static buffers
        for algo in (*ipc.ALGORITHMS, "torch"):
            xs, rs, w = inputs(16, 4096, torch.bfloat16, rank)
            fused = ops["all_reduce_fused_add_rmsnorm"].impl(algo)
            plain = ops["all_reduce"].impl(algo)
            ys = torch.empty_like(xs)
            fused(xs, rs, w, g)  # warm up (JIT, NCCL communicators) outside the capture
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):  # both exports in one graph: halves and epochs interleave
                plain(rs, g, out=ys)
                fused(xs, rs, w, g)
            for i in range(3):
                x, res, _ = inputs(16, 4096, torch.bfloat16, 1000 * i + rank)
                xs.copy_(x)
                rs.copy_(res)
                graph.replay()
                torch.testing.assert_close(ys, comm_op.ref_all_reduce(res, g), atol=3.2e-2, rtol=3.2e-2)
                r1, x1 = res.clone(), x.clone()
                comm_op.ref_add_rmsnorm(x1, r1, w, g)
                torch.testing.assert_close(rs, r1, atol=3.2e-2, rtol=3.2e-2)
                torch.testing.assert_close(xs, x1, atol=0.13, rtol=0.13)
                report["graphs"] += 1
        ipc.unregister(g)
        dist.destroy_process_group()
        out.write_text(json.dumps(report))
    except BaseException:
        out.write_text(json.dumps({"error": traceback.format_exc()}))
        raise


def _gpus() -> int:
    if os.environ.get("OPMUX_TEST_COMM_GPUS") != "1":
        return 0
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.parametrize("world", [2, 4, 8])
def test_gpu_backends_match_the_reference(world: int, tmp_path: Path) -> None:
    if _gpus() < world:
        pytest.skip(f"needs {world} GPUs and OPMUX_TEST_COMM_GPUS=1 (visible: {_gpus()})")
    reports = _run(
        world, tmp_path, _gpu_worker, env={"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}
    )
    for r, rep in enumerate(reports):
        assert "error" not in rep, f"rank {r}:\n{rep['error']}"
        assert rep["graphs"] == 9 and rep["cases"] > 0, rep
