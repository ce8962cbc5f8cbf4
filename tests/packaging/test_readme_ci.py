"""README.md starts with the commands .ci/run runs, and its target table matches targets.toml."""

from __future__ import annotations

import re

from tools import targets

MAIN = "python3 -m pip install nox && nox -s release-rehearsal -- --targets cpu"
TESTS = "python3 -m pip install nox && nox -s tests"


def _blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```bash\n(.*?)```", text, flags=re.S)]


def test_readme_begins_with_the_two_commands(root):
    readme = (root / "README.md").read_text(encoding="utf-8")
    assert _blocks(readme)[:2] == [MAIN, TESTS]


def test_ci_runs_exactly_the_readme_commands(root):
    ci = (root / ".ci" / "run").read_text(encoding="utf-8")
    assert f'MAIN_CMD="{MAIN}"' in ci
    assert f'TEST_CMD="{TESTS}"' in ci
    assert ci.startswith("#!/usr/bin/env bash") and "set -euo pipefail" in ci


def test_readme_target_table_matches_targets_toml(root):
    readme = (root / "README.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- targets-table: begin[^>]*-->\n(.*?)<!-- targets-table: end -->", readme, flags=re.S)
    assert m, "README.md lacks the generated target table markers"
    assert m.group(1) == targets.markdown_table(targets.load()), "regenerate with `python tools/targets.py`"


def test_nox_sessions_match_the_targets(root):
    noxfile = (root / "noxfile.py").read_text(encoding="utf-8")
    assert 'name=f"wheel-{_t.name}"' in noxfile and 'name=f"parity-{_t.name}"' in noxfile
    for name in ("import-smoke", "find-spec"):
        assert f'name="{name}"' in noxfile
