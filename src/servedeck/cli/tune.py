"""`servedeck tune FILE`: search engine flags for the most goodput within an SLO (tune/). Parse, call, render."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.text import Text

from servedeck.cli.app import app, err_console, load_config, print_json, print_markdown
from servedeck.tune.file import load as load_tune
from servedeck.tune.folder import render_markdown
from servedeck.tune.runner import run_tune


class RichTuneReporter:
    """One line per trial as it starts and ends, the phase of the one running, on stderr (stdout: the result)."""

    def __init__(self) -> None:
        self.status: Any = None

    def __enter__(self) -> "RichTuneReporter":
        self.status = err_console.status("starting")
        self.status.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.status.stop()

    def begin(self, folder: Path, done: int, budget: Optional[int]) -> None:
        err_console.print(f"tune folder: {folder} ({done} trial(s) done" + (f" of {budget})" if budget else ")"),
                          highlight=False, soft_wrap=True)

    def trial_start(self, trial: str, values: dict[str, Any]) -> None:
        self.trial = trial
        shown = ", ".join(f"{k}={v}" for k, v in values.items()) or "the model's entry as models.toml has it"
        err_console.print(Text(f"{trial}: {shown}"), highlight=False, soft_wrap=True)

    def phase(self, text: str) -> None:
        self.status.update(f"{getattr(self, 'trial', '')}: {text}"[:120])

    def trial_end(self, trial: str, rec: dict[str, Any], best: str) -> None:
        colour = "green" if rec.get("verdict") == "measured" else "yellow"
        figure = rec.get("value")
        ge = "≥ " if rec.get("bound") else ""
        what = f"{ge}{figure:.2f} good req/s per GPU" if figure is not None else ""
        err_console.print(Text(f"{trial}: {rec.get('verdict')}", style=colour) +
                          Text(" " + "; ".join(x for x in (what, rec.get("why") or "") if x)),
                          highlight=False, soft_wrap=True)
        err_console.print(Text("  " + best.replace("**", "")), highlight=False, soft_wrap=True)

    def note(self, text: str) -> None:
        err_console.print(Text(text, style="dim"), highlight=False, soft_wrap=True)


@app.command("tune")
def tune(file: Path = typer.Argument(..., help="the tune .toml: a campaign file plus its search space and budget (docs/tune.md)"),
         resume: bool = typer.Option(False, "--resume", help="continue the newest unfinished tune of this file; "
                                                              "finished trials are kept, cut-short ones redone"),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """Search engine flags for the most good requests/s per GPU within an SLO: each trial gated, its outputs
    checked against the starter's, its capacity searched; Optuna (TPE) picks the next."""
    cfg = load_config()
    t = load_tune(file)
    with RichTuneReporter() as rep:
        folder = run_tune(cfg, t, resume, rep)
    if as_json:
        print_json(folder.doc)
    else:
        print_markdown(render_markdown(folder.doc))
        err_console.print(f"tune folder: {folder.path}", highlight=False, soft_wrap=True)
