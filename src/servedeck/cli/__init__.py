"""Thin commands: parse, call one function, render. Each area's commands live in their own module.

A command line imports only the module its command is written in: `servedeck start` loads cli/deck.py,
not the measuring and campaign tree (about half the start-up: tests/cli/test_lazy_commands.py, and the
suite runs the CLI hundreds of times). `--help`, no command or a name not in HOMES loads every module;
`from servedeck.cli import root_app` gives the app with every command registered."""

from __future__ import annotations

import importlib
import sys
from typing import Optional

from rich.text import Text

from servedeck.cli.app import err_console
from servedeck.errors import ServedeckError

# Which module registers each command and group; tests/cli/test_lazy_commands.py checks it against the
# registered commands, so a command moved or added elsewhere fails there, not for a user.
HOMES = {
    **dict.fromkeys(["init", "install", "start", "switch", "status", "stop", "sleep", "wake", "logs", "log", "render",
                     "restore", "history", "unit"], "deck"),
    **dict.fromkeys(["doctor", "plan", "gpu", "crashes", "verify-build"], "doctor"),
    **dict.fromkeys(["gate", "bench", "ramp", "runs", "show", "compare-outputs"], "campaign"),
    **dict.fromkeys(["report", "compare"], "report"),
    **dict.fromkeys(["watch", "notices", "soak"], "watch"),
    "page": "page", "hosts": "cluster", "serve": "door", "campaign": "campaigns", "tune": "tune",
}
MODULES = tuple(sorted(set(HOMES.values())))  # every command module, for --help and root_app


def command_of(argv: list[str]) -> Optional[str]:
    """The command a command line names, past the root's own options; None for --help or no command."""
    args = iter(argv)
    for a in args:
        if a in ("--config", "-c"):
            next(args, None)
        elif a.startswith("--config=") or (a.startswith("-c") and not a.startswith("--")):
            continue
        elif a.startswith("-"):
            return None
        else:
            return a
    return None


def register(argv: Optional[list[str]] = None):
    """Import the command modules `argv` needs (every one when argv is None or names no known command),
    place them in the help's panels, and return the root app."""
    from servedeck.cli.app import app
    from servedeck.cli.panels import arrange

    home = HOMES.get(command_of(argv)) if argv is not None else None
    if argv is not None and argv[:1] == ["--version"]:
        names: tuple[str, ...] = ()  # the root's own option: no command to register
    else:
        names = (home,) if home else MODULES
    for name in names:
        importlib.import_module(f"servedeck.cli.{name}")  # importing a module registers its commands on `app`
    arrange(app)  # the help in the order of a user's day (cli/panels.py)
    return app


def __getattr__(name: str):
    if name == "root_app":  # the whole app, for tests and library callers (cli/app.py's `app` is bare)
        return register()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def main() -> None:
    try:
        register(sys.argv[1:])()
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
