"""What the nox sessions do, so that noxfile.py reads as the list of what CI runs.

Each function takes the running ``nox.Session``; the real work lives in the other tools
(stage, release_check, rehearsal, import_smoke, find_spec_check), which the release workflow
and the rehearsal call too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from tools import release, stage, targets

ROOT = targets.ROOT
DIST = ROOT / "dist"
WHEEL_ENVS = ROOT / ".nox" / "_wheel-envs"
TORCH = "torch==2.13.0"  # pinned: a bare "torch" pulls a multi-GB CUDA build
TABLE = targets.load(ROOT / "targets.toml")

__all__ = ["build_env", "build_sdist", "build_wheel", "parity", "target_of", "wheel_env", "wheels"]


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, check=False)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 and out.stdout.strip() else None


def build_env(session: Any) -> dict[str, str]:
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
    version = session.run("python", "-m", "setuptools_scm", silent=True, success_codes=[0, 1])
    lines = (version or "").strip().splitlines()[-1:]
    if lines and lines[0][:1].isdigit():
        env["SETUPTOOLS_SCM_PRETEND_VERSION"] = lines[0]
    return env


def _build(session: Any, kind: str, out: Path, pyproject: str, args: list[str]) -> list[Path]:
    """``python -m build --<kind>`` of a staged copy into ``out``, then every release check
    against that staged tree (exactly the files this build saw); returns the artefacts."""
    before = stage.fingerprint(ROOT)
    with tempfile.TemporaryDirectory(prefix=f"opmux-{out.name}-") as tmp:
        src = stage.stage(ROOT, Path(tmp) / "src", pyproject=pyproject)
        session.log(f"building {kind} from a staged copy in {src}")
        dist = Path(tmp) / "dist"
        session.run(
            "python",
            "-m",
            "build",
            f"--{kind}",
            *args,
            "--outdir",
            str(dist),
            str(src),
            env=build_env(session),
        )
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        for artifact in dist.iterdir():
            shutil.copy2(artifact, out / artifact.name)
        artifacts = sorted(out.iterdir())
        session.run(
            "python", str(ROOT / "tools" / "release_check.py"), "--root", str(src), *map(str, artifacts)
        )
    changed = stage.diff_fingerprints(before, stage.fingerprint(ROOT))
    if changed:
        session.error("the build modified the checkout:\n  " + "\n  ".join(changed))
    return artifacts


def build_wheel(session: Any, target: targets.Target) -> None:
    """Build ``target``'s wheel from a staged copy into dist/<target>/ and run every release check."""
    artifacts = _build(session, "wheel", DIST / target.name, target.pyproject, list(session.posargs))
    for w in (a for a in artifacts if a.suffix == ".whl" and not a.name.endswith("-any.whl")):
        session.run("auditwheel", "show", str(w), success_codes=[0, 1])  # which manylinux tag it could take
    session.log(
        f"{target.name}: " + ", ".join(f"{a.name} ({a.stat().st_size / 1e6:.2f} MB)" for a in artifacts)
    )


def build_sdist(session: Any) -> None:
    """The one sdist (no target: every wheel builds from it) into dist/sdist/, checked."""
    _build(session, "sdist", DIST / "sdist", "pyproject.toml", [])


def wheels(session: Any) -> list[Path]:
    """Wheels named in posargs, else every wheel under dist/*/."""
    named = [Path(a) for a in session.posargs if a.endswith(".whl")]
    found = named or sorted(DIST.glob("*/*.whl"))
    if not found:
        session.error("no wheel under dist/*/: run a wheel session first, e.g. `nox -s wheel-cpu`")
    return [w.resolve() for w in found]


def target_of(wheel: Path) -> targets.Target:
    from tools import release_check

    return release_check.target_of(wheel, TABLE)


def wheel_env(session: Any, wheel: Path, *, extra: tuple[str, ...] = ()) -> Path:
    """A venv with only ``wheel`` + torch + the wheel's dependencies (+ ``extra``), shared by
    import-smoke, find-spec and parity-* through a key on the wheel's content."""
    name = target_of(wheel).name
    env = WHEEL_ENVS / f"{name}-{hashlib.sha256(wheel.read_bytes()).hexdigest()[:16]}"
    py = env / "bin" / "python"
    stamp = env / ".opmux-installed"
    have = set(stamp.read_text().split("\n")) if stamp.exists() else None
    if have is None:
        for old in WHEEL_ENVS.glob(f"{name}-*"):
            shutil.rmtree(old, ignore_errors=True)  # envs of older wheels of this target
        # OPMUX_SYSTEM_TORCH=1 (a GPU host without an index): use the machine's torch instead.
        system_torch = os.environ.get("OPMUX_SYSTEM_TORCH") == "1"
        venv_args = ["--system-site-packages"] if system_torch else []
        session.run(sys.executable, "-m", "virtualenv", "-q", *venv_args, str(env), external=True)
        torch = [] if system_torch else [TORCH]
        session.run(str(py), "-m", "pip", "install", "-q", str(wheel), *torch, external=True)
        have = {str(wheel)}
    missing = [e for e in extra if e not in have]
    if missing:
        session.run(str(py), "-m", "pip", "install", "-q", *missing, external=True)
        have |= set(missing)
    stamp.write_text("\n".join(sorted(have)))
    return py


def installed_check(session: Any, script: str) -> None:
    """Run tools/<script> with each wheel's venv from an empty directory (the tree is not importable)."""
    for wheel in wheels(session):
        py = wheel_env(session, wheel)
        session.log(f"{script}: {wheel.name}")
        with tempfile.TemporaryDirectory(prefix="opmux-installed-") as tmp, session.chdir(tmp):
            session.run(str(py), "-I", str(ROOT / "tools" / script), external=True, env={"HOME": tmp})


_PROBES = {
    "cpu": "True",
    "cuda": "torch.cuda.is_available()",
    "xpu": "hasattr(torch, 'xpu') and torch.xpu.is_available()",
    "npu": "hasattr(torch, 'npu') and torch.npu.is_available()",
}


def parity(session: Any, target: targets.Target) -> None:
    """Every backend against the reference on the target's device, with the installed wheel;
    fails (never passes) when the device is absent."""
    named = [Path(a).resolve() for a in session.posargs if a.endswith(".whl")]
    found = [w for w in named if target_of(w).name == target.name] or sorted(
        (DIST / target.name).glob("*.whl")
    )
    if not found:
        session.error(f"no wheel in dist/{target.name}/: run `nox -s wheel-{target.name}` first")
    py = wheel_env(session, found[-1], extra=("triton", "numpy", "pytest"))
    probe = _PROBES[target.parity_device]
    ok = session.run(str(py), "-I", "-c", f"import torch; print({probe})", silent=True, external=True)
    if (ok or "").strip().splitlines()[-1:] != ["True"]:
        session.error(
            f"parity-{target.name} needs a {target.parity_device} device and this machine has none "
            f"({probe} is False); run it on a {target.name} machine"
        )
    matrix = ROOT / "docs" / "coverage" / f"{target.name}.json"
    matrix.parent.mkdir(parents=True, exist_ok=True)
    env = {"TRITON_INTERPRET": "1"} if target.triton == "interpreter" else {}
    args = [a for a in session.posargs if not a.endswith(".whl")]
    with tempfile.TemporaryDirectory(prefix=f"opmux-parity-{target.name}-") as tmp, session.chdir(tmp):
        session.run(
            str(py), "-m", "pytest", str(ROOT / "tests" / "parity"), "--target", target.name,
            "--matrix-out", str(matrix), "-p", "no:cacheprovider", "--import-mode=importlib", *args,
            external=True, env={**env, "HOME": tmp},
        )  # fmt: skip
