"""Issue 20 item 11: `servedeck log MODEL` (what the seed's notes say) is `servedeck logs MODEL`."""

from __future__ import annotations

import re

from typer.testing import CliRunner

from servedeck.cli import root_app as app
from servedeck.deck import launch as L
from servedeck.errors import UsageError

LINES = [f"engine line {i}" for i in range(1, 8)]


def _launch_with_log(model: str) -> None:
    d = L.new_launch_dir(model)
    (d / "engine.log").write_text("\n".join(LINES) + "\n")


def test_log_prints_the_same_lines_as_logs_with_the_same_options():
    _launch_with_log("qwen27b")
    runner = CliRunner()
    log = runner.invoke(app, ["log", "qwen27b", "-n", "3"])
    assert log.exit_code == 0, log.output
    assert log.stdout.splitlines() == LINES[-3:]


def test_log_of_a_model_never_launched_says_so_as_logs_does():
    runner = CliRunner()
    log = runner.invoke(app, ["log", "never-started"])
    logs = runner.invoke(app, ["logs", "never-started"])
    assert log.exit_code == logs.exit_code
    assert str(log.exception) == str(logs.exception)


def test_log_is_not_listed_in_help():
    names = re.findall(r"^│ (\S+)", CliRunner().invoke(app, ["--help"]).output, re.M)  # the command column
    assert "logs" in names
    assert "log" not in names


def test_launch_counting_back_past_the_first_is_a_usage_error_naming_the_launches():
    """Issue 31 item 11: `log MODEL --launch -2` with one launch was an IndexError traceback."""
    _launch_with_log("qwen27b")
    runner = CliRunner()
    for ref in ("-2", "0", "2", "-99"):
        r = runner.invoke(app, ["log", "qwen27b", "--launch", ref])
        assert isinstance(r.exception, UsageError) and r.exception.exit_code == 2, (ref, r.output, r.exception)
        assert "1 launch" in str(r.exception) and "-1" in r.exception.hint, (ref, str(r.exception))
    ok = runner.invoke(app, ["log", "qwen27b", "--launch", "-1", "-n", "2"])
    assert ok.exit_code == 0 and ok.stdout.splitlines() == LINES[-2:]
    first = runner.invoke(app, ["log", "qwen27b", "--launch", "1", "-n", "1"])
    assert first.exit_code == 0 and first.stdout.splitlines() == LINES[-1:]
