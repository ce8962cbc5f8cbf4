"""``python -m opmux.kernels``: list ops, explain a selection, show the environment.

Thin by design: each subcommand renders what a library function returns, as a table
or (``--json``) as JSON for tools. Errors go to stderr with exit status 1.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

from . import config, registry
from .explain import explain

__all__ = ["env_info", "list_info", "main"]


def list_info() -> dict[str, Any]:
    ops = registry.all_ops()
    return {
        "groups": {g: list(names) for g, names in registry.groups().items()},
        "ops": {
            name: {
                "doc": spec.doc,
                "backends": {b.name: b.requires.describe() for b in spec.backends},
                "priority": {dev: list(order) for dev, order in spec.priority}
                | {"*": list(spec.default_priority)},
                "size_priority": [
                    {"device": dev, "min_elements": n, "priority": list(order)}
                    for dev, n, order in spec.size_priority
                ],
            }
            for name, spec in ops.items()
        },
    }


def env_info() -> dict[str, Any]:
    """Platform, installed build, toolchains and cache: what a bug report needs."""
    from importlib import metadata

    import opmux

    from . import _bridge_build, aot, platform
    from .jit.compile import toolchain

    out: dict[str, Any] = {"opmux": opmux.__version__, "build": opmux.build_info()}
    try:
        out["platform"] = platform.detect().describe()
    except platform.PlatformDetectionError as exc:
        out["platform"] = {"error": str(exc)}
    tcs: dict[str, Any] = {}
    for kind, finder in (
        ("cxx", toolchain.find_cxx),
        ("nvcc", toolchain.find_nvcc),
        ("hipcc", toolchain.find_hipcc),
    ):
        try:
            tc = finder()
            tcs[kind] = {"path": tc.path, "version": tc.version}
        except toolchain.ToolchainNotFound as exc:
            tcs[kind] = {"missing": str(exc).splitlines()[0]}
    out["toolchains"] = tcs
    out["aot"] = {d: aot.available(d) for d in ("cpu", "cuda")}
    out["jit_cache"] = _cache_info()
    out["torch_bridge"] = _bridge_build.state()
    dists = sorted(
        d.metadata["Name"]
        for d in metadata.distributions()
        if (d.metadata["Name"] or "").lower().startswith("opmux")
    )
    out["distributions"] = dists
    out["knobs"] = {k["name"]: k["current"] for k in config.describe()}
    return out


def _cache_info() -> dict[str, Any]:
    """Where the JIT cache is and whether it can be used (without creating it)."""
    from .jit.compile import JitCacheUnavailable, publish

    try:
        root = publish.cache_root(create=False)
    except JitCacheUnavailable as exc:
        return {"path": exc.path, "usable": False, "problem": str(exc)}
    return {"path": str(root), "usable": True, "exists": root.is_dir()}


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in [header, *rows]) for i in range(len(header))]
    fmt = "  ".join(f"{{:<{w}}}" for w in widths)
    return "\n".join(
        [
            fmt.format(*header),
            fmt.format(*("-" * w for w in widths)),
            *(fmt.format(*map(str, r)) for r in rows),
        ]
    )


def _print_list(info: dict[str, Any]) -> None:
    rows = [[name, ", ".join(op["backends"]), op["doc"]] for name, op in info["ops"].items()]
    print(_table(rows, ["op", "backends", "what"]))
    print("\ngroups: " + ", ".join(f"{g} ({len(v)})" for g, v in info["groups"].items()))


def _print_env(info: dict[str, Any]) -> None:
    def flat(prefix: str, value: Any) -> list[list[str]]:
        if isinstance(value, dict):
            return [r for k, v in value.items() for r in flat(f"{prefix}.{k}" if prefix else str(k), v)]
        return [[prefix, json.dumps(value) if not isinstance(value, str) else value]]

    print(_table(flat("", info), ["key", "value"]))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m opmux.kernels", allow_abbrev=False, description=__doc__.splitlines()[0]
    )
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    # --json is accepted after the subcommand too (``env --json``); SUPPRESS keeps a flag given
    # before the subcommand from being reset by the subparser's default
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--json", action="store_true", default=argparse.SUPPRESS, help="machine-readable output"
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", parents=[common], allow_abbrev=False, help="ops, their backends and groups")
    p = sub.add_parser(
        "explain",
        parents=[common],
        allow_abbrev=False,
        help="which backend runs for OP here, and why not the others",
    )
    p.add_argument("op")
    p.add_argument("--device", help="platform device type (default: this machine's accelerator, else cpu)")
    p.add_argument("--dtype", help="float32, float16 or bfloat16 (default: bfloat16 on GPUs, float32 on cpu)")
    p.add_argument("--backend", help="force a backend, as the per-call backend= argument would")
    p.add_argument(
        "--numel", type=int, help="elements of the key tensor, for ops whose choice depends on size"
    )
    sub.add_parser(
        "env",
        parents=[common],
        allow_abbrev=False,
        help="platform, installed build, toolchains, JIT cache, knobs",
    )
    args = parser.parse_args(argv)
    render: Callable[[dict[str, Any]], None]
    try:
        if args.cmd == "list":
            info: Any = list_info()
            render = _print_list
        elif args.cmd == "explain":
            info = explain(
                args.op, device=args.device, dtype=args.dtype, backend=args.backend, numel=args.numel
            ).as_dict()

            def print_explain(i: dict[str, Any]) -> None:
                rows = [
                    [
                        d["backend"],
                        "CHOSEN" if d["backend"] == i["chosen"] else (d["reason"] or "ok"),
                        d["detail"],
                    ]
                    for d in i["decisions"]
                ]
                print(
                    f"{i['op']}: {i['chosen']} runs"
                    + (f" (forced: {','.join(i['forced'])})" if i["forced"] else "")
                )
                print(_table(rows, ["backend", "decision", "why"]))
                if i["fallback_from"]:
                    print(
                        f"fallback: wanted {i['fallback_from']['backend']} ({i['fallback_from']['reason']})"
                    )

            render = print_explain
        else:
            info = env_info()
            render = _print_env
    except (ValueError, LookupError, RuntimeError) as exc:  # incl. PlatformDetectionError
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if args.json:
        print(json.dumps(info, indent=2, default=str))
    else:
        render(info)
    return 0


if __name__ == "__main__":
    sys.exit(main())
