"""targets.toml is the single source of truth: the variant files, the CI matrix and what the
workflows consume, the README and docs, CODEOWNERS and the labeler agree with it."""

from __future__ import annotations

import json
import re
import sys

import pytest
from tools import changes, ci_matrix, targets, variants

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

yaml = pytest.importorskip("yaml")

TABLE = targets.load()
PINNED = re.compile(r"^[\w.-]+/[\w./-]+@[0-9a-f]{40} # v\d+\.\d+\.\d+$")


def _workflow(root, name):
    text = (root / ".github" / "workflows" / name).read_text(encoding="utf-8")
    return text, yaml.safe_load(text)


def _steps(wf):
    for job in wf["jobs"].values():
        yield from job.get("steps", [])


def _nox_sessions(root) -> set[str]:
    text = (root / "noxfile.py").read_text(encoding="utf-8")
    names = set(re.findall(r'@nox\.session\(name="([\w-]+)"', text))
    names |= set(re.findall(r"@nox\.session(?:\([^)]*\))?\ndef (\w+)\(", text))
    names |= {f"{kind}-{t}" for kind in ("wheel", "parity") for t in TABLE}
    return names


def test_variant_files_carry_the_table(root):
    assert variants.check(root) == []
    for t in TABLE.values():
        data = tomllib.loads((root / t.pyproject).read_text(encoding="utf-8"))
        linux = data["tool"]["cibuildwheel"]["linux"]
        assert linux["manylinux-x86_64-image"] == t.manylinux_image
        for lib in ("libtvm_ffi.so", "libcuda.so.1", "'libcudart.so.*'", "'libtorch*'"):
            assert f"--exclude {lib}" in linux["repair-wheel-command"]
        assert data["tool"]["opmux"]["target"] == t.name


def test_matrix_covers_every_target(root):
    m = ci_matrix.matrix(TABLE)
    cpu = {e["name"]: e for e in m["cpu"]["include"]}
    gpu = {e["name"]: e for e in m["gpu"]["include"]}
    assert {"tests", "lint", "import-smoke", "find-spec"} <= set(cpu)
    assert {f"wheel-{t}" for t in TABLE} <= set(cpu)
    for t in TABLE.values():
        if t.parity_device == "cpu":
            assert cpu[f"parity-{t.name}"]["sessions"] == f"wheel-{t.name} parity-{t.name}"
        else:
            assert gpu[f"parity-{t.name}"]["runs-on"] == list(t.runner)
    sessions = _nox_sessions(root)
    for entry in [*cpu.values(), *gpu.values()]:
        assert set(entry["sessions"].split()) <= sessions, entry
    assert json.loads(json.dumps(m)) == m


def test_matrix_narrows_to_touched_targets():
    m = ci_matrix.matrix(TABLE, ["cpu"])
    names = [e["name"] for e in m["cpu"]["include"]]
    assert names == ["tests", "lint", "wheel-cpu", "import-smoke", "find-spec", "parity-cpu"]
    assert m["gpu"]["include"] == []
    assert [e["name"] for e in ci_matrix.matrix(TABLE, [])["cpu"]["include"]] == ["tests", "lint"]


@pytest.mark.parametrize(
    ("paths", "expected"),
    [
        (["docs/architecture.md", "README.md"], []),
        (["csrc/aot_cuda.cu"], ["cuda", "cuda12"]),
        (["python/opmux/kernels/jit/csrc/layernorm_cpu.cpp"], ["cuda", "cuda12", "cpu"]),
        (["python/opmux/kernels/jit/include/opmux/cuda_utils.cuh"], ["cuda", "cuda12"]),
        (["python/opmux/kernels/jit/include/opmux/common.h"], ["cuda", "cuda12", "cpu"]),
        (["python/opmux/kernels/ops/layernorm/op.py"], list(TABLE)),
        (["targets.toml"], list(TABLE)),
        (["pyproject_npu.toml"], list(TABLE)),
        ([".github/workflows/ci.yml"], list(TABLE)),
        (["some/new/place.txt"], list(TABLE)),
    ],
)
def test_path_filter(paths, expected):
    assert changes.affected(paths, TABLE) == expected


def test_ci_workflow_consumes_the_matrix(root):
    _, wf = _workflow(root, "ci.yml")
    jobs = wf["jobs"]
    run = jobs["changes"]["steps"][-1]["run"]
    assert "tools/ci_matrix.py" in run and "--github-output" in run
    out = ci_matrix.matrix(TABLE)
    for key in ("cpu", "gpu", "gpu-count", "targets"):
        assert jobs["changes"]["outputs"][key] == f"${{{{ steps.matrix.outputs.{key} }}}}"
        assert key in {**out, "gpu-count": 0}
    assert jobs["cpu"]["strategy"]["matrix"] == "${{ fromJSON(needs.changes.outputs.cpu) }}"
    assert jobs["gpu"]["strategy"]["matrix"] == "${{ fromJSON(needs.changes.outputs.gpu) }}"
    assert jobs["gpu"]["runs-on"] == "${{ matrix.runs-on }}"
    assert set(jobs["pass"]["needs"]) == set(jobs) - {"pass"}
    assert "re-actors/alls-green" in jobs["pass"]["steps"][0]["uses"]


def test_release_workflow_gates_publishing(root):
    _, wf = _workflow(root, "release.yml")
    jobs = wf["jobs"]
    assert jobs["publish"]["needs"] == "check"
    assert set(jobs["check"]["needs"]) == {"sdist", "wheel"}
    assert jobs["publish"]["environment"]["name"] == "pypi"
    assert jobs["publish"]["permissions"]["id-token"] == "write"
    uses = [s.get("uses", "") for s in jobs["publish"]["steps"]]
    assert any(u.startswith("pypa/gh-action-pypi-publish@") for u in uses)
    assert any(u.startswith("actions/attest-build-provenance@") for u in uses)
    assert not any("password" in (s.get("with") or {}) for s in jobs["publish"]["steps"])
    assert "tools/ci_matrix.py --release" in jobs["sdist"]["steps"][-2]["run"]
    assert jobs["wheel"]["strategy"]["matrix"] == "${{ fromJSON(needs.sdist.outputs.matrix) }}"
    assert "nox -s release-check" in jobs["check"]["steps"][3]["run"]
    release = ci_matrix.release_matrix(TABLE)["include"]
    assert {e["target"] for e in release} == set(TABLE)
    for t in TABLE.values():  # every machine of a target with native code gets its own build
        machines = {e["machine"] for e in release if e["target"] == t.name}
        assert machines == (set(t.machines) if t.aot.libraries else {"x86_64"})


@pytest.mark.parametrize("name", ["ci.yml", "release.yml"])
def test_workflow_hygiene(root, name):
    text, wf = _workflow(root, name)
    assert wf["permissions"] == {}
    assert "concurrency" in wf
    for job in wf["jobs"].values():
        assert "permissions" in job
    for step in _steps(wf):
        if "uses" in step:
            line = next(ln.strip() for ln in text.splitlines() if f"uses: {step['uses']}" in ln)
            assert PINNED.match(line.removeprefix("- ").removeprefix("uses: ")), line
        if step.get("uses", "").startswith("actions/checkout@"):
            assert step["with"]["persist-credentials"] is False
        assert "${{" not in step.get("run", ""), f"interpolation in run: {step['run']!r}"


def test_docs_agree_with_the_table(root):
    readme = (root / "README.md").read_text(encoding="utf-8")
    for t in TABLE:
        assert f"`wheel-{t}`" in readme
    for session in ("`sdist`", "`reproducible`", "`lint`", "`variants`"):
        assert session in readme
    arch = (root / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"libopmux_aot_\w+\.so", arch))
    assert named and named <= {f for t in TABLE.values() for f in t.aot.filenames}


def test_owners_and_labels_cover_every_op_group(root):
    ops = root / "python" / "opmux" / "kernels" / "ops"
    groups = sorted(p.name for p in ops.iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))
    owners = (root / ".github" / "CODEOWNERS").read_text(encoding="utf-8")
    labels = yaml.safe_load((root / ".github" / "labeler.yml").read_text(encoding="utf-8"))
    globs = json.dumps(labels)
    for group in groups:
        assert f"/python/opmux/kernels/ops/{group}/**" in owners, group
        assert f"python/opmux/kernels/ops/{group}/**" in globs, group
    for path in ("/csrc/", "/python/opmux/kernels/jit/**", "/targets.toml", "/setup.py"):
        assert path in owners
    dependabot = yaml.safe_load((root / ".github" / "dependabot.yml").read_text(encoding="utf-8"))
    (update,) = dependabot["updates"]
    assert update["package-ecosystem"] == "github-actions" and update["groups"]
