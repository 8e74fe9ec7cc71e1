"""An accuracy gate's record in a run folder, and its verdict rebuilt from that record alone.

    <run>/eval.jsonl      one line per question, appended as it is scored:
                          {"id", "prompt_digest", "expected", "answer", "correct", "match", "latency_s", "error"?}
    summary.json gates    {"eval": {"kind", "status", "source", "file", "spec", "result"}}

`source` is "this run", or the name of the run folder (a sibling) that holds the record: a bench run
of a launch cites every gate its launch passed or failed (workloads/session.py), the needle too.
Reading back (`view`, per gate; gates/kinds.py for a whole run) rescores from the lines, never from the
summary's numbers; `combined` folds every gate into the run's gate status, so a failed one marks the
run's points as not results, exactly where a failed needle does.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Mapping, Optional, Sequence

from servedeck.errors import UsageError
from servedeck.fsio import read_jsonl

FILE = "eval.jsonl"


def check_threshold(threshold: float, where: str = "--threshold") -> None:
    if not isinstance(threshold, (int, float)) or isinstance(threshold, bool) or not 0.0 <= threshold <= 1.0:
        raise UsageError(f"{where} must be a share between 0 and 1, got {threshold}",
                         hint="e.g. 0.9 for 90 % of the questions answered correctly")


def prompt_digest(messages: Sequence[Mapping[str, Any]]) -> str:
    """The same question always has the same digest: pairing two runs' samples checks it."""
    text = json.dumps(list(messages), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def sample_line(sample_id: str, messages: Sequence[Mapping[str, Any]], expected: str, answer: str, correct: bool,
                **extra: Any) -> dict[str, Any]:
    line = {"id": sample_id, "prompt_digest": prompt_digest(messages), "expected": expected,
            "answer": answer[:500], "correct": bool(correct)}
    line.update({k: v for k, v in extra.items() if v is not None})
    if isinstance(line.get("latency_s"), float):
        line["latency_s"] = round(line["latency_s"], 3)
    return line


def tally(lines: Sequence[Mapping[str, Any]], threshold: float) -> dict[str, Any]:
    """The verdict from sample lines, pure: the one scoring rule. A failed request is not correct."""
    n = len(lines)
    correct = sum(bool(x.get("correct")) for x in lines)
    score = correct / n if n else 0.0
    return {"score": score, "correct": correct, "samples": n, "errors": sum(bool(x.get("error")) for x in lines),
            "threshold": threshold, "passed": n > 0 and score >= threshold}


def line(name: str, result: Mapping[str, Any]) -> str:
    """The gate's one-line verdict, as the CLI prints it."""
    return (f"GATE {name} score= {result['score']:.3f} ({result['correct']}/{result['samples']} correct, "
            f"{result['errors']} errors, threshold {result['threshold']})")


def record_of(path: Path, name: str, rec: Mapping[str, Any]) -> Optional[Path]:
    """Where a gate's sample lines are: this folder, or the sibling run folder it cites (else the copy a
    citing run keeps of them)."""
    source = rec.get("source") or "this run"
    here = path / str(rec.get("file") or FILE)
    if source != "this run" and (path.parent / source / here.name).exists():
        return path.parent / source / here.name
    return here if here.exists() else None


def read_samples(path: Path, name: str, rec: Mapping[str, Any]) -> list[dict[str, Any]]:
    f = record_of(path, name, rec)
    return list(read_jsonl(f)) if f else []


def view(path: Path, rec: Mapping[str, Any]) -> dict[str, Any]:
    """An accuracy gate of a run (`rec`: its summary.json entry) as its sample lines tell it:
    passed | failed | incomplete | not run."""
    threshold = (rec.get("spec") or {}).get("threshold", (rec.get("result") or {}).get("threshold", 1.0))
    f = record_of(path, str(rec.get("name") or ""), rec)
    shown = {k: rec.get(k) for k in ("kind", "source", "spec", "note", "wall_s") if rec.get(k) is not None}
    if rec.get("status") not in ("passed", "failed", "running") or f is None:
        return {**shown, "status": "not run" if f is None and rec.get("status") != "running" else "incomplete"}
    result = {**(rec.get("result") or {}), **tally(list(read_jsonl(f)), threshold)}
    status = "incomplete" if rec.get("status") == "running" else "passed" if result["passed"] else "failed"
    return {**shown, "status": status, "result": result, "file": f.name}


def combined(needle: dict[str, Any], accuracy: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """The run's gate: the needle's view, its status folded with every accuracy gate's. Any failed → failed;
    else any incomplete → incomplete; else every gate that ran passed → passed; none ran → not run."""
    if not accuracy:
        return needle
    ran = [s for s in [needle.get("status")] + [a.get("status") for a in accuracy.values()] if s != "not run"]
    status = ("failed" if "failed" in ran else "incomplete" if "incomplete" in ran
              else "passed" if ran else "not run")
    return {**needle, "status": status, "needle": needle.get("status", "not run"),
            "accuracy": {k: dict(v) for k, v in accuracy.items()}}


def describe(gate: Mapping[str, Any]) -> str:
    """Each gate of a run's combined view in a few words: "niah passed 1.0; eval failed 0.420 (21/50) < 0.6"."""
    parts = []
    needle = gate.get("needle", gate.get("status"))
    r = gate.get("result") or {}
    if needle != "not run":
        parts.append(f"niah {needle}" + (f" {round(r['score'], 2)}" if "score" in r and "probes" in r else ""))
    for name, a in (gate.get("accuracy") or {}).items():
        ar = a.get("result") or {}
        text = f"{name} {a.get('status')}"
        if "score" in ar:
            text += (f" {ar['score']:.3f} ({ar['correct']}/{ar['samples']}"
                     + (f", {ar['errors']} errors" if ar.get("errors") else "") + f"), threshold {ar['threshold']}")
        parts.append(text)
    return "; ".join(parts)
