"""Report commands: report, compare. Parse, call one function, render."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Optional

import typer

from servedeck import paths
from servedeck.campaign.folder import campaigns_root, find_campaign, list_campaigns
from servedeck.cli.app import app, configured_results_dir, console, print_json
from servedeck.errors import RunError, UsageError
from servedeck.report.build import write
from servedeck.report.collect import Collection, Run, collect, from_campaign, from_runs
from servedeck.report.compare import compare as compare_runs, text as compare_text
from servedeck.report.stats import NOISE
from servedeck.runs import find_run, runs_root


def _campaigns_root() -> Path:
    return campaigns_root(configured_results_dir())


def _campaign(ref: str) -> Optional[Path]:
    """The campaign folder REF names, by the rules `campaign status` uses (folder.find_campaign), so the two
    commands read the same folder; None when REF names no one campaign, so that it may name a run."""
    try:
        return find_campaign(_campaigns_root(), ref)
    except RunError:
        return None


def _targets(refs: list[str]) -> list[Path]:
    if not refs:
        root = _campaigns_root()
        if not list_campaigns(root):
            raise RunError(f"no campaign folders under {root}",
                           hint="give run folders: `servedeck report RUN RUN …` (`servedeck runs` lists them)")
        return [find_campaign(root, None)]
    out = []
    for ref in refs:
        camp = _campaign(ref)
        out.append(camp if camp is not None else find_run(runs_root(configured_results_dir()), ref))
    return out


@app.command()
def report(
    targets: list[str] = typer.Argument(None, help="a campaign folder, or run folders (names, parts of names, paths, `last`); default: the latest campaign"),
    out: Optional[Path] = typer.Option(None, "--out", help="folder for report.md and report.html (default: the campaign folder, or <results>/reports/<stamp>)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """report.md + report.html from run folders alone: setup, gate, Pareto per GPU, latency, repeats, attribution, failures, sources."""
    paths_ = _targets(list(targets or []))
    coll = collect(paths_)
    if out is None:
        out = coll.folder if coll.folder is not None else \
            paths.results_dir(configured_results_dir()) / "reports" / datetime.now().strftime("%m%d-%H%M%S")
    md, page = write(coll, out)
    if as_json:
        print_json({"report_md": str(md), "report_html": str(page), "runs": [r.name for r in coll.runs],
                    "failures": len(coll.failures)})
        return
    console.print(f"{md}\n{page}", highlight=False, soft_wrap=True)


def _variant(ref: str, coll: Collection) -> list[Run]:
    runs = [r for r in coll.variants().get(ref, []) if r.kind == "bench"]
    if not runs:
        raise UsageError(f"no bench runs of variant {ref!r} in {coll.folder}",
                         hint="variants: " + ", ".join(coll.variants()))
    return runs


def _sides(a: str, b: str, coll: Optional[Collection], workload: Optional[str]) -> tuple[list[Run], list[Run]]:
    """Each side's runs of one workload: a campaign variant's repeats, or one run."""
    if coll is None:
        root = runs_root(configured_results_dir())
        return from_runs([find_run(root, a)]).runs, from_runs([find_run(root, b)]).runs
    ra, rb = _variant(a, coll), _variant(b, coll)
    common = [w for w in dict.fromkeys(r.workload for r in ra) if any(x.workload == w for x in rb)]
    if workload is None and common:
        workload = common[0]
    if workload not in common:
        raise UsageError(f"variants {a!r} and {b!r} have no {workload or 'common'} workload to compare",
                         hint="workloads measured on both: " + (", ".join(common) or "none"))
    return [r for r in ra if r.workload == workload], [r for r in rb if r.workload == workload]


@app.command()
def compare(
    a: str = typer.Argument(..., help="a run (or, with --campaign, a variant)"),
    b: str = typer.Argument(..., help="a run (or, with --campaign, a variant)"),
    campaign: Optional[str] = typer.Option(None, "--campaign", help="campaign folder whose variants A and B are"),
    workload: Optional[str] = typer.Option(None, "--workload", help="with --campaign: which workload's runs (default: the first both variants measured)"),
    noise: float = typer.Option(NOISE, "--noise", help="relative changes below this are reported as noise"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """What changed between A and B, and whether it matters (paired statistics when the prompts were the same)."""
    coll = None
    if campaign is not None:
        folder = _campaign(campaign)
        if folder is None:
            raise UsageError(f"--campaign {campaign!r} is not a campaign folder",
                             hint=f"give a folder holding campaign.json (under {_campaigns_root()})")
        coll = from_campaign(folder)
    if not 0 <= noise < 1:
        raise UsageError(f"--noise {noise} is not a fraction between 0 and 1", hint="e.g. --noise 0.02 for 2 %")
    side_a, side_b = _sides(a, b, coll, workload)
    result = compare_runs(side_a, side_b, noise=noise)
    if as_json:
        print_json(result.to_json())
        return
    console.print(compare_text(result), highlight=False, soft_wrap=True, markup=False)
