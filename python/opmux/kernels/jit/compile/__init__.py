"""The JIT machinery: toolchain discovery, cache key, build, atomic publish, load.

Nothing here imports torch or tvm_ffi at import time; ``load.load`` (not re-exported: it would shadow the submodule) imports tvm_ffi on its
first call, and CUDA arch detection imports torch only when no arch list is given.
"""

from __future__ import annotations

from .build import CompileError, CompileStats, CompileTimeout, build_shared_library, compile_flags, stats
from .errors import JitCacheUnavailable, JitLockTimeout
from .key import ABI_VERSION, ENV_VARS
from .load import (
    JIT_ENV,
    JitCacheWarning,
    JitDisabled,
    JitUnavailable,
    KernelSourcesMissing,
    ensure_built,
    jit_enabled,
    reset,
)
from .publish import CACHE_DIR_ENV, DEFAULT_CACHE_DIR, CacheInsecure, cache_root
from .toolchain import (
    CUDA_ARCHS_ENV,
    Toolchain,
    ToolchainNotFound,
    find_cxx,
    find_hipcc,
    find_nvcc,
    tvm_ffi_paths,
)

__all__ = [
    "ABI_VERSION",
    "CACHE_DIR_ENV",
    "CUDA_ARCHS_ENV",
    "DEFAULT_CACHE_DIR",
    "ENV_VARS",
    "JIT_ENV",
    "CacheInsecure",
    "CompileError",
    "CompileStats",
    "CompileTimeout",
    "JitCacheUnavailable",
    "JitCacheWarning",
    "JitDisabled",
    "JitLockTimeout",
    "JitUnavailable",
    "KernelSourcesMissing",
    "Toolchain",
    "ToolchainNotFound",
    "build_shared_library",
    "cache_root",
    "compile_flags",
    "ensure_built",
    "find_cxx",
    "find_hipcc",
    "find_nvcc",
    "jit_enabled",
    "reset",
    "stats",
    "tvm_ffi_paths",
]
