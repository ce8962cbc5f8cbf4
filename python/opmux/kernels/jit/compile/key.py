"""The content-addressed cache key of a JIT module.

A key is two-level, like ccache's manifest mode, because the header list is only known after
a compile (from the compiler's ``-MMD`` depfile):

* the **source key** hashes what is known before compiling: module name, device, every
  source's relative path and content, the output-shaping flags, the compiler identity and
  version (for CUDA also the host C++ compiler), the tvm-ffi version, the target archs, the
  opmux ABI version, the cache format, and :data:`ENV_VARS`;
* the **full key** hashes the source key plus the relative path and content of every header
  the compiler read. It names the cache entry, and the entry's manifest records the header
  list, so a lookup re-hashes the recorded headers' current contents: an edited, deleted or
  renamed header gives another key and a rebuild.

Only content and root-relative labels go in (``kernel/include/opmux/x.h``, ``tvm_ffi/...``,
``cutlass/cute/tensor.hpp``), never an absolute path, so moving the package or the venv keeps
hitting the cache. Besides the roots a caller passes, :func:`extra_roots` adds the header trees
of installed packages that change compiled output (CUTLASS's, from nvidia-cutlass): a unit that
reads them is keyed on their content too. Headers outside every known root (the toolkit's and
the system's) are covered by the compiler version.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "ABI_VERSION",
    "CACHE_FORMAT",
    "ENV_VARS",
    "HeaderDigest",
    "SourceKey",
    "extra_roots",
    "file_digest",
    "full_key",
    "hash_headers",
    "label_headers",
    "parse_depfile",
    "resolve_label",
]

#: Bump when the native calling convention of the kernels changes (what ``ops/*/native.py``
#: passes across tvm-ffi): old cache entries must then never be loaded.
ABI_VERSION = 1

#: Bump when the cache entry layout or manifest schema changes.
CACHE_FORMAT = 1

#: Environment variables the compilers read that change their output. Declared here, once;
#: their values go into the source key (unset and empty are the same).
ENV_VARS: tuple[str, ...] = (
    "CPATH",
    "CPLUS_INCLUDE_PATH",
    "C_INCLUDE_PATH",
    "LIBRARY_PATH",
    "NVCC_PREPEND_FLAGS",
    "NVCC_APPEND_FLAGS",
    "NVCC_CCBIN",
)


def file_digest(path: Path) -> str:
    """sha256 of a file's bytes, hex."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


@dataclass(frozen=True)
class SourceKey:
    """Everything the key covers except headers; :attr:`digest` is the source key."""

    name: str
    device: str
    sources: tuple[tuple[str, str], ...]  # (path relative to the kernel root, sha256)
    flags: tuple[str, ...]
    toolchain: str  # kind:version line, no path
    host_toolchain: str  # the C++ compiler nvcc drives ("" for C++ builds)
    tvm_ffi: str
    archs: tuple[str, ...]
    ptx_arch: str
    abi: int
    cache_format: int
    env: tuple[tuple[str, str], ...]

    @classmethod
    def compute(
        cls,
        *,
        name: str,
        device: str,
        kernel_path: Path,
        sources: Sequence[str],
        flags: Sequence[str],
        toolchain: str,
        host_toolchain: str = "",
        tvm_ffi: str,
        archs: Sequence[str] = (),
        ptx_arch: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> SourceKey:
        """Hash the sources (named relative to ``kernel_path``) and collect the other inputs."""
        environ = os.environ if environ is None else environ
        return cls(
            name=name,
            device=device,
            sources=tuple((rel, file_digest(kernel_path / rel)) for rel in sources),
            flags=tuple(flags),
            toolchain=toolchain,
            host_toolchain=host_toolchain,
            tvm_ffi=tvm_ffi,
            archs=tuple(archs),
            ptx_arch=ptx_arch or "",
            abi=ABI_VERSION,
            cache_format=CACHE_FORMAT,
            env=tuple((var, environ.get(var, "")) for var in ENV_VARS),
        )

    def as_json(self) -> dict[str, object]:
        return asdict(self)

    @property
    def digest(self) -> str:
        blob = json.dumps(self.as_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(blob.encode()).hexdigest()


HeaderDigest = tuple[str, str]  # (root-relative label, sha256)


def full_key(source_key: str, headers: Sequence[HeaderDigest]) -> str:
    """The entry name: source key plus every header's label and content."""
    blob = json.dumps([source_key, sorted(headers)], separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def parse_depfile(text: str) -> list[str]:
    """The prerequisites of a make-style depfile (``-MMD`` output), in order, unescaped.

    >>> parse_depfile("x.so: a.cpp \\\\\\n  inc/a\\\\ b.h c.h\\n")
    ['a.cpp', 'inc/a b.h', 'c.h']
    """
    text = text.replace("\\\r\n", " ").replace("\\\n", " ")
    deps: list[str] = []
    for line in text.splitlines():
        _, sep, rest = line.partition(": ")
        if not sep:
            continue
        token, escaped = "", False
        for ch in rest.replace("$$", "$") + " ":
            if escaped:
                token += ch
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch.isspace():
                if token and token not in deps:
                    deps.append(token)
                token = ""
            else:
                token += ch
    return deps


def extra_roots() -> dict[str, Path]:
    """Header roots outside the kernel tree whose contents change compiled output, by label:
    ``cutlass`` (nvidia-cutlass's ``source/include``) when installed. Merged into the roots
    of :func:`label_headers` and :func:`resolve_label`, so a CUTLASS-based module's key covers
    every CUTLASS header it read and an upgraded or removed nvidia-cutlass means a rebuild."""
    from .toolchain import cutlass_include_dir  # lazy: keeps this module import-light

    include = cutlass_include_dir()
    return {"cutlass": include} if include is not None else {}


def _with_extra(roots: Mapping[str, Path]) -> dict[str, Path]:
    merged = dict(roots)
    for label, root in extra_roots().items():
        merged.setdefault(label, root)
    return merged


def label_headers(
    deps: Sequence[str], *, roots: Mapping[str, Path], sources: Sequence[Path], cwd: Path
) -> list[str]:
    """Root-relative labels of the depfile entries that are headers under a known root.

    The sources themselves are skipped (already in the source key), and so is anything
    outside ``roots`` (toolkit and system headers: covered by the compiler version).
    """
    resolved_roots = [(label, root.resolve()) for label, root in _with_extra(roots).items()]
    skip = {s.resolve() for s in sources}
    labels: list[str] = []
    for dep in deps:
        path = (cwd / dep).resolve()
        if path in skip:
            continue
        for label, root in resolved_roots:
            if path.is_relative_to(root):
                name = f"{label}/{path.relative_to(root).as_posix()}"
                if name not in labels:
                    labels.append(name)
                break
    return sorted(labels)


def resolve_label(label: str, roots: Mapping[str, Path]) -> Path | None:
    """The current file behind a label, or None when its root is not known here."""
    root, _, rel = label.partition("/")
    if root not in roots:
        roots = _with_extra(roots)
    return roots[root] / rel if root in roots and rel else None


def hash_headers(labels: Sequence[str], roots: Mapping[str, Path]) -> list[HeaderDigest] | None:
    """Current (label, sha256) of each header; None when one is missing (the entry is stale)."""
    if any(label.partition("/")[0] not in roots for label in labels):
        roots = _with_extra(roots)  # once, not per header
    digests: list[HeaderDigest] = []
    for label in labels:
        path = resolve_label(label, roots)
        if path is None:
            return None
        try:
            digests.append((label, file_digest(path)))
        except OSError:
            return None
    return digests
