"""Gate kinds: checks a launched server must pass before its performance figures count as results.

    niah      the planted access code (gates/niah.py): niah.log, `GATE niah score=`
    exact     questions from a local JSONL file, scored here (gates/exact.py): eval.jsonl
    lm-eval   an lm-evaluation-harness task against the server (gates/lmeval.py): eval.jsonl + lm-eval/

Every kind has a threshold and runs after boot, before any workload; a failed one marks the launch's
figures as not results. The accuracy kinds (exact, lm-eval) share one shape, `AccuracyGate`: `check`
before any launch (bad input refused there, naming the file, line or key), `run` against the
server's endpoint, writing one sample line per question through `record` (gates/samples.py), and
the tally. A new kind is one module with such a class and one entry in `accuracy_gate` below.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional, Protocol

from servedeck.engines.base import Endpoint
from servedeck.errors import UsageError

KINDS = ("niah", "exact", "lm-eval")
LM_EVAL_PREFIX = "lm-eval:"


class AccuracyGate(Protocol):
    name: str  # its key in summary.json `gates` ("eval")
    kind: str  # exact | lm-eval
    threshold: float

    def check(self, engine: Optional[str] = None) -> Any: ...  # raises UsageError before any launch
    def spec_json(self) -> dict[str, Any]: ...
    async def run(self, server: Endpoint, folder: Path, record: Callable[[dict[str, Any]], None]) -> dict[str, Any]: ...


def accuracy_gate(ref: str, threshold: Optional[float], *, limit: Optional[int] = None, concurrency: int = 8,
                  task_dir: Optional[str] = None, answer_tokens: int = 32, base: Optional[Path] = None,
                  where: str = "--eval") -> AccuracyGate:
    """`--eval PATH.jsonl` or `--eval lm-eval:TASK` → the gate it names (relative paths from `base`)."""
    if threshold is None:
        raise UsageError(f"{where} needs a threshold: the share of questions the server must answer correctly",
                         hint="an accuracy threshold depends on the model and the questions: measure once, "
                              "then gate a little below, e.g. --threshold 0.6")
    if ref.startswith(LM_EVAL_PREFIX):
        from servedeck.gates.lmeval import LmEvalGate

        task = ref[len(LM_EVAL_PREFIX):]
        if not task:
            raise UsageError(f"{where} {ref!r} names no task", hint="write it like lm-eval:arith (a task in --task-dir)")
        tdir = _resolve(task_dir, base) if task_dir else None
        return LmEvalGate(task=task, task_dir=tdir, threshold=threshold, limit=limit, concurrency=concurrency)
    if task_dir:
        raise UsageError(f"--task-dir is for lm-eval tasks; {where} {ref!r} is a question file",
                         hint="leave --task-dir out, or write --eval lm-eval:TASK")
    from servedeck.gates.exact import ExactGate

    return ExactGate(path=_resolve(ref, base), threshold=threshold, limit=limit, concurrency=concurrency,
                     answer_tokens=answer_tokens)


def _resolve(p: str, base: Optional[Path]) -> Path:
    path = Path(p).expanduser()
    return path if path.is_absolute() or base is None else (base / path)
