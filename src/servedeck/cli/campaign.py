"""Measuring one server: gate, bench (any workload kind: its options come from workloads/kinds.py), a kind's own
command (ramp), compare-outputs, runs, show. Parse, call one function, render."""

from __future__ import annotations

import asyncio
import inspect

from typing import Any, Callable, Coroutine, Optional

import typer
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from servedeck.cli.accuracy import gate_eval, without_eval
from servedeck.cli.app import (app, configured_results_dir, console, err_console, load_config, print_json,
                               print_markdown)
from servedeck.errors import ServedeckError, UsageError
from servedeck.gates import GateSpec, ProbeResult
from servedeck.loadgen import Progress as LoadProgress
from servedeck.loadgen.loop import run as run_loop
from servedeck.report import list_row, markdown
from servedeck.report.workloads import outputs_markdown
from servedeck.runs import find_run, list_runs, load, runs_root
from servedeck.workloads import session
from servedeck.workloads.kinds import DEFAULT, KINDS, WorkloadChoice, options as kind_options
from servedeck.workloads.outputs import compare_runs
from servedeck.workloads.points import shape_label
from servedeck.workloads.session import Outcome, measured
from servedeck.workloads.shape import Kind, Option
from servedeck.workloads.target import Target


# --- parsing --------------------------------------------------------------------------------------

def _depths(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise UsageError(f"--depths: {text!r} is not a list of fractions", hint="write it like 0.1,0.5,0.9") from None


# --- progress -------------------------------------------------------------------------------------

class RichReporter:
    """Progress on stderr (stdout stays clean for --json): one bar for the gate, one per point."""

    def __init__(self) -> None:
        self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=err_console,
                            transient=False)
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> "RichReporter":
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def stage(self, text: str) -> None:
        self.bar.console.print(f"[dim]{text}[/]", highlight=False)

    def gate_start(self, probes: int, context: int) -> None:
        self.tasks["gate"] = self.bar.add_task(f"gate niah @ {context} tokens", total=probes, info="")

    def gate_probe(self, r: ProbeResult) -> None:
        mark = "[green]found[/]" if r.ok else "[red]MISSED[/]"
        self.bar.console.print(f"  probe key={r.key} depth={r.depth} tokens={r.prompt_tokens} {mark} "
                               f"{r.latency_s:.1f} s  {r.answer[:60]!r}", highlight=False)
        self.bar.advance(self.tasks["gate"])

    def point_start(self, label: str, total: Optional[int], duration_s: Optional[float]) -> None:
        self.tasks[label] = self.bar.add_task(f"point {label}", total=total or duration_s, info="")

    def progress(self, label: str, p: LoadProgress) -> None:
        task = self.tasks.get(label)
        if task is None or p.phase != "measured":
            return
        done = p.done if p.total else min(p.elapsed_s, p.duration_s or p.elapsed_s)
        self.bar.update(task, completed=done, info=f"{p.done} done, {p.errors} errors, {p.in_flight} in flight")

    def point_done(self, label: str, point: dict[str, Any]) -> None:
        task = self.tasks.get(label)
        if task is not None:
            self.bar.update(task, completed=self.bar.tasks[task].total or 0, info=point.get("status", ""))


def _guarded(outcome: "Outcome", run: Callable[["RichReporter"], object]) -> None:
    """Run a gate or bench under a progress display; on Ctrl-C or an error, say where the folder is."""
    try:
        with RichReporter() as rep:
            run(rep)
    except KeyboardInterrupt:
        _ended(outcome, True)
        raise typer.Exit(130) from None
    except ServedeckError:
        _ended(outcome, False)
        raise


def _ended(outcome: Outcome, interrupted: bool) -> None:
    if outcome.folder is not None:
        what = "interrupted; the run folder keeps every finished request" if interrupted else "run folder"
        err_console.print(f"{what}: {outcome.folder}", highlight=False, soft_wrap=True)


# --- commands -------------------------------------------------------------------------------------

@app.command()
def gate(
    model: str,
    context: Optional[int] = typer.Option(None, "--context", help="tokens each probe fills (default: what the server serves per request)"),
    depths: str = typer.Option("0.1,0.5,0.9", "--depths", help="where the code is planted, as fractions of the prompt"),
    repeats: int = typer.Option(1, "--repeats", help="probes per depth, each with its own haystack and code"),
    threshold: Optional[float] = typer.Option(None, "--threshold", help="pass when the score is at least this (the needle: 0.67, rounded to 2 decimals; --eval: required)"),
    seed: Optional[int] = typer.Option(None, "--seed", help="reproduce an earlier gate's haystacks and codes"),
    answer_tokens: int = typer.Option(32, "--answer-tokens", help="room for each answer (a reasoning model needs more, or `request` in models.toml)"),
    eval_ref: Optional[str] = typer.Option(None, "--eval", help="an accuracy gate instead of the needle: PATH.jsonl (questions scored by servedeck) or lm-eval:TASK"),
    limit: Optional[int] = typer.Option(None, "--limit", help="--eval: ask only the first N questions"),
    concurrency: int = typer.Option(8, "--concurrency", help="--eval: questions in flight at once"),
    task_dir: Optional[str] = typer.Option(None, "--task-dir", help="--eval lm-eval:TASK: the folder holding the task's YAML"),
    launch: bool = typer.Option(False, "--launch", help="start the model for this run and stop it afterwards"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Correctness gate: find a planted 7-digit code at each depth of a context-sized prompt (or, with --eval, answer questions)."""
    cfg = load_config()
    if eval_ref is not None:
        return gate_eval(cfg, model, eval_ref, threshold, limit, concurrency, task_dir, answer_tokens, launch, as_json)
    without_eval(limit, concurrency, task_dir)
    spec = GateSpec(context=context or 0, depths=_depths(depths), repeats=repeats,
                    threshold=0.67 if threshold is None else threshold, seed=seed, answer_tokens=answer_tokens)
    outcome = Outcome()
    def run(rep: RichReporter) -> None:
        with measured(cfg, model, launch, outcome) as target:
            asyncio.run(session.gate(target, spec, reporter=rep, outcome=outcome))

    _guarded(outcome, run)
    view = load(outcome.folder) if outcome.folder else {}
    if as_json:
        print_json(view)
    else:
        g = view["gate"]
        console.print(f"GATE niah score= {round(g['result']['score'], 2)}", highlight=False)
        colour = "green" if g["status"] == "passed" else "red"
        console.print(f"[{colour}]gate {g['status']}[/]: {g['result']['found']}/{g['result']['probes']} found, "
                      f"threshold {g['result']['threshold']}", highlight=False)
        _ended(outcome, False)
    if view.get("gate", {}).get("status") != "passed":
        raise typer.Exit(1)


# Options every measuring command has, whatever its kind: the gate, --launch, --json.
COMMON = (
    Option("gate_flag", ("--gate/--no-gate",), Optional[bool], None, "default: reuse this launch's gate, else run one"),
    Option("gate_context", ("--gate-context",), Optional[int], None, "context for the gate (default: the server's)"),
    Option("gate_answer_tokens", ("--gate-answer-tokens",), int, 32, "room for each gate answer"),
    Option("launch", ("--launch",), bool, False, "start the model for this run and stop it afterwards"),
    Option("as_json", ("--json",), bool, False, ""),
)


def _command(name: str, help: str, params: list[inspect.Parameter], options: list[Option],
             body: Callable[..., None]) -> None:
    """Register `body(model, **values)` as command `name` with these options: the kinds' options are data
    (workloads/shape.py's Option), so the command's signature is made from them."""
    sig = params + [inspect.Parameter(o.param, inspect.Parameter.KEYWORD_ONLY, annotation=o.type,
                                      default=typer.Option(o.default, *o.flags, help=o.help or None))
                    for o in (*options, *COMMON)]

    def command(model: str, **values: Any) -> None:
        body(model, **values)

    command.__signature__ = inspect.Signature(sig)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in sig}
    command.__doc__ = help
    command.__name__ = name.replace("-", "_")
    app.command(name)(command)


def _run_kind(kind: Kind, model: str, values: dict[str, Any]) -> None:
    """Everything the kind checks before a launch, then its run on MODEL, shown as `show` shows it."""
    spec = kind.from_options(values)
    gate_spec = GateSpec(context=values["gate_context"] or 0, answer_tokens=values["gate_answer_tokens"])
    _measure(model, values["launch"], values["as_json"], lambda target, rep, outcome: session.run(
        target, spec, gate_mode=values["gate_flag"], gate_spec=gate_spec, reporter=rep, outcome=outcome))


def bench(model: str, **values: Any) -> None:
    """Benchmark MODEL with a workload of any kind (workloads/kinds.py): gate, then its run, recorded as a run
    folder. An option of a kind's own that takes over (`--find`) makes that kind the one run."""
    kind = KINDS[getattr(values["workload"], "value", values["workload"])]
    for k in KINDS.values():
        if k.takes_over and values.get(k.takes_over) is not None:
            kind = k
    _run_kind(kind, model, values)


_WORKLOAD = Option("workload", ("--workload",), WorkloadChoice, WorkloadChoice(DEFAULT),
                   " | ".join(f"{k.name} ({k.help})" for k in KINDS.values()))
_command("bench", "Benchmark MODEL: gate, then one measured point per concurrency or rate (or another kind of "
                  "workload: --workload), recorded as a run folder.",
         [inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str)],
         [_WORKLOAD, *kind_options()], bench)
for _kind in KINDS.values():  # a kind with a command of its own (`servedeck ramp`): its options only
    if _kind.command:
        _command(_kind.command[0], _kind.command[1],
                 [inspect.Parameter("model", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=str)],
                 list(_kind.options), lambda model, _k=_kind, **values: _run_kind(_k, model, values))


def _measure(model: str, launch: bool, as_json: bool,
             work: Callable[[Target, RichReporter, Outcome], Coroutine[Any, Any, Outcome]]) -> None:
    """Open MODEL (starting it with --launch), run `work` on it under a progress display, show the run."""
    cfg, outcome = load_config(), Outcome()

    def run(rep: RichReporter) -> None:
        with measured(cfg, model, launch, outcome) as target:
            # uvloop when installed: the load generator's timestamps want the cheaper loop
            run_loop(work(target, rep, outcome))

    _guarded(outcome, run)
    _show(outcome, as_json)


def _show(outcome: Outcome, as_json: bool) -> None:
    view = load(outcome.folder) if outcome.folder else {}
    if as_json:
        print_json(view)
        return
    print_markdown(markdown(view))
    _ended(outcome, False)


@app.command("compare-outputs")
def compare_outputs(run_a: str = typer.Argument(..., help="run folder with outputs.jsonl (name, unique part, path or `last`)"),
                    run_b: str = typer.Argument(..., help="the run to compare it with"),
                    as_json: bool = typer.Option(False, "--json")) -> None:
    """Greedy outputs of two runs (`bench --check-outputs`), token by token: identical, or where they part."""
    root = runs_root(configured_results_dir())
    result = compare_runs(find_run(root, run_a), find_run(root, run_b))
    if as_json:
        print_json(result)
    else:
        print_markdown(outputs_markdown(result))
    if result["verdict"] != "identical":
        raise typer.Exit(1)


@app.command()
def runs(as_json: bool = typer.Option(False, "--json"), limit: int = typer.Option(50, "-n", help="the latest N"),
         campaign: Optional[str] = typer.Option(None, "--campaign", help="only the runs of this campaign (name or folder)")) -> None:
    """Run folders: model, engine, layout, context, gate, headline figures (rebuilt from each folder)."""
    root = runs_root(configured_results_dir())
    paths = list_runs(root)
    if campaign:
        paths = [p for p in paths if _in_campaign(p, campaign)]
    rows = [list_row(load(p)) for p in paths[-limit:]]
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print(f"no runs under {root}", highlight=False)
        return
    # One line per run, figures indented below: the folder name already says model, layout,
    # context and engine, and a fixed-width table would crush it on an 80-column terminal.
    width = max(len(r["run"]) for r in rows)
    for r in rows:
        result = r["kind"] == "gate" or r["gate"].startswith("passed")
        gate_txt = r["gate"] if result else f"[yellow]{r['gate']}: not a result[/]"
        status = "[red]FAILED[/]" if r["status"] == "failed" else r["status"]
        what = r["workload"] or r["kind"] or "-"
        console.print(f"{r['run']:<{width}}  {what:<11}  {status}  gate {gate_txt}", highlight=False, soft_wrap=True)
        if r["kind"] != "gate" and r["headline"] != "-":
            console.print(f"    {r['headline']}", highlight=False)
        if r["status"] == "failed" and r.get("reason"):
            console.print(f"    [red]{r['reason']}[/]", highlight=False)


@app.command()
def show(run: str = typer.Argument(..., help="run folder name, a unique part of it, a path, or `last`"),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """One run's summary, rebuilt from its folder."""
    path = find_run(runs_root(configured_results_dir()), run)
    view = load(path)
    if as_json:
        print_json(view)
        return
    print_markdown(markdown(view))
    console.print(f"folder: {path}", highlight=False, soft_wrap=True)


def _in_campaign(path: Any, name: str) -> bool:
    from servedeck.runs.read import summary_of

    c = summary_of(path).get("campaign") or {}
    return name in (c.get("name"), c.get("folder"))


__all__ = ["bench", "compare_outputs", "gate", "runs", "show", "shape_label"]
