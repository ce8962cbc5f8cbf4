"""Record the error class and message of every bad-input case, per op and backend.

Every ``<op>_invalid`` case of the parity samples and every ``raises`` case of the contract
corpus (``tests/parity/test_contract.py``) is run through the default call and each backend
that runs on the CPU; the outcome (``returns`` or the exception's class and message) is written
as JSON. Run it before and after a change to the op contracts and diff the two files:

    PYTHONPATH=python TRITON_INTERPRET=1 python tools/contract_messages.py --out before.json
    ... change ...
    PYTHONPATH=python TRITON_INTERPRET=1 python tools/contract_messages.py --out after.json --diff before.json
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _outcome(fn: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[str]:
    try:
        fn(*args, **kwargs)
    except Exception as exc:  # every class is recorded: a crash is a finding too
        return [type(exc).__name__, str(exc)]
    return ["returns", ""]


def record(backends: tuple[str, ...]) -> dict[str, list[str]]:
    sys.path.insert(0, str(ROOT / "tests" / "parity"))
    from parity_samples import invalid  # type: ignore[import-not-found]
    from test_contract import _corpus  # type: ignore[import-not-found]

    from opmux.kernels import registry
    from opmux.kernels.errors import BackendUnavailable
    from opmux.kernels.explain import op_instance

    found: dict[str, list[str]] = {}
    cases: list[tuple[str, str, Any]] = []
    for name, spec in registry.all_ops().items():
        try:
            bad = invalid(spec)("cpu")
        except (FileNotFoundError, AttributeError):
            continue
        for case, args, kwargs, *_ in bad:
            cases.append((name, f"invalid:{case}", (lambda a=args, k=kwargs: (a, k))))
    cases += [(op, f"corpus:{case}", make) for case, op, make in _corpus("cpu")]
    for op_name, case, make in cases:
        spec = registry.get(op_name)
        op = op_instance(op_name)
        for backend in ("default", "reference", *backends):
            if backend not in ("default", "reference") and backend not in spec.backend_names:
                continue
            args, kwargs = make()
            fn = op if backend == "default" else op.impl(backend)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    found[f"{op_name} | {case} | {backend}"] = _outcome(fn, args, kwargs)
                except BackendUnavailable as exc:
                    found[f"{op_name} | {case} | {backend}"] = ["unavailable", str(exc)]
    return found


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--backends", default="torch,jit,triton", help="comma-separated; default: %(default)s")
    p.add_argument("--diff", type=Path, help="an earlier record: print every case whose outcome changed")
    a = p.parse_args(argv)
    found = record(tuple(b for b in a.backends.split(",") if b))
    a.out.write_text(json.dumps(found, indent=1, sort_keys=True) + "\n")
    print(f"{len(found)} outcomes -> {a.out}")
    if a.diff is None:
        return 0
    old = json.loads(a.diff.read_text())
    changed = [k for k in sorted(set(old) | set(found)) if old.get(k) != found.get(k)]
    for k in changed:
        print(f"{k}\n  before: {old.get(k)}\n  after:  {found.get(k)}")
    print(f"{len(changed)} of {len(found)} outcomes changed")
    return 1 if changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
