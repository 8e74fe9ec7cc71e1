"""Issue 8 defect 5: a damaged JSON-lines file is never read silently.

Only a torn last line (a crash mid-append) is skipped quietly, and even that is counted; every other
unreadable line is counted, and `history`, `notices`, `crashes` and `runs show` say how many."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from servedeck import paths
from servedeck.cli import root_app as app
from servedeck.deck import state as S
from servedeck.fsio import read_jsonl
from servedeck.runs.read import load
from servedeck.watch.notices import Notices, read_notices


def test_only_a_torn_last_line_is_quiet(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text('{"a": 1}\nnot json\n{"a": 2}\n[1, 2]\n{"a": 3}\n{"a": 4, "b')
    rows = read_jsonl(f)
    assert [r["a"] for r in rows] == [1, 2, 3]
    assert rows.skipped == 2 and rows.torn == 1
    assert "2 line(s) could not be read" in rows.warning(f) and "line 2" in rows.warning(f)


def test_torn_last_line_alone_needs_no_warning(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text('{"a": 1}\n{"a": 2, "b')
    rows = read_jsonl(f)
    assert len(rows) == 1 and rows.skipped == 0 and rows.torn == 1 and rows.warning(f) is None


def test_a_complete_last_line_that_is_garbage_is_not_torn(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text('{"a": 1}\ngarbage\n')
    rows = read_jsonl(f)
    assert rows.skipped == 1 and rows.torn == 0


def _damage(path):
    with open(path, "a") as fh:
        fh.write("this line is not json\n")


def test_history_and_crashes_say_lines_were_lost():
    S.journal("start", "m", "ok")
    _damage(paths.journal_file())
    S.journal("stop", "m", "ok")
    assert len(S.read_journal("m")) == 2 and S.read_journal("m").skipped == 1
    for argv in (["history"], ["history", "--json"], ["crashes"]):
        r = CliRunner().invoke(app, argv)
        assert r.exit_code == 0, r.output
        assert "1 line(s) could not be read" in r.output, (argv, r.output)
    r = CliRunner().invoke(app, ["history", "--json"])
    assert "1 line(s)" not in r.stdout  # the warning goes to stderr; stdout stays JSON
    assert len(json.loads(r.stdout)) == 2


def test_notices_say_lines_were_lost():
    n = Notices()
    n.emit("crashed", "m", "one")
    _damage(paths.notices_file())
    n.emit("relaunch", "m", "two")
    assert read_notices().skipped == 1
    r = CliRunner().invoke(app, ["notices"])
    assert r.exit_code == 0 and "1 line(s) could not be read" in r.output and "two" in r.output


def test_runs_show_counts_unparseable_request_lines(tmp_path):
    run = tmp_path / "m__single__2K__llamacpp__1130-120000"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"status": "ok", "kind": "bench", "points": []}))
    (run / "requests.jsonl").write_text("not json\n" + '{"point": 0, "kind": "measured"')
    view = load(run)
    assert view["requests"]["unreadable"] == 1 and view["requests"]["torn_last_line"] is True
    assert any("1 of 1 lines of requests.jsonl could not be read" in w for w in view["warnings"]), view["warnings"]
