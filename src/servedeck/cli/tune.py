"""`servedeck tune FILE` (= `tune run FILE`): search engine flags for the most goodput within an SLO (tune/);
`tune apply`: the winner's values into models.toml. Parse, call, render."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional

import typer
from rich.text import Text
from typer.core import TyperGroup

from servedeck.cli.app import (app, configured_results_dir, console, err_console, load_config, print_json,
                               print_markdown)
from servedeck.errors import RunError
from servedeck.fsio import atomic_write_text
from servedeck.tune.file import load as load_tune
from servedeck.tune.folder import TuneFolder, list_tunes, render_markdown, tunes_root
from servedeck.tune.runner import run_tune


class _RunByDefault(TyperGroup):
    """`servedeck tune FILE` is `servedeck tune run FILE`: a first word that is no subcommand is the file.
    `default_command` names that subcommand (tests/cli/test_named_commands.py reads it too)."""

    default_command = "run"

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # typer's own click's Context
        if args and not args[0].startswith("-") and args[0] not in self.commands:
            args = [self.default_command, *args]
        return super().parse_args(ctx, args)


tune_app = typer.Typer(cls=_RunByDefault, no_args_is_help=True,
                       help="Search engine flags for the most good requests/s per GPU within an SLO (docs/tune.md): "
                            "`servedeck tune FILE` (run), `servedeck tune show`, `servedeck tune apply`.")
app.add_typer(tune_app, name="tune")


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


@tune_app.command("run")
def run(file: Path = typer.Argument(..., help="the tune .toml: a campaign file plus its search space and budget (docs/tune.md)"),
         resume: bool = typer.Option(False, "--resume", help="continue the newest unfinished tune of this file; "
                                                              "finished trials are kept, cut-short ones redone"),
         ray: Optional[str] = typer.Option(None, "--ray", metavar="ADDRESS",
                                           help="run each trial as a campaign cell placed by Ray, several at once: "
                                                "auto, local, or the head's host:port (also SERVEDECK_RAY_ADDRESS)"),
         parallel: Optional[int] = typer.Option(None, "--parallel", min=1, metavar="N",
                                                help="with --ray: searched trials at once (default: [search] "
                                                     "parallel, else as many as the cluster can place)"),
         storage: Optional[str] = typer.Option(None, "--storage", metavar="URL",
                                               help="the Optuna study in this database (postgresql://USER@HOST/DB, "
                                                    "the password in PGPASSWORD or ~/.pgpass; the postgres extra) "
                                                    "instead of study.db in the tune folder; --resume finds it "
                                                    "from tune.json"),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """Search engine flags for the most good requests/s per GPU within an SLO: each trial gated, its outputs
    checked against the starter's, its capacity searched; Optuna (TPE) picks the next."""
    from servedeck.cluster.connect import address_from
    from servedeck.errors import UsageError

    cfg = load_config()
    t = load_tune(file)
    address = address_from(ray)
    if parallel and parallel > 1 and not address:
        raise UsageError("--parallel runs trials side by side on Ray: give --ray ADDRESS (on one host, trials run "
                         "one at a time: two would measure each other's load)",
                         hint="`servedeck tune FILE --ray local --parallel 2` (a Ray cluster of this host's own), or leave "
                              "out --parallel")
    with RichTuneReporter() as rep:
        folder = run_tune(cfg, t, resume, rep, ray=address, parallel=parallel, storage=storage)
    if as_json:
        print_json(folder.doc)
    else:
        print_markdown(render_markdown(folder.doc))
        err_console.print(f"tune folder: {folder.path}", highlight=False, soft_wrap=True)


def _find(folder: Optional[str], results: Optional[str]) -> Path:
    """A tune folder by path, name or unique part; the newest without one."""
    if folder and (Path(folder) / "tune.json").exists():
        return Path(folder)
    root = tunes_root(results)
    found = list_tunes(root)
    if folder:
        found = [p for p in found if p.name == folder] or [p for p in found if folder in p.name]
    if not found:
        raise RunError(f"no tune {'matching ' + repr(folder) + ' ' if folder else ''}under {root}",
                       hint="run `servedeck tune FILE` first")
    if folder and len({p.name.split('__')[0] for p in found}) > 1:
        raise RunError(f"{folder!r} matches {len(found)} tunes ({', '.join(p.name for p in found[-5:])})",
                       hint="give more of the folder name")
    return found[-1]


@tune_app.command("show")
def show(folder: Optional[str] = typer.Argument(None, help="tune folder, its name or a unique part (default: newest)"),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """A tune's trials, its verification and how much each searched entry moved the objective (fANOVA over
    the study's complete trials)."""
    from servedeck.tune.importance import importance
    from servedeck.tune.runner import optuna_module
    from servedeck.tune.storage import for_resume

    path = _find(folder, configured_results_dir("tunes"))
    doc = TuneFolder.open(path).doc
    doc = {**doc, "importance": importance(optuna_module(), for_resume(path, doc, None))}  # afresh from the study
    if as_json:
        print_json({**doc, "folder": str(path)})
        return
    print_markdown(render_markdown(doc))


@tune_app.command("apply")
def apply(folder: Optional[str] = typer.Argument(None, help="tune folder, its name or a unique part (default: newest)"),
          leading: bool = typer.Option(False, "--leading", help="apply the leader of an undecided verdict anyway"),
          dry_run: bool = typer.Option(False, "--dry-run", help="say what would change; write nothing"),
          as_json: bool = typer.Option(False, "--json")) -> None:
    """Write the winning trial's values into the model's models.toml entry, each with a `why` naming the trial and
    figure that chose it (comments and layout kept)."""
    from servedeck.modelsfile import load
    from servedeck.tune.apply import applied, changes, reason, winner

    cfg = load_config()
    path = _find(folder, configured_results_dir("tunes"))
    doc = TuneFolder.open(path).doc
    trial = winner(doc, leading)
    model, values = doc["model"], trial.get("values") or {}
    text = Path(cfg.path).read_text()
    rows = changes(text, model, values)
    out = {"tune": path.name, "trial": trial["trial"], "model": model, "models_toml": str(cfg.path),
           "changes": [{"key": k, "now": a, "new": b} for k, a, b in rows], "written": False}
    if values and not dry_run:
        new = applied(text, model, values, reason(doc, trial, path.name))
        tmp = Path(cfg.path).with_name(f".{Path(cfg.path).name}.tune-apply")
        atomic_write_text(tmp, new)
        try:
            load(tmp)  # the new entry must load as models.toml does before it replaces the user's file
        except Exception:
            tmp.unlink(missing_ok=True)
            raise
        tmp.replace(cfg.path)
        out["written"] = True
    if as_json:
        print_json(out)
        return
    if not values:
        console.print(f"the winner is the starter: {model}'s entry as models.toml has it; nothing to change",
                      highlight=False)
        return
    for r in out["changes"]:
        console.print(f"{model}: {r['key']} {r['now'] if r['now'] is not None else '(unset)'} -> {r['new']}",
                      highlight=False, markup=False)
    console.print(("would write " if dry_run else "wrote ") + f"{cfg.path} (trial {trial['trial']} of {path.name})",
                  highlight=False, soft_wrap=True)
