"""A command line imports only the module its command is written in (servedeck/cli/__init__.py's HOMES):
`servedeck status` does not load the measuring and campaign tree. The table is checked against what the
modules register, so a command added or moved without it fails here, not for a user."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from servedeck.cli import HOMES, MODULES, command_of, root_app
from servedeck.cli.panels import name_of


def registered_homes() -> dict[str, str]:
    app = root_app
    homes = {name_of(c): c.callback.__module__ for c in app.registered_commands}
    for g in app.registered_groups:
        homes[g.name] = {c.callback.__module__ for c in g.typer_instance.registered_commands}.pop()
    return {name: module.rsplit(".", 1)[1] for name, module in homes.items()}


def test_every_command_is_found_in_the_module_that_registers_it():
    assert HOMES == registered_homes()


@pytest.mark.parametrize("argv, command", [
    ([], None), (["--help"], None), (["status"], "status"), (["--config", "m.toml", "start", "x"], "start"),
    (["-c", "m.toml", "bench", "--help"], "bench"), (["--config=m.toml", "campaign", "run"], "campaign"),
    (["-cm.toml", "serve"], "serve"), (["--nope", "status"], None), (["stop", "--config", "x"], "stop"),
])
def test_the_command_is_the_first_word_past_the_roots_options(argv, command):
    assert command_of(argv) == command


def loaded_by(argv: list[str]) -> dict:
    code = ("import json, sys; from servedeck.cli import register; from servedeck.cli.panels import name_of; "
            "app = register(sys.argv[1:]); "
            "print(json.dumps({'commands': sorted(name_of(c) for c in [*app.registered_commands, *app.registered_groups]), "
            "'modules': sorted(m for m in sys.modules if m.startswith('servedeck.'))}))")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_a_deck_command_loads_the_deck_and_not_the_measuring_tree():
    got = loaded_by(["--config", "models.toml", "status", "--json"])
    assert set(got["commands"]) == {n for n, m in HOMES.items() if m == "deck"}
    heavy = [m for m in got["modules"] if m.startswith(("servedeck.workloads", "servedeck.cli.campaign",
                                                         "servedeck.report", "servedeck.door.server"))]
    assert not heavy, heavy


def test_help_and_unknown_names_load_every_command():
    for argv in ([], ["--help"], ["stauts"]):
        assert set(loaded_by(argv)["commands"]) == set(HOMES), argv


@pytest.mark.parametrize("module", MODULES)
def test_each_modules_commands_run_alone(module):
    """One command of each module, in a process that has loaded that module only: its help renders."""
    name = next(n for n, m in HOMES.items() if m == module and n != "log")
    r = subprocess.run([sys.executable, "-m", "servedeck", name, "--help"], capture_output=True, text=True,
                       timeout=60, env={"COLUMNS": "200", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and "Usage:" in r.stdout and name in r.stdout, r.stdout + r.stderr
