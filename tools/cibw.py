"""What cibuildwheel runs for a target, read from that target's pyproject.

The release workflow hands ``[tool.cibuildwheel]`` to cibuildwheel; the release rehearsal
(tools/rehearsal.py) reads the same table through this module and runs the same build, repair
and test commands on this machine (cibuildwheel itself needs Docker).  One table, two runners:
a step the release would run is a step the rehearsal runs.  Standard library only.
"""

from __future__ import annotations

import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = ["Config", "load"]


@dataclass(frozen=True)
class Config:
    """The parts of a ``[tool.cibuildwheel]`` table that opmux uses (linux only)."""

    build_frontend: str
    environment: dict[str, str]
    environment_pass: tuple[str, ...]
    repair_wheel_command: str
    test_requires: tuple[str, ...]
    test_command: str

    def build_command(self, python: str, package_dir: Path, outdir: Path) -> list[str]:
        """cibuildwheel's command for ``build-frontend = "build"``."""
        if self.build_frontend != "build":
            raise ValueError(f"build-frontend = {self.build_frontend!r}; the rehearsal runs only 'build'")
        return [python, "-m", "build", str(package_dir), "--wheel", f"--outdir={outdir}"]

    def build_env(self, base: dict[str, str]) -> dict[str, str]:
        """``base`` (whose ``environment-pass`` variables cibuildwheel would pass into the
        container) plus ``[tool.cibuildwheel.linux] environment``, ``$VAR`` expanded in order."""
        env = dict(base)
        for key, value in self.environment.items():
            env[key] = _expand(value, env)
        return env

    def repair(self, wheel: Path, dest_dir: Path) -> list[str]:
        return shlex.split(self.repair_wheel_command.format(wheel=wheel, dest_dir=dest_dir))

    def test(self, project: Path, package: Path) -> str:
        """The test command as a shell line (cibuildwheel runs it through the shell)."""
        return self.test_command.format(project=shlex.quote(str(project)), package=shlex.quote(str(package)))


_VAR = re.compile(r"\$(?:\{(\w+)\}|(\w+))")


def _expand(value: str, env: dict[str, str]) -> str:
    """``$VAR`` / ``${VAR}`` from ``env`` (unset: left as written, like os.path.expandvars)."""
    return _VAR.sub(lambda m: env.get(m.group(1) or m.group(2), m.group(0)), value)


def load(pyproject: Path) -> Config:
    """The cibuildwheel configuration of one pyproject file."""
    data = tomllib.loads(Path(pyproject).read_text(encoding="utf-8"))
    top = data.get("tool", {}).get("cibuildwheel", {})
    linux = top.get("linux", {})

    def pick(key: str, default: object) -> object:
        return linux.get(key, top.get(key, default))

    env = pick("environment", {})
    if not isinstance(env, dict):
        raise ValueError(f"{pyproject}: [tool.cibuildwheel] environment must be a table")
    return Config(
        build_frontend=str(pick("build-frontend", "build")),
        environment={str(k): str(v) for k, v in env.items()},
        environment_pass=tuple(pick("environment-pass", [])),  # type: ignore[arg-type]
        repair_wheel_command=str(pick("repair-wheel-command", "")),
        test_requires=tuple(pick("test-requires", [])),  # type: ignore[arg-type]
        test_command=str(pick("test-command", "")),
    )
