"""The page as a new user meets it after the demo (issue 49, item 4): one launch of the starter's SmolLM2 on
llama.cpp, one small bench on it, made for real once for the module. The rebuilt command makes a run with the
same settings; one launch reads `1 time`, `1 launch`; the Last boot sentence ends in words; a binary build with
no package record gets no `verify-build` suggestion; and `page` writes nothing, not even a state folder."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from ports import starter_toml

SERVEDECK = str(Path(sys.executable).with_name("servedeck"))
# small on purpose (a shared 2-core machine), and every option the page must give back
BENCH = ["--workload", "chat", "--concurrency", "1,2", "--input-tokens", "64", "--output-tokens", "8",
         "--requests", "3", "--warmup", "1", "--seed", "5", "--no-gate"]


def sd(cfg: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    r = subprocess.run([SERVEDECK, "--config", str(cfg), *args], capture_output=True, text=True, timeout=timeout,
                       cwd=cfg.parent, env=env or dict(os.environ))
    assert r.returncode == 0, f"servedeck {' '.join(args)} → {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


@dataclass
class Once:
    cfg: Path
    bench: dict  # the first bench's summary (--json)
    md: str  # the page, as Markdown
    doc: dict  # the page's document


@pytest.fixture(scope="module")
def once(page_home, tmp_path_factory, engines_ready) -> Once:
    tmp = tmp_path_factory.mktemp("first-hour")
    cfg = tmp / "models.toml"
    cfg.write_text(starter_toml())
    sd(cfg, "start", "smollm2", timeout=180)
    bench = json.loads(sd(cfg, "bench", "smollm2", *BENCH, "--json").stdout)
    return Once(cfg, bench, sd(cfg, "page", "smollm2").stdout, json.loads(sd(cfg, "page", "smollm2", "--json").stdout))


def test_the_rebuilt_command_makes_a_run_with_the_same_settings(once):
    [entry] = [r for g in once.doc["sections"]["measured"]["by_engine_version"] for r in g["runs"]]
    command = entry["provenance"]["command"]
    argv = shlex.split(command)
    assert argv[:2] == ["servedeck", "bench"], command
    again = json.loads(sd(once.cfg, *argv[1:], "--json").stdout)
    assert again["run"] != once.bench["run"]
    assert again["workload"] == once.bench["workload"], command
    assert again["gate"]["status"] == once.bench["gate"]["status"] == "not run"


def test_one_launch_reads_in_the_singular(once):
    assert "launched in exactly this form 1 time," in once.md
    assert "1 launch became ready" in once.md
    assert "1 times" not in once.md and "1 launches" not in once.md


def test_the_last_boot_sentence_ends_in_words_not_a_dangling_holds(once):
    line = next(ln for ln in once.md.splitlines() if ln.startswith("Last boot: "))
    assert line.endswith("; its figures still hold against today's entry"), line


def test_a_binary_with_no_package_record_gets_no_verify_build_suggestion(once):
    assert once.doc["sections"]["build"]["kind"] == "binary" and once.doc["sections"]["build"]["requires"] == []
    assert "verify-build" not in once.md
    assert "no package record to verify it against" in once.md


def test_doctors_rows_are_named_by_what_they_are(once):
    rows = once.doc["sections"]["next"]["doctor"]
    statuses = {r["status"] for r in rows}
    line = next(ln for ln in once.md.splitlines() if ln.startswith("`servedeck doctor smollm2`: "))
    if statuses == {"SKIP"}:
        assert f"{len(rows)} of {once.doc['sections']['next']['doctor_rows']} rows are SKIP" in line, line
    else:  # each status counted, not a blanket "not OK"
        assert re.search(r"rows are not OK \(\d+ (FAIL|WARN|SKIP)(, \d+ (FAIL|WARN|SKIP))*\)", line), line


def test_four_skips_of_nine_are_said_as_skips():
    from servedeck.page.sections import not_ok

    assert not_ok([{"status": "SKIP"}] * 4, 9) == "4 of 9 rows are SKIP"
    assert not_ok([{"status": "WARN"}, {"status": "SKIP"}], 9) == "2 of 9 rows are not OK (1 WARN, 1 SKIP)"


def test_page_writes_nothing_not_even_a_state_folder(once, tmp_path):
    home = tmp_path / "never-made"
    env = {**os.environ, "SERVEDECK_HOME": str(home), "SERVEDECK_RESULTS": str(tmp_path / "no-results")}
    r = sd(once.cfg, "page", "smollm2", env=env)
    assert "Nothing was written" in r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == [], list(tmp_path.iterdir())
