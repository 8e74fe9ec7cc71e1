"""Issue 36 item 9: state files of the wrong shape. Valid JSON of the wrong shape (a live record that is
a list, a journal line with no outcome, a summary.json whose points are a string, a desired.json that
is not JSON) crashed status, start, stop --all, restore, history, runs, show and report with
AttributeError/KeyError tracebacks, and the engine could not be stopped. Every state file is validated
on read: the file and what is wrong are named, it is skipped or set aside, and `stop` always works.
The engine cases run on a real llama-server, through the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servedeck import paths
from servedeck.deck import Deck
from servedeck.deck import state as S
from servedeck.supervisor.process import group_members, port_holder

SERVEDECK = str(Path(sys.executable).with_name("servedeck"))
RECORDED_RUN = (Path(__file__).parents[2] / "docs" / "gpu-runs" / "campaign-h200-cache-ram-2026-12-01" / "results"
                / "runs" / "r8b__default__4k__llamacpp__1201-094803")


def sd(cfg: Path | None, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    cmd = [SERVEDECK, *(["--config", str(cfg)] if cfg else []), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def _live_file(model: str) -> Path:
    return paths.live_dir() / f"{model}.json"


@pytest.mark.engine
@pytest.mark.llamacpp
def test_a_live_record_that_is_a_list_loses_no_engine(deck_config):
    """The issue's case: [1,2,3] in place of a running engine's record."""
    cfg = deck_config.path
    rec = Deck(deck_config).start("smollm2").record
    _live_file("smollm2").write_text("[1, 2, 3]\n")

    st = sd(cfg, "status", "--json")
    assert st.returncode == 0, st.stderr
    [row] = json.loads(st.stdout)
    assert row["model"] == "smollm2" and row["state"] == "ready" and row["pid"] == rec.pid, row  # found by its launch
    assert "live/smollm2.json" in st.stderr and "not a JSON object" in st.stderr, st.stderr

    again = sd(cfg, "start", "smollm2")
    assert again.returncode == 0 and "already running" in again.stdout, (again.stdout, again.stderr)
    restore = sd(cfg, "restore")
    assert restore.returncode == 0 and "smollm2: adopted" in restore.stdout, (restore.stdout, restore.stderr)

    _live_file("smollm2").write_text("[1, 2, 3]\n")  # start/restore may have rewritten it: damage it again
    stop = sd(cfg, "stop", "--all")
    assert stop.returncode == 0 and "smollm2: stopped" in stop.stdout, (stop.stdout, stop.stderr)
    assert not group_members(rec.pgid) and port_holder(rec.port) is None  # the engine is gone
    kept = list(paths.live_dir().glob("smollm2.json.corrupt-*"))
    assert len(kept) == 1 and kept[0].read_text() == "[1, 2, 3]\n"  # the evidence set aside, not deleted
    assert S.all_live() == {} and json.loads(sd(cfg, "status", "--json").stdout) == []


@pytest.mark.parametrize("text, problem", [
    ("[1, 2, 3]", "not a JSON object (a list)"),
    ('"x"', "not a JSON object (a string)"),
    ('{"model": "ghost", "engine": "llamacpp", "build": "b", "slot": "main", "port": "eighty", "launch_dir": "/x", '
     '"pid": null, "pgid": null, "create_time": null, "owner_pid": 1}', "port"),
    ('{"model": "ghost"}', "missing"),
    ('{"model": "ghost", "engine": "llamacpp", "build": "b", "slot": "main", "port": 1, "launch_dir": "/x", '
     '"pid": null, "pgid": null, "create_time": null, "owner_pid": 1, "state": "dancing"}', "state"),
])
def test_an_unreadable_live_record_with_nothing_running_is_shown_then_set_aside(tmp_path, text, problem):
    _live_file("ghost").write_text(text)
    assert S.all_live() == {}  # skipped, never a crash
    assert problem in S.unreadable_live()["ghost"], S.unreadable_live()
    st = sd(None, "status", "--json")
    assert st.returncode == 0, st.stderr
    [row] = json.loads(st.stdout)
    assert row["model"] == "ghost" and row["state"] == "unreadable" and problem in row["detail"], row
    stop = sd(None, "stop", "--all")
    assert stop.returncode == 0, stop.stderr
    assert "ghost" in stop.stdout and "set aside" in stop.stdout, stop.stdout
    assert not _live_file("ghost").exists() and list(paths.live_dir().glob("ghost.json.corrupt-*"))
    assert json.loads(sd(None, "status", "--json").stdout) == []


def test_journal_lines_of_the_wrong_shape_are_left_out_and_said(tmp_path):
    S.journal("start", "m", "ready")
    with open(paths.journal_file(), "a") as fh:
        fh.write(json.dumps({"ts": "2026-12-01T00:00:00+00:00", "event": "start", "model": "m"}) + "\n")  # no outcome
        fh.write(json.dumps({"ts": 5, "event": ["x"], "outcome": "ready"}) + "\n")  # wrong types
    S.journal("stop", "m", "stopped")
    h = sd(None, "history", "--json")
    assert h.returncode == 0, h.stderr
    assert [r["outcome"] for r in json.loads(h.stdout)] == ["ready", "stopped"]
    assert "journal.jsonl: 2 line(s) could not be read" in h.stderr and "outcome" in h.stderr, h.stderr
    table = sd(None, "history")
    assert table.returncode == 0 and "stopped" in table.stdout, table.stderr


def test_a_watch_file_of_the_wrong_shape_hides_advice_not_state():
    S.set_desired("m", {"model": {}, "build_name": "b", "build": {}})
    S.watch_file().write_text(json.dumps({"models": [1, 2], "liveness": "x"}))
    st = sd(None, "status", "--json")
    assert st.returncode == 0, st.stderr
    assert [(r["model"], r["state"]) for r in json.loads(st.stdout)] == [("m", "absent")]


def _recorded_run(tmp_path: Path, **summary_changes) -> Path:
    root = tmp_path / "results" / "runs"
    run = root / RECORDED_RUN.name
    shutil.copytree(RECORDED_RUN, run)
    doc = json.loads((run / "summary.json").read_text())
    doc.update(summary_changes)
    (run / "summary.json").write_text(json.dumps(doc))
    return run


@pytest.mark.parametrize("changes, problem", [
    ({"points": "x"}, "points"),
    ({"workload": [1]}, "workload"),
    ({"gates": "passed"}, "gates"),
    ({"status": 7}, "status"),
])
def test_a_summary_of_the_wrong_shape_is_named_and_the_run_still_reads(tmp_path, changes, problem):
    from servedeck.report.render import list_row, markdown
    from servedeck.runs.read import load

    run = _recorded_run(tmp_path, **changes)
    view = load(run)
    assert view["status"] == "failed" and "summary.json" in view["reason"] and problem in view["reason"], view
    assert view["requests"]["lines"] > 0 and view["points"]  # figures rebuilt from requests.jsonl
    assert problem in list_row(view)["reason"] and problem in markdown(view)


def test_runs_show_and_report_read_a_summary_whose_points_are_a_string(tmp_path, monkeypatch):
    """The issue's case through the real CLI."""
    run = _recorded_run(tmp_path, points="x")
    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results"))
    monkeypatch.chdir(tmp_path)
    for args in (["runs"], ["show", run.name], ["report", run.name]):
        r = sd(None, *args)
        assert r.returncode == 0, (args, r.stdout, r.stderr)
        said = r.stdout + r.stderr
        if args[0] == "report":  # the report says it in the file it writes
            said = Path(r.stdout.splitlines()[0]).read_text()
        assert "summary.json" in said and "points" in said, (args, said[-2000:])


@pytest.mark.engine
@pytest.mark.llamacpp
def test_a_corrupt_desired_json_does_not_block_stop_all(deck_config):
    cfg = deck_config.path
    rec = Deck(deck_config).start("smollm2").record
    paths.desired_file().write_text("{not json")
    stop = sd(cfg, "stop", "--all")
    assert stop.returncode == 0, (stop.stdout, stop.stderr)
    assert "smollm2: stopped" in stop.stdout, stop.stdout
    assert "desired.json" in stop.stderr and "corrupt" in stop.stderr, stop.stderr
    assert not group_members(rec.pgid) and port_holder(rec.port) is None
    st = sd(cfg, "status", "--json")
    assert st.returncode == 0 and json.loads(st.stdout) == [] and "desired.json" in st.stderr, st.stderr


@pytest.mark.engine
@pytest.mark.llamacpp
def test_launch_and_exit_records_of_the_wrong_shape_do_not_stop_a_stop(deck_config):
    cfg = deck_config.path
    rec = Deck(deck_config).start("smollm2").record
    d = Path(rec.launch_dir)
    (d / "launch.json").write_text("[1]")
    (d / "engine.json").write_text('"pid"')
    stop = sd(cfg, "stop", "smollm2")
    assert stop.returncode == 0 and "smollm2: stopped" in stop.stdout, (stop.stdout, stop.stderr)
    assert not group_members(rec.pgid)
    assert json.loads((d / "launch.json").read_text())["state"] == "stopped"
    assert (d / "launch.json.corrupt").read_text() == "[1]"
    # and a crash record that is not an object is read as "no exit record", not a crash of status
    rec = Deck(deck_config).start("smollm2").record
    os.killpg(rec.pgid, 9)
    import time

    while group_members(rec.pgid):
        time.sleep(0.05)
    (Path(rec.launch_dir) / "exit.json").write_text("[0]")
    st = sd(cfg, "status", "--json")
    assert st.returncode == 0, st.stderr
    assert [r["state"] for r in json.loads(st.stdout)] == ["crashed"]
