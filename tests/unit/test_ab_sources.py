"""benchmarks/ab_sources.sh: one command run on the tree and then on other revisions' copies of
some files, the tree's files back afterwards whatever the command did."""

from __future__ import annotations

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
