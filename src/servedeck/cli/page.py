"""`servedeck page MODEL`: a thin command over servedeck.page."""

from __future__ import annotations

import sys

import typer

from servedeck.cli.app import app, load_config, print_json
from servedeck.errors import UsageError


@app.command()
def page(
    model: str = typer.Argument(..., help="model or alias"),
    md: bool = typer.Option(False, "--md", help="Markdown (the default)"),
    html: bool = typer.Option(False, "--html", help="one self-contained HTML page"),
    json_out: bool = typer.Option(False, "--json", help="the page's document (its keys: the page's sections)"),
) -> None:
    """One model's page from servedeck's records alone: what it is, whether it runs, its launch and why,
    memory, what was measured (and whether it still holds), crashes, uptime, build, what was refuted, and
    what to check before the next launch. Writes nothing; needs no running engine."""
    from servedeck.page import build_page, to_html, to_markdown

    chosen = [flag for flag, on in (("--md", md), ("--html", html), ("--json", json_out)) if on]
    if len(chosen) > 1:
        raise UsageError(f"{' and '.join(chosen)} each choose the whole output; give one of them",
                         hint=f"`servedeck page {model} --html > page.html`, or --json for the document")
    from servedeck import paths

    with paths.reading_only():  # "writes nothing" holds on a machine with no state folder yet, too
        doc = build_page(load_config(), model)
    if json_out:
        print_json(doc)
    elif html:
        sys.stdout.write(to_html(doc))
    else:
        sys.stdout.write(to_markdown(doc))
