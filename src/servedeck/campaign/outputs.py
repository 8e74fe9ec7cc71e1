"""Identical output across a campaign's launches: the fixed prompt set (loadgen/outputs.py) answered
into a run folder's outputs.jsonl, and two run folders compared prompt by prompt.

Speculative decoding must not change greedy output; a different build, quantization or model may.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from servedeck.errors import ServedeckError
from servedeck.fsio import read_jsonl
from servedeck.loadgen.outputs import EXCERPT_CHARS, MAX_TOKENS, N_PROMPTS, PROMPT_SEED, collect, compare, compare_one, prompts

__all__ = ["EXCERPT_CHARS", "FILE", "MAX_TOKENS", "N_PROMPTS", "PROMPT_SEED", "collect", "compare", "compare_one",
           "compare_runs", "prompts", "read"]

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
