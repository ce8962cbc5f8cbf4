"""benchmarks/ab_sources.sh: one command run on the tree and then on other revisions' copies of
some files, the tree's files back afterwards whatever the command did."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "ab_sources.sh"

pytestmark = pytest.mark.skipif(
    shutil.which("git") is None or shutil.which("bash") is None, reason="needs git and bash"
)


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def _ab(repo: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=repo, capture_output=True, text=True)


@pytest.fixture
def repo(tmp_path: Path) -> tuple[Path, str, str]:
    """A repository whose kernel file reads v1 at its first commit, v2 on branch wip/two, and v3
    (uncommitted) in the tree."""
    r = tmp_path / "repo"
    (r / "src").mkdir(parents=True)
    _git(r, "init", "-q")
    _git(r, "config", "user.email", "t@example.com")
    _git(r, "config", "user.name", "t")
    kernel = r / "src" / "k.cu"
    kernel.write_text("v1\n")
    (r / "src" / "other.txt").write_text("same\n")
    _git(r, "add", ".")
    _git(r, "commit", "-qm", "one")
    first = _git(r, "rev-parse", "--short", "HEAD")
    _git(r, "checkout", "-qb", "wip/two")
    kernel.write_text("v2\n")
    _git(r, "commit", "-qam", "two")
    kernel.write_text("v3\n")
    return r, first, "wip/two"


def test_each_side_runs_its_own_copy_and_the_tree_comes_back(repo: tuple[Path, str, str]) -> None:
    r, first, branch = repo
    assert _ab(r, "prepare", first, "src/k.cu").returncode == 0
    made = _ab(r, "prepare", branch, "src/k.cu")
    assert made.returncode == 0, made.stderr
    assert (r / ".ab" / "wip_two" / "src" / "k.cu").read_text() == "v2\n"  # a revision's slash: '_'
    out = r / "out"
    cmd = f"mkdir -p {out} && cat src/k.cu > {out}/{{side}}.txt"
    done = _ab(r, "run", f".ab/{first}", ".ab/wip_two", "--", "bash", "-c", cmd)
    assert done.returncode == 0, done.stderr
    assert (out / "tree.txt").read_text() == "v3\n"
    assert (out / f"{first}.txt").read_text() == "v1\n"
    assert (out / "wip_two.txt").read_text() == "v2\n"
    assert (r / "src" / "k.cu").read_text() == "v3\n"
    assert [line for line in done.stdout.splitlines() if line.startswith("==")] == [
        "== ab_sources.sh: tree",
        f"== ab_sources.sh: {first}",
        "== ab_sources.sh: wip_two",
    ]


def test_a_failing_side_gives_its_status_and_the_tree_still_comes_back(repo: tuple[Path, str, str]) -> None:
    r, first, _ = repo
    assert _ab(r, "prepare", first, "src/k.cu").returncode == 0
    # fails on the base only (its copy reads v1), after the tree's side succeeded
    done = _ab(r, "run", f".ab/{first}", "--", "bash", "-c", "grep -q v3 src/k.cu || exit 7")
    assert done.returncode == 7
    assert (r / "src" / "k.cu").read_text() == "v3\n"


def test_misuse_is_refused_with_the_usage(repo: tuple[Path, str, str]) -> None:
    r, first, _ = repo
    missing = _ab(r, "run", ".ab/nothing", "--", "true")
    assert missing.returncode == 2 and "prepare first" in missing.stderr
    no_cmd = _ab(r, "run", f".ab/{first}")
    assert no_cmd.returncode == 2 and "usage" in no_cmd.stderr
    no_files = _ab(r, "prepare", first)
    assert no_files.returncode == 2 and "name the files" in no_files.stderr


def test_sides_named_alike_are_refused_before_anything_runs(
    repo: tuple[Path, str, str], tmp_path: Path
) -> None:
    r, first, _ = repo
    assert _ab(r, "prepare", first, "src/k.cu").returncode == 0
    other = tmp_path / "elsewhere" / first  # another folder of the same name
    shutil.copytree(r / ".ab" / first, other)
    ran = tmp_path / "ran"
    twice = _ab(r, "run", f".ab/{first}", str(other), "--", "touch", str(ran))
    assert twice.returncode == 2 and "two sides would be named" in twice.stderr
    tree = tmp_path / "tree"
    shutil.copytree(r / ".ab" / first, tree)
    as_tree = _ab(r, "run", str(tree), "--", "touch", str(ran))
    assert as_tree.returncode == 2 and "'tree'" in as_tree.stderr
    assert not ran.exists()


def test_a_side_name_with_an_ampersand_stays_itself(repo: tuple[Path, str, str]) -> None:
    r, _, _ = repo
    _git(r, "branch", "a&b", "wip/two")
    assert _ab(r, "prepare", "a&b", "src/k.cu").returncode == 0
    out = r / "out"
    done = _ab(
        r, "run", ".ab/a&b", "--", "bash", "-c", f"mkdir -p {out} && cat src/k.cu > '{out}/{{side}}.txt'"
    )
    assert done.returncode == 0, done.stderr
    assert (out / "a&b.txt").read_text() == "v2\n"


@pytest.fixture
def pyrepo(tmp_path: Path) -> tuple[Path, str]:
    """A repository whose python/k.cu reads v1 at its commit (prepared as a base) and v2 in the tree."""
    r = tmp_path / "repo"
    (r / "python").mkdir(parents=True)
    _git(r, "init", "-q")
    _git(r, "config", "user.email", "t@example.com")
    _git(r, "config", "user.name", "t")
    (r / "python" / "k.cu").write_text("v1\n")
    (r / "python" / "other.txt").write_text("same\n")
    _git(r, "add", ".")
    _git(r, "commit", "-qm", "one")
    first = _git(r, "rev-parse", "--short", "HEAD")
    (r / "python" / "k.cu").write_text("v2\n")
    assert _ab(r, "prepare", first, "python/k.cu").returncode == 0
    return r, first


def _run_prewarmed(
    r: Path, base: str, prewarm: str, caches: Path, *cmd: str
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "AB_PREWARM": "k_cuda other_cuda",
        "AB_PREWARM_CMD": prewarm,
        "AB_CACHE_ROOT": str(caches),
    }
    return subprocess.run(
        ["bash", str(SCRIPT), "run", base, "--", *cmd], cwd=r, capture_output=True, text=True, env=env
    )


def test_prewarm_builds_every_side_into_its_own_cache(pyrepo: tuple[Path, str], tmp_path: Path) -> None:
    """AB_PREWARM: each side's python/ (the side's files over the tree's) is prewarmed into
    AB_CACHE_ROOT/<side> before the runs, and each side's command runs with that cache."""
    r, first = pyrepo
    # a stand-in for `python -m opmux.kernels.jit prewarm`: "builds" the first PYTHONPATH entry's
    # sources into the cache, and records its arguments
    fake = tmp_path / "prewarm.sh"
    fake.write_text(
        'src=${PYTHONPATH%%:*}\ncat "$src/k.cu" "$src/other.txt" > "$OPMUX_CACHE_DIR/built"\n'
        'echo "$*" > "$OPMUX_CACHE_DIR/args"\necho "built $(head -1 "$src/k.cu")"\n'
    )
    caches, out = tmp_path / "caches", tmp_path / "out"
    cmd = f'mkdir -p {out} && cat "$OPMUX_CACHE_DIR/built" python/k.cu > {out}/{{side}}.txt'
    done = _run_prewarmed(r, f".ab/{first}", f"bash {fake}", caches, "bash", "-c", cmd)
    assert done.returncode == 0, done.stderr
    assert f"== ab_sources.sh: prewarm {first}: built v1" in done.stdout
    assert "== ab_sources.sh: prewarm tree: built v2" in done.stdout
    # each side's command saw its own cache, built from its own sources
    assert (out / "tree.txt").read_text() == "v2\nsame\nv2\n"
    assert (out / f"{first}.txt").read_text() == "v1\nsame\nv1\n"
    assert (caches / "tree" / "args").read_text().split()[-3:] == ["--modules", "k_cuda", "other_cuda"]
    assert (caches / "tree").stat().st_mode & 0o077 == 0  # opmux refuses a group-writable cache
    assert (r / "python" / "k.cu").read_text() == "v2\n"


def test_a_failed_prewarm_waits_for_the_others_and_runs_no_side(
    pyrepo: tuple[Path, str], tmp_path: Path
) -> None:
    r, first = pyrepo
    # the tree's build fails at once; the base's takes a moment, and must finish (not be left
    # running over source copies the script removes on exit)
    fake = tmp_path / "prewarm.sh"
    fake.write_text(
        'src=${PYTHONPATH%%:*}\ngrep -q v2 "$src/k.cu" && { echo broken; exit 3; }\n'
        'sleep 1; cat "$src/k.cu" > "$OPMUX_CACHE_DIR/built"\n'
    )
    caches, ran = tmp_path / "caches", tmp_path / "ran"
    done = _run_prewarmed(r, f".ab/{first}", f"bash {fake}", caches, "touch", str(ran))
    assert done.returncode == 1 and "prewarm tree failed" in done.stderr and "broken" in done.stderr
    assert (caches / first / "built").read_text() == "v1\n"
    assert not ran.exists()
    assert (r / "python" / "k.cu").read_text() == "v2\n"
