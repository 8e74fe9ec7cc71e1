"""Identical output across a campaign's launches: the fixed prompt set (loadgen/outputs.py) answered
into a run folder's outputs.jsonl, and two run folders compared prompt by prompt.

Speculative decoding must not change greedy output; a different build, quantization or model may.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servedeck.errors import ServedeckError, ServerDied
from servedeck.fsio import read_jsonl
from servedeck.loadgen.outputs import EXCERPT_CHARS, MAX_TOKENS, N_PROMPTS, PROMPT_SEED, collect, compare, compare_one, prompts
from servedeck.runs.folder import RunFolder
from servedeck.workloads.reporter import Reporter
from servedeck.workloads.target import Target

__all__ = ["EXCERPT_CHARS", "FILE", "MAX_TOKENS", "N_PROMPTS", "PROMPT_SEED", "check", "collect", "compare",
           "compare_one", "compare_runs", "prompts", "read"]

FILE = "outputs.jsonl"


def read(run: Path) -> list[dict[str, Any]]:
    path = run / FILE
    if not path.exists():
        raise ServedeckError(f"{run.name} has no {FILE}",
                             hint="answer the output-check prompts with `servedeck bench MODEL --check-outputs …`")
    return read_jsonl(path)


def compare_runs(run_a: Path, run_b: Path) -> dict[str, Any]:
    """compare() on two run folders: what campaign and report code call (issue 10's reference check)."""
    return {"a": run_a.name, "b": run_b.name, **compare(read(run_a), read(run_b))}


async def check(folder: RunFolder, target: Target, reporter: Reporter, n: int, max_tokens: int) -> None:
    """A run's output check: the fixed greedy prompt set into its outputs.jsonl, before any load (`bench
    --check-outputs`; a campaign's first workload when it names a `reference`)."""
    reporter.stage(f"output check: {n} fixed prompts, temperature 0, {max_tokens} tokens")
    folder.update(outputs={"status": "running", "file": FILE})
    lines = await collect(target.base_url, target.served_name, target.engine, target.request,
                                  lambda line: folder.append_jsonl(FILE, line), n=n, max_tokens=max_tokens)
    errors = [ln["error"] for ln in lines if ln.get("error")]
    death = target.death()
    if death:
        raise ServerDied(f"{death} (during the output check)")
    folder.update(outputs={"status": "failed" if errors else "ok", "file": FILE, "prompts": len(lines),
                           "errors": len(errors), "first_error": errors[0] if errors else None,
                           "unit": "token" if all(ln.get("token_ids") is not None for ln in lines if not ln.get("error"))
                           else "character", "seed": PROMPT_SEED, "max_tokens": max_tokens})
