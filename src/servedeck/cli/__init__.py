"""Thin commands: parse, call one function, render. Each area's commands live in their own module."""

from __future__ import annotations

import sys

from rich.text import Text

# The Typer app is servedeck.cli.app.app: bound here as `app` it would hide the module cli/app.py.
from servedeck.cli.app import app as root_app, err_console
from servedeck.errors import ServedeckError

# Importing a module registers its commands on `root_app`.
from servedeck.cli import campaign, campaigns, cluster, deck, doctor, door, page, report, watch  # noqa: E402
from servedeck.cli.panels import arrange  # noqa: E402

arrange(root_app)  # the help in the order of a user's day (cli/panels.py)

__all__ = ["campaign", "campaigns", "cluster", "deck", "doctor", "door", "main", "page", "report", "watch"]


def main() -> None:
    try:
        root_app()
    except ServedeckError as e:
        # Text, not markup: messages quote user input such as "[models.x]", which rich would eat.
        err_console.print(Text("error: ", style="bold red") + Text(e.message), highlight=False, soft_wrap=True)
        if e.hint:
            err_console.print(Text("hint: ", style="yellow") + Text(e.hint), highlight=False, soft_wrap=True)
        log_tail = getattr(e, "log_tail", "")
        if log_tail:
            err_console.print("[dim]--- last lines of the engine log ---[/]")
            err_console.print(log_tail, markup=False, highlight=False, soft_wrap=True)
        sys.exit(e.exit_code)
    except KeyboardInterrupt:
        err_console.print("interrupted")
        sys.exit(130)
