"""What device code a CUDA library really holds: cubin archs and PTX, read with cuobjdump.

Used by the wheel checks (the CUDA wheel's AOT library must hold exactly the table's arch list
and PTX) and testable on its own. cuobjdump is looked up on PATH, under $CUDA_HOME, in
/usr/local/cuda, in the nvidia-cuda-cuobjdump package (``nvidia/cu13/bin``, the release check job's), and in
Triton's package (which bundles one).
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DeviceCode", "find_cuobjdump", "read_device_code"]


@dataclass(frozen=True)
class DeviceCode:
    cubins: frozenset[str]  # e.g. {"sm_80", "sm_90a"}
    ptx: frozenset[str]  # e.g. {"compute_90"}


def find_cuobjdump() -> Path | None:
    """The first cuobjdump found; None when there is none (the caller says what to install)."""
    hits = [shutil.which("cuobjdump")]
    for base in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if base:
            hits.append(str(Path(base) / "bin" / "cuobjdump"))
    for entry in sys.path:
        for major in ("cu13", "cu12"):
            hits.append(str(Path(entry or ".") / "nvidia" / major / "bin" / "cuobjdump"))
    spec = importlib.util.find_spec("triton")
    if spec and spec.origin:
        hits.append(str(Path(spec.origin).parent / "backends" / "nvidia" / "bin" / "cuobjdump"))
    for hit in hits:
        if hit and Path(hit).is_file() and os.access(hit, os.X_OK):
            return Path(hit)
    return None


def read_device_code(lib: Path, *, cuobjdump: Path | None = None) -> DeviceCode:
    tool = cuobjdump or find_cuobjdump()
    if tool is None:
        raise FileNotFoundError(
            "cuobjdump not found (PATH, $CUDA_HOME/bin, /usr/local/cuda/bin, triton's bundled one)"
        )

    def run(flag: str) -> str:
        proc = subprocess.run([str(tool), flag, str(lib)], capture_output=True, text=True, check=False)
        # exit 255 with "does not contain device code" for a library without any
        if proc.returncode != 0 and "does not contain" not in proc.stderr + proc.stdout:
            raise RuntimeError(f"{tool} {flag} {lib} failed ({proc.returncode}): {proc.stderr.strip()}")
        return proc.stdout

    cubins = frozenset(re.findall(r"\.(sm_\d+[af]?)\.cubin", run("--list-elf")))
    ptx = frozenset(f"compute_{m}" for m in re.findall(r"\.sm_(\d+[af]?)\.ptx", run("--list-ptx")))
    return DeviceCode(cubins, ptx)
