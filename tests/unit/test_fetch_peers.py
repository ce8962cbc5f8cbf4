"""benchmarks/fetch_peers.py's FlashInfer trim on a stand-in wheel: what it keeps, what it drops, and
the AOT modules it adds (flashinfer_aot.py's output) where FlashInfer looks for them, listed in a
RECORD whose hashes match the bytes."""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import stat
import sys
import zipfile
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIST = "flashinfer_python-0.7.4.dist-info"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fp() -> ModuleType:
    return _load("fetch_peers")


def _wheel(path: Path) -> Path:
    files = {
        "flashinfer/__init__.py": "import os  # kept verbatim\n",
        "flashinfer/fused_moe/core.py": '"""doc"""\nimport os  # comment\n',
        "flashinfer/norm/__init__.py": "x = 1  # kept verbatim\n",
        "flashinfer/data/csrc/norm.cu": '#include "flashinfer/norm.cuh"\n',
        "flashinfer/data/csrc/flashinfer_norm_binding.cu": "",
        "flashinfer/data/include/flashinfer/norm.cuh": "// norm\n",
        "flashinfer/data/csrc/batch_decode_customize_config.jinja": '#include "flashinfer/decode.cuh"\n{{ x }}\n',
        "flashinfer/data/include/flashinfer/decode.cuh": "",
        "flashinfer/data/csrc/batch_pod_customize_config.jinja": "{{ y }}\n",
        "flashinfer/data/csrc/trtllm_big/kernel.cu": "// a kernel nobody benchmarks\n",
        "flashinfer/data/include/flashinfer/unused.cuh": "// not included by any kept unit\n",
        f"{DIST}/METADATA": "Name: flashinfer-python\n",
        f"{DIST}/RECORD": "",
    }
    with zipfile.ZipFile(path, "w") as zf:
        for name, text in files.items():
            zf.writestr(name, text)
    return path


def _record(zf: zipfile.ZipFile) -> dict[str, str]:
    rows = zf.read(f"{DIST}/RECORD").decode().splitlines()
    return {r.split(",")[0]: r.split(",")[1] for r in rows if r}


def _sha(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def test_trim_keeps_the_benchmarked_sources_and_drops_the_rest(fp: ModuleType, tmp_path: Path) -> None:
    wheel = fp.trim_flashinfer(_wheel(tmp_path / "flashinfer_python-0.7.4-py3-none-any.whl"))
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "flashinfer/data/csrc/norm.cu" in names
        assert "flashinfer/data/include/flashinfer/norm.cuh" in names  # the include closure
        assert "flashinfer/data/include/flashinfer/unused.cuh" not in names
        assert "flashinfer/data/csrc/trtllm_big/kernel.cu" not in names
        # parity-cuda's FlashInfer decode renders this template: kept with its includes, while a
        # template of a module nothing builds goes (no AOT modules: the top of csrc is not kept)
        assert "flashinfer/data/csrc/batch_decode_customize_config.jinja" in names
        assert "flashinfer/data/include/flashinfer/decode.cuh" in names
        assert "flashinfer/data/csrc/batch_pod_customize_config.jinja" not in names
        assert not any("/data/aot/" in n for n in names)
        assert b"0 modules built ahead of time" in zf.read(f"{DIST}/TRIMMED")
        assert zf.read("flashinfer/norm/__init__.py") == b"x = 1  # kept verbatim\n"
        assert zf.read("flashinfer/__init__.py") == b"import os  # kept verbatim\n"
        blanked = b'""""""\nimport os\n'  # the docstring emptied, the comment gone
        assert zf.read("flashinfer/fused_moe/core.py") == blanked


def test_aot_modules_land_where_flashinfer_loads_them(fp: ModuleType, tmp_path: Path) -> None:
    name = "batch_decode_with_kv_cache_dtype_q_bf16_head_dim_qk_128"
    so = tmp_path / "built.so"
    so.write_bytes(b"\x7fELF stand-in")
    wheel = fp.trim_flashinfer(_wheel(tmp_path / "flashinfer_python-0.7.4-py3-none-any.whl"), {name: so})
    with zipfile.ZipFile(wheel) as zf:
        arc = f"flashinfer/data/aot/{name}/{name}.so"  # jit.env.get_aot_artifacts' fallback path
        assert zf.read(arc) == so.read_bytes()
        mode = zf.getinfo(arc).external_attr >> 16
        assert stat.S_ISREG(mode) and mode & 0o111, "a regular, executable file (as pip installs it)"
        record = _record(zf)
        assert record[arc] == _sha(so.read_bytes())
        # the gen functions read their templates from the top of data/csrc before finding the file
        assert "flashinfer/data/csrc/batch_decode_customize_config.jinja" in zf.namelist()
        assert "flashinfer/data/csrc/trtllm_big/kernel.cu" not in zf.namelist()
        for member in zf.namelist():  # every file listed, with its hash (the RECORD itself without)
            if member != f"{DIST}/RECORD":
                assert record[member] == _sha(zf.read(member)), member
        assert name.encode() in zf.read(f"{DIST}/TRIMMED")


def test_aot_module_list_is_closed() -> None:
    aot = _load("flashinfer_aot")
    assert len(set(aot.MODULES)) == len(aot.MODULES)
    with pytest.raises(KeyError, match="known: sampling"):
        aot.spec("no_such_module")
