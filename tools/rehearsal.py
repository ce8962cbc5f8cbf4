"""The release rehearsal: what a tagged release runs, end to end, here, through a real index.

From a clean temporary clone of the committed HEAD with a test tag, it runs the release's own
steps (.github/workflows/release.yml), each through the same command:

1. the sdist, once: ``nox -s sdist`` under ``OPMUX_RELEASE=1``;
2. per target, the sdist unpacked inside the workspace (``tools/from_sdist.py --prepare``), then
   cibuildwheel's build, repair and test commands read from that target's
   ``[tool.cibuildwheel]`` (tools/cibw.py; ``python -m build`` for pure wheels), the test in a
   fresh venv (tools/wheel_test.py);
3. every release check on every artefact (tools/release_check.py, the check job's);
4. ``twine upload`` to a pypiserver on 127.0.0.1 with upload auth (tools/package_index.py), then
   the same upload again, which the index must refuse and the tooling must stop on;
5. in fresh venvs, ``pip install <distribution>`` by name from that index (torch from the usual
   place), and import-smoke, find-spec, the shipped torch bridge (tools/bridge_check.py) and,
   where the machine has the device, parity on it.

It ends with a table: target, wheel, size, tag, checks, installed-by-name.  Exit status 1 when
any step of any requested target failed.

    python tools/rehearsal.py [--targets cpu,cuda|all] [--version 0.0.1rc1] [--source CHECKOUT]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tools import cibw as _cibw
from tools import package_index as _index
from tools import release_check as _release_check
from tools import targets as _targets
from tools import wheel_test as _wheel_test

__all__ = ["Outcome", "RehearsalError", "main", "rehearse"]

ROOT = _targets.ROOT
PARITY_DEPS = ["triton", "numpy", "pytest"]
#: distributions that must install by name and pass the installed checks (the issue's promise)
MUST_INSTALL = ("cpu", "cuda", "cuda12")


class RehearsalError(RuntimeError):
    """A release step failed; the message names the step and the target."""


@dataclass
class Outcome:
    target: str
    wheel: str = "-"
    size_mb: float = 0.0
    tag: str = "-"
    steps: dict[str, str] = field(default_factory=dict)  # step -> "ok" | "FAILED: ..." | "n/a: ..."

    @property
    def ok(self) -> bool:
        return all(not v.startswith("FAILED") for v in self.steps.values())


class _Log:
    def __init__(self) -> None:
        self.start = time.monotonic()

    def __call__(self, msg: str) -> None:
        print(f"rehearsal [{time.monotonic() - self.start:6.0f} s] {msg}", flush=True)


log = _Log()


def _run(cmd: list[str], *, step: str, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    """Run ``cmd``; its output streams to the log (progress); RehearsalError names the step."""
    log(f"{step}: $ {' '.join(cmd)}")
    tail: list[str] = []
    why: list[str] = []  # setup.py's "opmux: ..." lines: the reason a build stopped
    with subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            sys.stdout.write(f"    {line}")
            tail = [*tail[-30:], line.rstrip()]
            if "opmux:" in line or "refuses" in line:
                why = [*why[-4:], line.strip()]
        returncode = proc.wait()
    if returncode != 0:
        shown = "\n    ".join([*tail[-12:], *why])
        raise RehearsalError(f"{step} failed (exit {returncode}):\n    {shown}")
    return "\n".join(tail)


def _tools_env(python: str) -> dict[str, str]:
    """The environment of release tooling: this venv's scripts (auditwheel, twine) on PATH."""
    env = {**os.environ, "PATH": f"{Path(python).absolute().parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    for var in ("PYTHONPATH", "SETUPTOOLS_SCM_PRETEND_VERSION", "OPMUX_GIT_COMMIT", "SOURCE_DATE_EPOCH"):
        env.pop(var, None)  # a release build learns these from git and from the sdist only
    return env


def clone(source: Path, dest: Path, version: str) -> str:
    """A clean clone of ``source``'s committed HEAD, tagged ``v<version>``; returns the commit."""
    dirty = subprocess.run(
        ["git", "-C", str(source), "status", "--porcelain"], capture_output=True, text=True, check=True
    ).stdout.splitlines()
    if dirty:
        log(f"note: {len(dirty)} uncommitted change(s) in {source} are not part of the rehearsal")
    _run(["git", "clone", "--quiet", "--no-hardlinks", str(source), str(dest)], step="clone")
    for key, value in (("user.name", "opmux rehearsal"), ("user.email", "rehearsal@localhost")):
        subprocess.run(["git", "-C", str(dest), "config", key, value], check=True)
    tag = f"v{version}"
    subprocess.run(["git", "-C", str(dest), "tag", "-d", tag], capture_output=True, check=False)
    subprocess.run(["git", "-C", str(dest), "tag", "-a", tag, "-m", "release rehearsal"], check=True)
    return subprocess.run(
        ["git", "-C", str(dest), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()


def build_sdist(workspace: Path, python: str) -> Path:
    """The release's sdist job: ``nox -s sdist`` in the workspace under OPMUX_RELEASE=1."""
    env = {**_tools_env(python), "OPMUX_RELEASE": "1"}
    _run([python, "-m", "nox", "-s", "sdist"], step="sdist", cwd=workspace, env=env)
    (sdist,) = (workspace / "dist" / "sdist").glob("*.tar.gz")
    return sdist


def build_wheel(workspace: Path, sdist: Path, target: _targets.Target, out: Path, python: str) -> Path:
    """The release's wheel job for ``target``: unpack inside the workspace, then cibuildwheel's
    build and repair commands (pure targets: ``python -m build``).  Returns the wheel to publish."""
    step = f"wheel-{target.name}"
    src = Path(
        _run(
            [
                python,
                "tools/from_sdist.py",
                str(sdist),
                "--target",
                target.name,
                "--dest",
                "build-src",
                "--prepare",
            ],
            step=f"{step}: unpack",
            cwd=workspace,
        ).splitlines()[-1]
    )
    src = src if src.is_absolute() else workspace / src
    env = {**_tools_env(python), "OPMUX_RELEASE": "1", "OPMUX_REQUIRE_AOT": "1"}
    built = out / "built"
    shutil.rmtree(built, ignore_errors=True)
    if target.aot.libraries:
        cfg = _cibw.load(src / "pyproject.toml")
        _run(
            cfg.build_command(python, src, built),
            step=f"{step}: build",
            cwd=workspace,
            env=cfg.build_env(env),
        )
        (raw,) = built.glob("*.whl")
        repaired = out / "wheelhouse"
        shutil.rmtree(repaired, ignore_errors=True)
        _run(cfg.repair(raw, repaired), step=f"{step}: repair", cwd=workspace, env=env)
        (wheel,) = repaired.glob("*.whl")
    else:
        _run(
            [python, "-m", "build", "--wheel", "--outdir", str(built), str(src)],
            step=f"{step}: build",
            env=env,
        )
        (wheel,) = built.glob("*.whl")
    return wheel


def _venv(path: Path, python: str) -> Path:
    subprocess.run([python, "-m", "virtualenv", "-q", str(path)], check=True)
    return path / "bin" / "python"


def install_by_name(
    venv: Path, index: _index.LocalIndex, dist: str, version: str, python: str, torch: str
) -> Path:
    """``pip install <dist>==<version>`` by name from ``index`` in a fresh venv; ``torch`` (the
    target's :attr:`~tools.targets.Target.test_torch`) and the other dependencies from the usual
    place.  Checks that pip really took opmux from the index."""
    vpy = _venv(venv, python)
    _run(
        [str(vpy), "-m", "pip", "install", "-q", torch, "apache-tvm-ffi>=0.1.15,<0.2"], step=f"deps of {dist}"
    )
    report = venv / "install-report.json"
    _run(
        [str(vpy), "-m", "pip", "install", "--index-url", index.simple, "--report", str(report),
         f"{dist}=={version}", torch],
        step=f"pip install {dist} (by name)",
    )  # fmt: skip
    items = json.loads(report.read_text())["install"]
    got = [i for i in items if i["metadata"]["name"].lower() == dist]
    if not got or not got[0]["download_info"]["url"].startswith(index.url):
        where = got[0]["download_info"]["url"] if got else "nowhere"
        raise RehearsalError(
            f"pip install {dist}: took it from {where}, not from the local index {index.url}"
        )
    return vpy


def installed_checks(
    vpy: Path, project: Path, target: _targets.Target, *, parity: bool, matrix: Path | None
) -> None:
    """import-smoke and find-spec on what pip installed; parity where the device is here (its
    dependencies, Triton among them, installed first so find-spec resolves the Triton targets)."""
    if parity:
        _run([str(vpy), "-m", "pip", "install", "-q", *PARITY_DEPS], step=f"{target.name}: parity deps")
    with tempfile.TemporaryDirectory(prefix="opmux-installed-") as tmp:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        env["HOME"] = tmp
        # the venv's torch is one of the target's bridge_torch: its bridge must serve, compiling nothing
        bridge = ["bridge_check.py", *(["--require"] if target.require_bridge else [])]
        for script in (["import_smoke.py"], ["find_spec_check.py"], bridge):
            _run(
                [str(vpy), "-I", str(project / "tools" / script[0]), *script[1:]],
                step=f"{target.name}: {script[0]}",
                cwd=Path(tmp),
                env=env,
            )
        if not parity:
            return
        if target.triton == "interpreter":
            env["TRITON_INTERPRET"] = "1"
        cmd = [str(vpy), "-m", "pytest", str(project / "tests" / "parity"), "--target", target.name, "-q",
               "-p", "no:cacheprovider", "--import-mode=importlib"]  # fmt: skip
        if matrix is not None:
            cmd += ["--matrix-out", str(matrix)]
        _run(cmd, step=f"parity-{target.name}", cwd=Path(tmp), env=env)


def _has_device(target: _targets.Target) -> bool:
    return target.parity_device == "cpu"  # the GPU parity runs on its own runner (parity-<target>)


def _tag_of(wheel: Path) -> str:
    return "-".join(wheel.name[:-4].split("-")[2:])


def _attempt(outcome: Outcome, step: str, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
    try:
        result = fn(*args, **kwargs)
    except (RehearsalError, _index.UploadRefused, subprocess.CalledProcessError, ValueError, OSError) as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        why = [ln for ln in lines if "refuses" in ln] or [ln for ln in lines if ln.startswith("opmux:")]
        lines = [lines[0], why[-1]] if why else lines  # setup.py's own words for why it stopped
        outcome.steps[step] = "FAILED: " + (
            " ... ".join([lines[0], lines[-1]]) if len(lines) > 1 else lines[0]
        )
        log(f"{outcome.target}: {step} FAILED\n{exc}")
        return None
    outcome.steps[step] = "ok"
    return result


def rehearse(
    source: Path,
    names: list[str],
    version: str,
    work: Path,
    *,
    python: str = sys.executable,
    matrix_dir: Path | None = None,
) -> list[Outcome]:
    """Run the whole rehearsal for the targets ``names``; one :class:`Outcome` per target."""
    workspace = work / "workspace"
    for old in ("workspace", "wheels", "venvs", "index"):
        shutil.rmtree(work / old, ignore_errors=True)  # a kept --workdir of an earlier run
    commit = clone(source, workspace, version)
    log(f"rehearsing commit {commit[:12]} as v{version} in {workspace}")
    table = _targets.load(workspace / "targets.toml")
    unknown = sorted(set(names) - set(table))
    if unknown:
        raise RehearsalError(f"unknown target(s) {unknown}; targets.toml has {sorted(table)}")
    outcomes = {n: Outcome(n) for n in names}
    sdist = build_sdist(workspace, python)
    log(f"sdist: {sdist.name} ({sdist.stat().st_size / 1e6:.2f} MB)")

    wheels: dict[str, Path] = {}
    for name in names:
        target, outcome = table[name], outcomes[name]
        log(f"--- {name}: build from the sdist ({'cibuildwheel' if target.aot.libraries else 'build'})")
        wheel = _attempt(
            outcome, "build+repair", build_wheel, workspace, sdist, target, work / "wheels" / name, python
        )
        if wheel is None:
            continue
        wheels[name] = wheel
        outcome.wheel, outcome.size_mb, outcome.tag = wheel.name, wheel.stat().st_size / 1e6, _tag_of(wheel)
        _attempt(
            outcome,
            "wheel-test",
            _wheel_test.test_wheel,
            wheel,
            workspace,
            work / "venvs" / f"test-{name}",
            python=python,
        )

    artifacts = [sdist, *wheels.values()]
    log(f"--- release-check of {len(artifacts)} artefact(s)")
    problems = _release_check.check(artifacts, workspace, python=python)
    for name, wheel in wheels.items():
        mine = [
            p
            for p in problems
            if p.startswith(wheel.name) or not p.split(":")[0].endswith((".whl", ".tar.gz"))
        ]
        outcomes[name].steps["release-check"] = "ok" if not mine else f"FAILED: {mine[0].splitlines()[0]}"
    for p in problems:
        log(f"release-check: FAIL {p}")
    if any(p.startswith(sdist.name) for p in problems):
        raise RehearsalError(f"release-check refused the sdist: {problems}")
    publishable = [sdist, *(w for n, w in wheels.items() if outcomes[n].ok)]

    with _index.LocalIndex(work / "index", python=python) as index:
        log(f"--- upload {len(publishable)} file(s) to {index.url} (auth: {index.user})")
        _index.upload(index, publishable, python=python)
        log(f"index holds: {', '.join(index.names())}")
        try:
            _index.upload(index, publishable[:1], python=python)
        except _index.UploadRefused as exc:
            log(
                f"second upload of {publishable[0].name} refused, as it must be; the release stops on it:\n{exc}"
            )
        else:
            raise RehearsalError(
                f"the index accepted a second upload of {publishable[0].name}: publishing is not final"
            )
        for name in names:
            outcome = outcomes[name]
            outcome.steps["upload"] = "ok" if name in wheels and outcome.ok else "n/a: not publishable"
            if outcome.steps["upload"] != "ok":
                continue
            target = table[name]
            log(f"--- {name}: pip install {target.distribution} by name from the local index")
            vpy = _attempt(
                outcome, "installed-by-name", install_by_name,
                work / "venvs" / f"user-{name}", index, target.distribution, version, python, target.test_torch,
            )  # fmt: skip
            if vpy is None:
                continue
            parity = _has_device(target)
            matrix = matrix_dir / f"{name}.json" if (matrix_dir and parity) else None
            _attempt(
                outcome,
                "installed-checks",
                installed_checks,
                vpy,
                workspace,
                target,
                parity=parity,
                matrix=matrix,
            )
            if not parity:
                outcome.steps["parity"] = f"n/a: needs a {target.parity_device} device (parity-{name})"
    return [outcomes[n] for n in names]


def table(outcomes: list[Outcome]) -> str:
    rows = [
        "| target | wheel | size | tag | checks | installed by name |",
        "|---|---|---:|---|---|---|",
    ]
    for o in outcomes:
        checks = ", ".join(
            f"{k} {'ok' if v == 'ok' else v}" for k, v in o.steps.items() if k != "installed-by-name"
        )
        installed = o.steps.get("installed-by-name", "no")
        rows.append(f"| {o.target} | {o.wheel} | {o.size_mb:.2f} MB | {o.tag} | {checks} | {installed} |")
    return "\n".join(rows) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--targets", default="all", help="comma-separated target names, or 'all'")
    parser.add_argument("--version", default="0.0.1rc1", help="the test tag is v<version>")
    parser.add_argument("--source", type=Path, default=ROOT, help="the checkout whose HEAD is rehearsed")
    parser.add_argument(
        "--workdir", type=Path, default=None, help="keep everything here (default: a temp dir)"
    )
    parser.add_argument("--report", type=Path, default=None, help="also write the table (markdown) here")
    parser.add_argument("--matrix-dir", type=Path, default=None, help="write parity coverage matrices here")
    args = parser.parse_args(argv)
    table_names = list(_targets.load(args.source / "targets.toml"))
    names = (
        table_names if args.targets == "all" else [n.strip() for n in args.targets.split(",") if n.strip()]
    )
    with tempfile.TemporaryDirectory(prefix="opmux-rehearsal-") as tmp:
        work = args.workdir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        try:
            outcomes = rehearse(args.source.resolve(), names, args.version, work, matrix_dir=args.matrix_dir)
        except RehearsalError as exc:
            print(f"rehearsal: FAILED: {exc}", file=sys.stderr)
            return 1
    text = table(outcomes)
    print("\n" + text)
    if args.report:
        args.report.parent.mkdir(parents=True, exist_ok=True)
        args.report.write_text(text, encoding="utf-8")
    failed = [o.target for o in outcomes if not o.ok]
    missing = [
        o.target for o in outcomes if o.target in MUST_INSTALL and o.steps.get("installed-by-name") != "ok"
    ]
    if failed or missing:
        print(f"rehearsal: FAILED for {sorted(set(failed + missing))}", file=sys.stderr)
        return 1
    print(f"rehearsal: every target ({', '.join(names)}) built, repaired, checked, uploaded and installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
