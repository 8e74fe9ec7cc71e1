"""`servedeck gate MODEL --eval PATH.jsonl | lm-eval:TASK`: parse, check before any launch, run, render."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, Optional

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from servedeck.workloads.session import Outcome, measured, run_accuracy
from servedeck.cli.app import console, err_console, print_json
from servedeck.config import Config
from servedeck.errors import ServedeckError
from servedeck.gates import samples as S
from servedeck.gates.kinds import accuracy_gate
from servedeck.runs import load


def gate_eval(cfg: Config, model: str, ref: str, threshold: Optional[float], limit: Optional[int],
              concurrency: int, task_dir: Optional[str], answer_tokens: int, launch: bool, as_json: bool) -> None:
    gate = accuracy_gate(ref, threshold, limit=limit, concurrency=concurrency, task_dir=task_dir,
                         answer_tokens=answer_tokens, base=Path.cwd())
    entry = cfg.models.get(model)
    engine = cfg.deck.builds[entry.build].engine if entry is not None and entry.build in cfg.deck.builds else None
    total = gate.check(engine)  # a bad file, task or threshold is refused here, before any launch
    outcome = Outcome()
    bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=err_console)
    task = bar.add_task(f"gate {gate.name} ({gate.kind})", total=len(total) if isinstance(total, list) else None,
                        info="")
    right = [0, 0]

    def on_sample(line: dict[str, Any]) -> None:
        right[0] += bool(line.get("correct"))
        right[1] += 1
        bar.update(task, advance=1, info=f"{right[0]}/{right[1]} correct")

    try:
        with bar, measured(cfg, model, launch, outcome) as target:
            asyncio.run(run_accuracy(target, gate, outcome=outcome, on_sample=on_sample,
                                     stage=lambda t: bar.console.print(f"[dim]{t}[/]", highlight=False)))
    except KeyboardInterrupt:
        if outcome.folder is not None:
            err_console.print(f"interrupted; the run folder keeps every scored question: {outcome.folder}",
                              highlight=False, soft_wrap=True)
        raise typer.Exit(130) from None
    except ServedeckError:
        if outcome.folder is not None:
            err_console.print(f"run folder: {outcome.folder}", highlight=False, soft_wrap=True)
        raise
    view = load(outcome.folder) if outcome.folder else {}
    acc = ((view.get("gate") or {}).get("accuracy") or {}).get(gate.name) or {}
    if as_json:
        print_json(view)
    else:
        if "result" in acc:
            console.print(S.line(gate.name, acc["result"]), highlight=False)
        colour = "green" if acc.get("status") == "passed" else "red"
        errors = (acc.get("result") or {}).get("errors")
        console.print(f"[{colour}]gate {acc.get('status', 'not run')}[/]"
                      + (f" ({errors} questions failed to get an answer: counted as not correct)" if errors else ""),
                      highlight=False)
        err_console.print(f"run folder: {outcome.folder}", highlight=False, soft_wrap=True)
    if acc.get("status") != "passed":
        raise typer.Exit(1)


def without_eval(limit: Optional[int], concurrency: int, task_dir: Optional[str]) -> None:
    """--limit, --concurrency and --task-dir mean nothing to the needle: refused rather than ignored."""
    given = [flag for flag, v in (("--limit", limit), ("--task-dir", task_dir)) if v is not None]
    given += ["--concurrency"] if concurrency != 8 else []
    if given:
        from servedeck.errors import UsageError

        raise UsageError(f"{', '.join(given)}: only with --eval (the needle asks its probes one at a time)",
                         hint="add --eval PATH.jsonl or --eval lm-eval:TASK, or leave them out")
