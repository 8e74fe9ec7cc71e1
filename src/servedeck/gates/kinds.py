"""Gate kinds: checks a launched server must pass before its performance figures count as results.

    niah      the planted access code (gates/niah.py): niah.log, `GATE niah score=`
    exact     questions from a local JSONL file, scored here (gates/exact.py): eval.jsonl
    lm-eval   an lm-evaluation-harness task against the server (gates/lmeval.py): eval.jsonl + lm-eval/

Every kind has a threshold and runs after boot, before any workload; a failed one marks the launch's
figures as not results. Every kind has one shape, `Gate`: `check` before any launch (bad input refused
there, naming the file, line or key), `fitted` to the running server, `run` against the server's
endpoint, writing one sample line per question or probe through `record` (id, prompt_digest, expected,
answer, correct; gates/samples.py), and the tally. Its summary.json entry (`entry`) is `gates.<name>`
(the needle's: `gate`, where it always was); its record is read back by its module's `view` (`KINDS`), and `gates_view` folds a run's
gates into the one verdict readers show. A new kind is one module with such a class and a `view`,
and one entry in `KINDS` (and `accuracy_gate`, for `--eval`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Protocol

from servedeck.engines.base import Endpoint
from servedeck.errors import UsageError
from servedeck.gates import niah, samples


@dataclass(frozen=True)
class Kind:
    view: Callable[[Path, Mapping[str, Any]], dict[str, Any]]  # (run folder, its summary.json entry) → its view
    copied_when_cited: bool  # a run citing it keeps a copy of its record (else reads it in the gate's run)


KINDS: dict[str, Kind] = {
    "niah": Kind(niah.view, True),  # niah.log in every run that stands on it, as the seed had it
    "exact": Kind(samples.view, False),
    "lm-eval": Kind(samples.view, False),
}
NEEDLE = "niah"  # the needle's name among a run's gates: readers show it apart (its own report section)
LM_EVAL_PREFIX = "lm-eval:"


class Gate(Protocol):
    name: str  # its name among the run's gates ("niah", "eval"): where its entry is, see `records`
    kind: str  # a key of KINDS
    threshold: float
    file: str  # its record in the run folder
    every_replica: bool  # a campaign cell of several replicas runs it on each (else on the first)

    def check(self, engine: Optional[str] = None) -> Any: ...  # raises UsageError before any launch
    def fitted(self, served: int, max_output_tokens: Optional[int], model: str) -> "Gate": ...
    def spec_json(self) -> dict[str, Any]: ...
    async def run(self, server: Endpoint, folder: Path, record: Callable[[dict[str, Any]], None]) -> dict[str, Any]: ...


AccuracyGate = Gate  # the name the accuracy kinds were first written under


def entry(gate: Gate, status: str, **more: Any) -> dict[str, Any]:
    """A gate's summary.json entry (where: `stored`), as it runs and once it has its verdict."""
    return {"kind": gate.kind, "status": status, "source": "this run", "file": gate.file, "spec": gate.spec_json(),
            **more}


def records(summary: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """A run's gate entries by name, the needle's first. The needle's entry keeps the place it has always
    had in summary.json (`gate`, beside niah.log), so folders read the same whichever servedeck wrote
    them; every other gate's is `gates.<name>`."""
    out = {NEEDLE: {"kind": "niah", "file": niah.LOG, **(summary.get("gate") or {}), "name": NEEDLE}}
    out.update({name: {**rec, "name": name} for name, rec in (summary.get("gates") or {}).items()
                if isinstance(rec, dict) and rec.get("kind") in KINDS and name != NEEDLE})
    return out


def stored(summary: Mapping[str, Any], name: str, rec: dict[str, Any]) -> dict[str, Any]:
    """The summary.json change that records gate `name`'s entry `rec` (see `records`)."""
    if name == NEEDLE:
        return {"gate": rec}
    return {"gates": {**(summary.get("gates") or {}), name: rec}}


def views(path: Path, summary: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Every gate of a run as its record tells it (the needle first)."""
    return {name: KINDS[rec["kind"]].view(path, rec) for name, rec in records(summary).items()}


def gates_view(path: Path, summary: Mapping[str, Any]) -> dict[str, Any]:
    """The run's one gate verdict, folded from every gate's view (samples.combined): the needle's view at
    the top, as readers have always shown it, the other gates under `accuracy`."""
    found = views(path, summary)
    needle = found.pop(NEEDLE)
    return samples.combined(needle, found)


def cites(view: Mapping[str, Any], context: int) -> bool:
    """Whether a gate that ran (its view) stands for a later run on the same launch: it finished, in its
    own run, and, where it was asked at a context, at the one wanted."""
    asked = (view.get("result") or {}).get("context")
    return (view.get("status") in ("passed", "failed") and view.get("source", "this run") == "this run"
            and (asked is None or asked == context))


def accuracy_gate(ref: str, threshold: Optional[float], *, limit: Optional[int] = None, concurrency: int = 8,
                  task_dir: Optional[str] = None, answer_tokens: int = 32, base: Optional[Path] = None,
                  where: str = "--eval") -> Gate:
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
