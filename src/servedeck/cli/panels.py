"""`servedeck --help` in the order of a user's day: each command's panel, and the order within it.

Commands register themselves where they are written (cli/deck.py, cli/campaign.py, …); this one list says
where each is shown. A command that is in no panel is refused at import (tests/cli/test_help_panels.py),
so a new command cannot land at the bottom of the help unplaced."""

from __future__ import annotations

import typer

PANELS: list[tuple[str, list[str]]] = [
    ("The deck: run the servers", ["init", "start", "switch", "status", "stop", "sleep", "wake", "logs", "render",
                                   "restore", "history", "unit", "page", "install"]),
    ("Know before you launch", ["doctor", "plan", "gpu", "crashes", "verify-build"]),
    ("Measure one server", ["gate", "bench", "ramp", "runs", "show", "compare-outputs", "report", "compare"]),
    ("Campaigns: many launches", ["hosts", "campaign", "tune"]),
    ("One address for every model", ["serve"]),
    ("Keep it running", ["watch", "notices", "soak"]),
]
HIDDEN = {"log"}  # `logs` under another name


def name_of(info) -> str:
    """A registered command's or group's name, as typer gives it (the function's name, dashed, if unnamed)."""
    return info.name or info.callback.__name__.replace("_", "-")


def arrange(app: typer.Typer) -> None:
    """Give every registered command and group its panel, in PANELS' order."""
    order = {name: i for i, (_, names) in enumerate(PANELS) for name in names}
    rank = {name: j for _, names in PANELS for j, name in enumerate(names)}
    panel = {name: title for title, names in PANELS for name in names}

    unplaced = [name_of(c) for c in [*app.registered_commands, *app.registered_groups]
                if name_of(c) not in panel and name_of(c) not in HIDDEN]
    if unplaced:
        raise RuntimeError(f"servedeck commands in no help panel: {unplaced}; add them to cli/panels.py's PANELS")
    for info in [*app.registered_commands, *app.registered_groups]:
        if name_of(info) in panel:
            info.rich_help_panel = panel[name_of(info)]
    app.registered_commands.sort(key=lambda c: (order.get(name_of(c), len(PANELS)), rank.get(name_of(c), 0)))


def first_step(config_found: bool) -> str:
    """What `servedeck` alone says to do first."""
    if not config_found:
        return ("No models.toml here yet: `servedeck init` writes one for the engines and models on this machine "
                "(or says what to install), then `servedeck start NAME` with a name it wrote.")
    return "`servedeck status` says what runs; `servedeck start MODEL` starts one; `servedeck --help` lists the rest."
