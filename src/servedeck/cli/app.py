"""The typer app and what every command shares: config loading, JSON output, error printing."""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Optional

import typer
from rich.console import Console
from rich.text import Text

from servedeck import paths
from servedeck.config import Config
from servedeck.modelsfile import load

app = typer.Typer(
    name="servedeck",
    help="Run LLM inference servers on your own GPUs, and measure them honestly.",
    invoke_without_command=True,  # `servedeck` alone: the help, then what to do first (_root)
    add_completion=False,
    pretty_exceptions_enable=False,
)
# Piped or logged, there is no terminal whose width to respect: rich's 80 columns would wrap inside a figure,
# a path or a timestamp ("healthy after 1.61" / "s"). So a width comes from a terminal only when there is
# one (or from COLUMNS, which a user or test sets on purpose); otherwise lines are as long as they are.
PIPE_WIDTH = 10_000


def _sized(stream: Any) -> bool:
    """Whether lines written to `stream` have a width to keep to: a terminal's, or COLUMNS."""
    return os.environ.get("COLUMNS", "").isdigit() or (stream is not None and stream.isatty())


def _console(stderr: bool = False) -> Console:
    if _sized(sys.stderr if stderr else sys.stdout):
        return Console(stderr=stderr)
    return Console(stderr=stderr, width=PIPE_WIDTH)


console = _console()
err_console = _console(stderr=True)


class Ctx:
    config_path: Optional[str] = None


def _print_version(value: bool) -> None:
    if value:
        from servedeck.about import version_text

        console.print(version_text(), markup=False, highlight=False)
        raise typer.Exit(0)


@app.callback()
def _root(
    ctx: typer.Context,
    config: Optional[str] = typer.Option(
        None, "--config", "-c", envvar="SERVEDECK_CONFIG", help="models.toml to use (default: ./models.toml, then $SERVEDECK_HOME/models.toml)"
    ),
    version: bool = typer.Option(False, "--version", is_eager=True, callback=_print_version,
                                 help="servedeck's version, the Python running it and the engines it finds, then exit"),
) -> None:
    Ctx.config_path = config
    if ctx.invoked_subcommand is None:
        from servedeck.cli.panels import first_step

        console.print(ctx.get_help())
        console.print(Text("\nWhat to do first: ", style="bold") + Text(first_step(paths.config_file(config).exists())))
        raise typer.Exit(0)


def load_config() -> Config:
    return load(paths.config_file(Ctx.config_path))


def config_or_none(doing: str) -> Optional[Config]:
    """For commands that still work from state alone (status, history, watch): warn, don't fail."""
    from rich.markup import escape

    from servedeck.errors import ServedeckError

    try:
        return load_config()
    except ServedeckError as e:
        # the message may hold a `[models.NAME]` header to suggest: text, not markup
        err_console.print(f"[yellow]warning:[/] {escape(e.message.splitlines()[0])} ({doing} without it)",
                          markup=True, highlight=False)
        return None


def configured_results_dir(listing: str = "runs") -> Optional[str]:
    """[host] results_dir when models.toml is readable, else None (results then come from $SERVEDECK_RESULTS
    or ./results). Runs and campaigns are listable without a models.toml, but one that exists (or was named)
    and cannot be read is said, file and error, with the folder read instead: otherwise a typo in models.toml
    would silently point `runs`, `report` or `campaign status` at another results folder."""
    from servedeck.errors import ServedeckError

    cfg_path = paths.config_file(Ctx.config_path)
    try:
        return load_config().deck.host.results_dir
    except ServedeckError as e:
        if cfg_path.exists() or Ctx.config_path or os.environ.get("SERVEDECK_CONFIG"):
            used = paths.results_dir(None) / listing
            why = "SERVEDECK_RESULTS" if os.environ.get("SERVEDECK_RESULTS") else "the default"
            err_console.print(Text("warning: ", style="yellow") + Text(
                f"{cfg_path} is broken, so its [host] results_dir is not known: {e.message.splitlines()[0]}; "
                f"listing {listing} under {used.resolve()} ({why})"), highlight=False, soft_wrap=True)
        return None


def warn_unreadable(rows: Any, path: Any) -> None:
    """Lines of a JSON-lines file that could not be read are said, on stderr (so --json stays clean)."""
    msg = rows.warning(path) if hasattr(rows, "warning") else None
    if msg:
        err_console.print(f"[yellow]warning:[/] {msg}", markup=True, highlight=False, soft_wrap=True)


def print_markdown(text: str) -> None:
    """Markdown (a run's or a campaign's view) drawn on the terminal; piped, the Markdown itself, which reads as
    text and pastes into an issue (rich would draw its headings' boxes and centring PIPE_WIDTH wide)."""
    if not _sized(sys.stdout):
        sys.stdout.write(text if text.endswith("\n") else text + "\n")
        return
    from rich.markdown import Markdown  # with markdown-it 60 ms, which every other command would pay

    console.print(Markdown(text))


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
