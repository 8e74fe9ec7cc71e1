"""The house checks, run by CI (issue 50, item 6): ruff's rules (pyproject.toml's [tool.ruff] says which and
why) over the whole tree, and mypy over src/ never past its baseline: tests/meta/mypy-baseline.json holds each
file's count of errors, and a file whose count grows fails here with its errors listed.

Both tools come from .venv, pinned in pyproject.toml's `test` dependency group (scripts/setup.sh installs it).
After fixing type errors, write the lower counts: `.venv/bin/python tests/meta/test_lint.py --write-baseline`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BASELINE = Path(__file__).with_name("mypy-baseline.json")
LINTED = ["src", "tests", "bench", "scripts"]
ERROR = re.compile(r"^(?P<path>[^:\s]+\.py):\d+: error: .*\[(?P<code>[a-z-]+)\]$")


def tool(name: str) -> str:
    exe = Path(sys.executable).parent / name
    if not exe.exists():
        pytest.fail(f"{name} is not installed beside {sys.executable}: run scripts/setup.sh, which installs "
                    f"pyproject.toml's `test` dependency group")
    return str(exe)


def ruff(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([tool("ruff"), "check", "--no-cache", "--output-format", "concise", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)


def mypy_errors() -> tuple[Counter, list[str]]:
    """Errors per file of `mypy` run with pyproject.toml's [tool.mypy], and its error lines."""
    r = subprocess.run([tool("mypy")], cwd=REPO, capture_output=True, text=True, timeout=600)
    lines = [ln for ln in r.stdout.splitlines() if ERROR.match(ln)]
    if r.returncode not in (0, 1) or (r.returncode == 1 and not lines):
        pytest.fail(f"mypy did not run (exit {r.returncode}):\n{r.stdout[-3000:]}{r.stderr[-3000:]}")
    return per_file(lines), lines


def per_file(lines: list[str]) -> Counter:
    return Counter(m["path"] for ln in lines if (m := ERROR.match(ln)))


def grown(now: Counter, baseline: dict[str, int]) -> dict[str, tuple[int, int]]:
    """Files with more errors than their baseline: (baseline, now); a file not in it has a baseline of 0."""
    return {f: (baseline.get(f, 0), n) for f, n in sorted(now.items()) if n > baseline.get(f, 0)}


def test_ruff_finds_nothing_in_the_tree():
    r = ruff(*LINTED)
    assert r.returncode == 0, f"ruff check {' '.join(LINTED)}:\n{r.stdout}{r.stderr}"


def test_ruffs_rules_are_the_repositorys(tmp_path: Path):
    # the configuration is read: an undefined name (F821) and a `raise` without `from` in an `except` (B904)
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    try:\n        return x\n    except KeyError:\n        raise ValueError('no x')\n")
    r = ruff("--config", str(REPO / "pyproject.toml"), str(bad))
    assert r.returncode == 1 and "F821" in r.stdout and "B904" in r.stdout, r.stdout + r.stderr


def test_a_file_past_its_baseline_is_named():
    lines = ["src/servedeck/a.py:3: error: Incompatible types  [assignment]",
             "src/servedeck/a.py:9: error: Missing return  [return]",
             "src/servedeck/b.py:1: note: See https://mypy.rtfd.io",
             "src/servedeck/c.py:1: error: Name \"x\" is not defined  [name-defined]"]
    assert grown(per_file(lines), {"src/servedeck/a.py": 2, "src/servedeck/c.py": 0}) == {"src/servedeck/c.py": (0, 1)}


def test_mypy_errors_never_grow_past_the_baseline():
    now, lines = mypy_errors()
    baseline = json.loads(BASELINE.read_text())
    over = grown(now, baseline)
    shown = [ln for ln in lines if ERROR.match(ln)["path"] in over]
    assert not over, (f"mypy: more errors than tests/meta/mypy-baseline.json allows in "
                      f"{', '.join(f'{f} ({b} -> {n})' for f, (b, n) in over.items())}; fix them "
                      f"(docs/contributing.md says how the checks run):\n" + "\n".join(shown))


if __name__ == "__main__":
    if sys.argv[1:] != ["--write-baseline"]:
        sys.exit("usage: .venv/bin/python tests/meta/test_lint.py --write-baseline")
    counts, _ = mypy_errors()
    BASELINE.write_text(json.dumps(dict(sorted(counts.items())), indent=1) + "\n")
    print(f"{BASELINE}: {sum(counts.values())} errors in {len(counts)} files")
