"""``python -m opmux.kernels.tune OP --shapes "N,K;N,K" | --models M1,M2 [--m 1,16,64] --budget-s S
--out DIR [--backend triton] [--tp 1] [--json]``: thin; the work is :func:`runner.tune` (the GEMM)
or :func:`moe.tune_moe` (``moe.fused_experts``: ``--shapes "E,N,K,topk[,fp8];..."``)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opmux.kernels.tune.models import MODELS, MOE_MODELS, model_shapes, moe_shapes
from opmux.kernels.tune.runner import BACKENDS, OP, tune
from opmux.kernels.tune.space import DEFAULT_MS

MOE_OP = "moe.fused_experts"


def _ints(text: str) -> list[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected integers separated by commas, e.g. 1,16,64"
        ) from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers, e.g. 1,16,64")
    return values


def _shapes(text: str) -> list[tuple[int, int]]:
    shapes = []
    for part in text.split(";"):
        if not part.strip():
            continue
        values = _ints(part)
        if len(values) != 2:
            raise argparse.ArgumentTypeError(f"{part!r}: expected N,K, e.g. --shapes '4096,7168;7168,2048'")
        shapes.append((values[0], values[1]))
    return shapes


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m opmux.kernels.tune",
        description="Tune launch configurations; writes vLLM-compatible tables to --out "
        "(point OPMUX_TUNED_CONFIG_DIR at it to use them).",
        allow_abbrev=False,
    )
    p.add_argument("op", choices=[OP, MOE_OP])
    p.add_argument(
        "--shapes",
        default="",
        help=f'weight shapes: "N,K;N,K" ({OP}); "E,N,K,topk[,fp8];..." ({MOE_OP}: fp8 block weights when marked)',
    )
    p.add_argument(
        "--models",
        default="",
        help=f"comma-separated presets: {', '.join(MODELS)} ({OP}); {', '.join(MOE_MODELS)} ({MOE_OP})",
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size applied to --models (default 1)")
    p.add_argument("--m", type=_ints, default=None, help="batch sizes M (default: vLLM's list for the op)")
    p.add_argument("--budget-s", type=float, required=True, help="wall-clock budget in seconds for this run")
    p.add_argument("--out", type=Path, required=True, help="directory of the tables (reread to resume)")
    p.add_argument(
        "--backend",
        choices=list(BACKENDS),
        default="triton",
        help="triton: launch configs; cuda: the CUTLASS instantiation (gemm), the native decode kernels' "
        "columns per warp (moe); skinny: the skinny-M kernel's tiles and warps along K (gemm, M <= 16); "
        "select: the backend tried first (gemm; tune it last)",
    )
    p.add_argument("--device", choices=["cuda", "cpu"], default=None, help="default: cuda when available")
    p.add_argument("--max-configs", type=int, default=None, help="at most this many configs per entry")
    p.add_argument(
        "--retune",
        action="store_true",
        help="time the entries already in --out again (their config first) instead of keeping them",
    )
    p.add_argument("--json", action="store_true", help="print the report as JSON on stdout")
    return p


def _moe_shapes(text: str) -> list[tuple[int, int, int, int, str]]:
    shapes = []
    for part in filter(None, (p.strip() for p in text.split(";"))):
        fields = [f.strip() for f in part.split(",")]
        form = "fp8" if fields[-1] == "fp8" else "bf16"
        values = _ints(",".join(fields[:-1] if form == "fp8" else fields))
        if len(values) != 4:
            raise argparse.ArgumentTypeError(
                f"{part!r}: expected E,N,K,topk[,fp8], e.g. --shapes '8,14336,4096,2'"
            )
        shapes.append((values[0], values[1], values[2], values[3], form))
    return shapes


def _tune_moe(args: argparse.Namespace) -> Any:
    from opmux.kernels.tune.moe import BACKENDS as MOE_BACKENDS
    from opmux.kernels.tune.moe import MOE_MS, tune_moe

    shapes = list(args.shapes)
    for name in filter(None, (x.strip() for x in args.models.split(","))):
        shapes.append(moe_shapes(name, tp=args.tp))
    if not shapes:
        raise ValueError(
            "nothing to tune: give --shapes 'E,N,K,topk[,fp8];...' or --models " + ",".join(MOE_MODELS)
        )
    _check_budget(args)
    if args.backend not in MOE_BACKENDS:
        raise ValueError(
            f"{MOE_OP} tunes {' and '.join(MOE_BACKENDS)} launches (--backend {' or '.join(MOE_BACKENDS)}); "
            "its select tables come from benchmarks/bench_moe.py --select-out"
        )
    return tune_moe(
        shapes,
        args.m or list(MOE_MS),
        out=args.out,
        budget_s=args.budget_s,
        device=args.device,
        max_configs=args.max_configs,
        retune=args.retune,
        backend=args.backend,
    )


def _tune_gemm(args: argparse.Namespace) -> Any:
    shapes = list(args.shapes)
    for name in filter(None, (x.strip() for x in args.models.split(","))):
        shapes += [s for s in model_shapes(name, tp=args.tp) if s not in shapes]
    if not shapes:
        raise ValueError("nothing to tune: give --shapes 'N,K;...' or --models " + ",".join(MODELS))
    _check_budget(args)
    return tune(
        shapes,
        args.m or list(DEFAULT_MS),
        out=args.out,
        budget_s=args.budget_s,
        op=args.op,
        backend=args.backend,
        device=args.device,
        max_configs=args.max_configs,
        retune=args.retune,
    )


def _check_budget(args: argparse.Namespace) -> None:
    if args.budget_s <= 0:
        raise ValueError(f"--budget-s {args.budget_s}: expected a positive number of seconds")


def main(argv: Sequence[str] | None = None) -> int:
    p = parser()
    args = p.parse_args(argv)
    try:  # a malformed --shapes is a usage error (exit 2), as any other argument
        args.shapes = (_moe_shapes if args.op == MOE_OP else _shapes)(args.shapes)
    except argparse.ArgumentTypeError as err:
        p.error(f"argument --shapes: {err}")
    try:
        report = (_tune_moe if args.op == MOE_OP else _tune_gemm)(args)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(report.as_json(), indent=2))
    else:
        done = sum(not e.skipped for e in report.entries)
        print(f"{done} entries tuned, {len(report.unfinished)} left; tables in {args.out} ({report.timing})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
