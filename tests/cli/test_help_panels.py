"""Issue 35 item 3: `servedeck --help` in the order of a user's day, and `servedeck` alone says what to do first.

Read from the help as a user sees it (typer's rich rendering), not from cli/panels.py's list."""

from __future__ import annotations

import re

import typer
from typer.testing import CliRunner

from servedeck.cli import root_app as app
from servedeck.cli.panels import HIDDEN, arrange

WIDE = {"COLUMNS": "200", "TERM": "dumb"}


def panels(output: str) -> list[tuple[str, list[str]]]:
    """[(panel title, [command, ...])] in the order the help prints them."""
    out: list[tuple[str, list[str]]] = []
    for line in output.splitlines():
        title = re.match(r"^╭─ (.+?) ─", line)
        if title:
            out.append((title.group(1), []))
            continue
        cmd = re.match(r"^│ ([a-z][a-z-]*)\s", line)
        if cmd and out and out[-1][0] != "Options":
            out[-1][1].append(cmd.group(1))
    return [(t, c) for t, c in out if t != "Options"]


def help_output(*args: str) -> str:
    r = CliRunner().invoke(app, [*args], env=WIDE)
    assert r.exit_code == 0, r.output
    return r.output


def test_the_help_starts_with_init_start_switch_status():
    shown = panels(help_output("--help"))
    first_title, first = shown[0]
    assert first_title.startswith("The deck")
    assert first[:4] == ["init", "start", "switch", "status"]


def test_every_command_is_in_a_panel_once_and_measurement_comes_after_the_deck():
    shown = panels(help_output("--help"))
    listed = [c for _, cmds in shown for c in cmds]
    registered = {c.name for c in typer.main.get_command(app).commands.values() if not c.hidden}
    assert sorted(listed) == sorted(registered)  # each once, none unplaced
    titles = [t for t, _ in shown]
    assert len(titles) >= 5
    assert titles.index("Measure one server") > titles.index("Know before you launch") > 0
    for hidden in HIDDEN:
        assert hidden not in listed


def test_a_command_in_no_panel_is_refused_with_where_to_place_it():
    extra = typer.Typer()

    @extra.command("brand-new")
    def _brand_new() -> None:
        pass

    try:
        arrange(extra)
    except RuntimeError as e:
        assert "brand-new" in str(e) and "cli/panels.py" in str(e)
    else:
        raise AssertionError("an unplaced command was accepted")


def test_servedeck_alone_says_init_where_there_is_no_models_toml(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SERVEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SERVEDECK_CONFIG", raising=False)
    out = help_output()
    assert "What to do first" in out
    assert "`servedeck init`" in out
    assert panels(out)[0][1][:4] == ["init", "start", "switch", "status"]  # and the help itself


def test_servedeck_alone_says_status_where_a_models_toml_is_found(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SERVEDECK_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SERVEDECK_CONFIG", raising=False)
    (tmp_path / "models.toml").write_text("")
    out = help_output()
    first = out.split("What to do first", 1)[1]
    assert "`servedeck status`" in first and "servedeck init" not in first
