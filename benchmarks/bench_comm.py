"""The comm ops against NCCL and torch's symmetric memory, one world size per run (2+ GPUs).

    python benchmarks/bench_comm.py --world 8 --out DIR      # spawns one process per GPU

Per case (bf16, T in {1, 16, 128, 1024}, H in {4096, 8192}), each timed in a CUDA graph of R
calls (benchmarks/bench_gpu.py's ``time_impl``; all ranks capture and replay in lockstep; rank
0's median is reported, the slowest rank's beside it):

* ``all_reduce_fused_add_rmsnorm``: opmux's default and each peer-buffer backend, against NCCL's
  all-reduce followed by opmux's ``fused_add_rmsnorm`` (what a layer pays without the fusion);
* ``all_reduce``: opmux's default and each backend, against NCCL and torch's symmetric-memory
  one-shot (``torch.ops.symm_mem.one_shot_all_reduce``, where this torch build has it; x copied
  into its symmetric buffer first, as opmux's kernels copy it in).

A backend that fails on any rank is reported for that row (every rank still joins each gather).
A failure inside a collective itself (one rank raising mid-capture while its peers wait) cannot
be recovered by a benchmark: the peer-buffer kernels then trap after ``OPMUX_COMM_TIMEOUT``.

NVLink multicast stays off (``NCCL_NVLS_ENABLE=0``, ``TORCH_SYMM_MEM_DISABLE_MULTICAST=1``, set
here before any process starts). Writes ``DIR/comm_w<world>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
_T = (1, 16, 128, 1024)
_H = (4096, 8192)


def _time(torch: Any, fn: Any, sets: list[Any], r: int, replays: int) -> dict[str, Any]:
    sys.path.insert(0, str(HERE))
    from bench_gpu import time_impl

    return time_impl(torch, fn, sets, r, replays)  # type: ignore[no-any-return]


def worker(rank: int, world: int, out: str, replays: int) -> None:
    import torch
    import torch.distributed as dist

    from opmux.kernels import explain
    from opmux.kernels.explain import op_instance
    from opmux.kernels.ops import comm, layernorm
    from opmux.kernels.ops.comm import ipc

    torch.cuda.set_device(rank)
    dist.init_process_group(
        "cpu:gloo,cuda:nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank)
    )
    assert dist.group.WORLD is not None
    g = str(dist.group.WORLD.group_name)
    ipc.register(g, 64 << 20)
    fused_op = op_instance("comm.all_reduce_fused_add_rmsnorm")
    ar_op = op_instance("comm.all_reduce")
    symm = getattr(torch.ops, "symm_mem", None)
    cases = []
    for h in _H:
        for t in _T:
            gen = torch.Generator(device="cuda").manual_seed(rank * 100 + t)
            sets = [
                {
                    "x": torch.randn(t, h, device="cuda", generator=gen, dtype=torch.bfloat16),
                    "res": torch.randn(t, h, device="cuda", generator=gen, dtype=torch.bfloat16),
                }
                for _ in range(2)
            ]
            for s_ in sets:
                s_["w"] = torch.ones(h, device="cuda", dtype=torch.bfloat16)
            r = max(4, min(100, 2000 // max(1, t * h // 4096)))

            def nccl_then_norm(s: dict[str, Any]) -> None:
                dist.all_reduce(s["x"], group=dist.group.WORLD)
                layernorm.fused_add_rmsnorm(s["x"], s["res"], s["w"])

            fused = {
                "opmux default": lambda s: comm.all_reduce_fused_add_rmsnorm(s["x"], s["res"], s["w"], g),
                "NCCL + fused_add_rmsnorm": nccl_then_norm,
            }
            for algo in ipc.ALGORITHMS:
                fused[f"opmux {algo}"] = lambda s, a=algo: fused_op.impl(a)(s["x"], s["res"], s["w"], g)
            plain: dict[str, Any] = {
                "opmux default": lambda s: comm.all_reduce(s["x"], g, out=s["x"]),
                "NCCL": lambda s: dist.all_reduce(s["x"], group=dist.group.WORLD),
            }
            for algo in ipc.ALGORITHMS:
                plain[f"opmux {algo}"] = lambda s, a=algo: ar_op.impl(a)(s["x"], g, out=s["x"])
            if symm is not None and hasattr(symm, "one_shot_all_reduce"):
                from torch.distributed import _symmetric_memory as sm

                buf = sm.empty(t, h, dtype=torch.bfloat16, device="cuda")
                sm.rendezvous(buf, g)
                # x copied into the symmetric buffer first, as opmux's kernels copy it in: like for like
                plain["torch symm_mem one-shot"] = lambda s, b=buf: symm.one_shot_all_reduce(
                    b.copy_(s["x"]), "sum", g
                )
            case: dict[str, Any] = {
                "T": t,
                "H": h,
                "R": r,
                "default": explain("comm.all_reduce", sets[0]["x"], g).chosen,
            }
            for name, impls in (("all_reduce_fused_add_rmsnorm", fused), ("all_reduce", plain)):
                res: dict[str, Any] = {}
                for label, fn in impls.items():
                    try:
                        timing: dict[str, Any] = _time(torch, fn, sets, r, replays)
                    except Exception as exc:  # reported; every rank still joins the gather below
                        timing = {"error": f"{type(exc).__name__}: {str(exc)[:200]}"}
                    # every rank reaches this gather whatever happened above (a rank skipping it
                    # would leave its peers waiting): a failure on any rank fails the row
                    got: list[Any] = [None] * world
                    dist.all_gather_object(got, timing)
                    errors = [f"rank {i}: {t['error']}" for i, t in enumerate(got) if "error" in t]
                    if errors:
                        res[label] = {"error": "; ".join(errors)}
                    else:
                        res[label] = {**timing, "us_slowest_rank": max(t["us"] for t in got)}
                case[name] = res
            cases.append(case)
            if rank == 0:
                print(f"T={t} H={h}: " + ", ".join(
                    f"{k} {v['us']:.1f} us" for k, v in case["all_reduce_fused_add_rmsnorm"].items() if "us" in v
                ), flush=True)  # fmt: skip
    if rank == 0:
        record = {"world": world, "device": torch.cuda.get_device_name(), "cases": cases}
        Path(out, f"comm_w{world}.json").write_text(json.dumps(record, indent=1))
        Path(out, f"comm_w{world}.md").write_text(render(record))
    ipc.unregister(g)
    dist.destroy_process_group()


def render(record: dict[str, Any]) -> str:
    lines = [f"# comm ops, {record['world']} x {record['device']} (CUDA graphs, us per call, rank 0)", ""]
    for name, peer in (("all_reduce_fused_add_rmsnorm", "NCCL + fused_add_rmsnorm"), ("all_reduce", "NCCL")):
        labels = sorted({k for c in record["cases"] for k in c[name]})
        lines += [f"## {name}", "", "| T | H | " + " | ".join(labels) + f" | default / {peer} |"]
        lines.append("|---|---|" + "---|" * (len(labels) + 1))
        for c in record["cases"]:
            us = {k: v.get("us") for k, v in c[name].items()}
            cells = [f"{us[k]:.1f}" if us.get(k) else "-" for k in labels]
            base, mine = us.get(peer), us.get("opmux default")
            ratio = f"{mine / base:.2f}" if base and mine else "-"
            lines.append(f"| {c['T']} | {c['H']} | " + " | ".join(cells) + f" | {ratio} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--world", type=int, required=True, help="GPUs (processes): 2, 4, 6 or 8")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--replays", type=int, default=15)
    a = p.parse_args(argv)
    os.environ.update(
        {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    )
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    a.out.mkdir(parents=True, exist_ok=True)
    import torch.multiprocessing as mp

    mp.spawn(worker, args=(a.world, str(a.out), a.replays), nprocs=a.world)
    print(Path(a.out, f"comm_w{a.world}.md").read_text())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
