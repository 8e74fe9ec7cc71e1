"""`servedeck campaign plan|run|status`: a matrix of launches × workloads from one file. Parse, call, render."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from servedeck.campaign.accuracy import check_campaign_gate
from servedeck.campaign.file import load as load_campaign
from servedeck.campaign.folder import CampaignFolder, campaigns_root, find_campaign
from servedeck.campaign.runner import RunOptions, plan_campaign, run_campaign
from servedeck.campaign.summary import status_markdown, status_view, stretch_table, table
from servedeck.cli.app import (app, configured_results_dir, console, err_console, load_config, print_json,
                               print_markdown)
from servedeck.errors import ConfigError, ServedeckError
from servedeck.report.capacity import campaign_section
from servedeck.runs.folder import runs_root

campaign_app = typer.Typer(help="Campaigns: one file declares launches × workloads; servedeck runs them unattended.",
                           no_args_is_help=True)
app.add_typer(campaign_app, name="campaign")


class RichCampaignReporter:
    """Cells done / total with an ETA, and the current cell's phase, on stderr."""

    def __init__(self) -> None:
        self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=err_console)
        self.task: Any = None
        self.phases: dict[str, str] = {}

    def __enter__(self) -> "RichCampaignReporter":
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def begin(self, folder: Path, total: int, done: int) -> None:
        self.bar.console.print(f"campaign folder: {folder}", highlight=False, soft_wrap=True)
        self.task = self.bar.add_task("cells", total=total, completed=done, info="")

    def _info(self, eta: str = "") -> str:
        now = "; ".join(f"{c}: {p}" for c, p in self.phases.items())
        return (now + (f"  ETA {eta}" if eta else ""))[:120]

    def phase(self, cell: str, text: str) -> None:
        self.phases[cell] = text
        if self.task is not None:
            self.bar.update(self.task, info=self._info())

    def cell_end(self, cell: str, state: str, reason: Optional[str], done: int, total: int,
                 eta_s: Optional[float]) -> None:
        self.phases.pop(cell, None)
        colour = {"done": "green", "failed": "red", "timed-out": "red"}.get(state, "yellow")
        self.bar.console.print(f"[{colour}]{cell}: {state}[/]" + (f" — {reason}" if reason else ""),
                               highlight=False, soft_wrap=True)
        eta = time.strftime("%H:%M:%S", time.gmtime(eta_s)) if eta_s else ""
        self.bar.update(self.task, completed=done, info=self._info(eta))

    def note(self, text: str) -> None:
        self.bar.console.print(f"[dim]{text}[/]", highlight=False, soft_wrap=True)


@campaign_app.command("plan")
def plan(file: Path = typer.Argument(..., help="the campaign .toml"),
         inventory_file: Optional[Path] = typer.Option(None, "--inventory",
                                                        help="plan against GPUs saved by `servedeck gpu --json` on the target host"),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """The cells, each replica's rendered argv, GPU/CPU sets, memory plan and fit verdict. Nothing starts."""
    from servedeck.gpu import Inventory

    cfg = load_config()
    camp = load_campaign(file)
    inv = None
    if inventory_file is not None:
        try:
            inv = Inventory.from_json(json.loads(inventory_file.read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise ConfigError(f"{inventory_file}: not an inventory saved by `servedeck gpu --json`: {e}",
                              hint="run `servedeck gpu --json > inv.json` on the GPU host") from None
    view = plan_campaign(cfg, camp, inv)
    if as_json:
        print_json(view)
        return
    console.print(f"campaign [bold]{view['name']}[/] on {view['model']}: {len(view['cells'])} cells, "
                  f"cell_timeout {view['cell_timeout']}, gate {view['gate'] or 'off'}", highlight=False)
    if not view["inventory"]["available"]:
        console.print(f"[dim]GPU fit not checked here: {view['inventory']['reason']}[/]", highlight=False)
    if view["host_problem"]:
        console.print(f"[red]{view['host_problem']}[/]", highlight=False)
    for note in view.get("numa") or []:  # planned against an inventory's NUMA nodes
        console.print(f"[yellow]{note}[/]", highlight=False)
    for name, v in view["variants"].items():
        console.print(f"\n[bold]{name}[/] ({v['fit']}) {v['overrides'] or ''}", highlight=False)
        for r in v["replicas"]:
            console.print(f"  {r['model']}  port {r['port']}  gpus {r['gpus'] or '-'}  cpus {r['cpus'] or '-'}  "
                          f"fit: {r['fit']['message']}", highlight=False, soft_wrap=True)
            console.print("    " + " ".join(r["argv"]), highlight=False, soft_wrap=True, markup=False)
    console.print("\nworkloads: " + "; ".join(f"{w['kind']} {', '.join(w['points'])}" for w in view["workloads"]),
                  highlight=False)


def _engine_of(cfg: Any, model: str) -> Optional[str]:
    try:
        m = cfg.models[cfg.resolve(model)]
        return cfg.deck.builds[m.build].engine
    except (KeyError, ServedeckError):
        return None  # an unknown model is refused by the runner itself, with its own message


@campaign_app.command("run")
def run(file: Path = typer.Argument(..., help="the campaign .toml"),
        resume: bool = typer.Option(False, "--resume", help="continue the newest unfinished folder of this file"),
        only: Optional[str] = typer.Option(None, "--only", help="only these variants, e.g. p1,p4"),
        parallel: bool = typer.Option(False, "--parallel", help="run cells with disjoint GPU/CPU sets at the same time"),
        retry_failed: bool = typer.Option(False, "--retry-failed", help="redo failed and timed-out cells too"),
        evict: bool = typer.Option(False, "--evict", help="stop your models that hold a cell's GPUs/CPUs"),
        ray: Optional[str] = typer.Option(None, "--ray", metavar="ADDRESS",
                                          help="run each cell as a Ray task on the node that has its GPUs: auto, "
                                               "local, or the head's host:port (also SERVEDECK_RAY_ADDRESS)"),
        as_json: bool = typer.Option(False, "--json")) -> None:
    """Launch, gate, measure and stop every cell; each run recorded; resumable."""
    from servedeck.cluster.connect import address_from

    cfg = load_config()
    camp = load_campaign(file)
    check_campaign_gate(camp, _engine_of(cfg, camp.head.model))  # before the first launch
    opts = RunOptions(resume=resume, only=frozenset(x for x in (only or "").split(",") if x) or None,
                      parallel=parallel, retry_failed=retry_failed, evict=evict)
    address = address_from(ray)
    with RichCampaignReporter() as rep:
        if address:  # Ray places the cells (side by side where the nodes have room): --parallel is implied
            from servedeck.cluster.dispatch import run_on_ray

            folder = run_on_ray(cfg, camp, opts, address, rep)
        else:
            folder = run_campaign(cfg, camp, opts, rep)
    view = status_view(folder.doc, runs_root(cfg.deck.host.results_dir), folder.path)
    if as_json:
        print_json(view)
    else:
        _render_status(view)
    if any(c["state"] != "done" for c in folder.doc["cells"]):
        raise typer.Exit(1)


@campaign_app.command("status")
def status(folder: Optional[str] = typer.Argument(None, help="campaign folder, its name, or a unique part (default: newest)"),
           as_json: bool = typer.Option(False, "--json")) -> None:
    """A campaign's cells and figures, rebuilt from its folder and run folders."""
    results = configured_results_dir("campaigns")
    path = find_campaign(campaigns_root(results), folder)
    f = CampaignFolder.open(path)
    view = status_view(f.doc, runs_root(results), path)
    if as_json:
        print_json(view)
        return
    _render_status(view)


def _render_status(view: dict[str, Any]) -> None:
    if not console.is_terminal:  # a pipe or a file: whole lines, not rich's tables wrapped at 80 columns
        console.file.write(status_markdown(view))
        return
    t = Table(title=f"campaign {view['name']} ({view['folder']})")
    for col in ("cell", "state", "runs", "reason"):
        t.add_column(col)
    for c in view["cells"]:
        t.add_row(c["id"], c["state"], str(len(c.get("runs") or [])), (c.get("reason") or "")[:100])
    console.print(t)
    if view["points"]:
        print_markdown("\n".join(table(view["points"])))
    if view.get("stretches"):  # runs without load points (a ramp's conversation), a line of figures each
        print_markdown("\n".join(stretch_table(view["stretches"])))
    if view.get("capacity"):  # per variant and SLO, with the launches' gate, and the recommendation
        print_markdown("\n".join(campaign_section(view["capacity"])))
