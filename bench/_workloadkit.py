"""What bench/workloads.py (llama.cpp) and bench/vllm_workloads.py (vLLM) share: one speculation point per
content on a running launch, the ramp on it, and the two tables."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from servedeck.workloads.points import BenchSpec
from servedeck.workloads.ramp import RampSpec
from servedeck.workloads.session import Outcome, measured, run
from servedeck.fsio import read_jsonl
from servedeck.loadgen import ClosedLoop
from servedeck.runs import load


def speculation_points(cfg: Any, model: str, *, input_tokens: int, output_tokens: int, requests: int,
                       check_outputs: bool) -> tuple[list[dict[str, Any]], Path]:
    """Prose and code at c=1 on a running launch: one row each (the engine's own speculation figures
    beside TPOT), and the prose run's folder (its greedy outputs when `check_outputs`)."""
    rows, prose = [], None
    for content in ("prose", "code"):
        spec = BenchSpec(workload="chat", shapes=(ClosedLoop(1),), input_tokens=input_tokens,
                         output_tokens=output_tokens, requests=requests, warmup=1, content=content,
                         check_outputs=check_outputs and content == "prose")
        got = Outcome()
        with measured(cfg, model, False, got) as target:
            folder = asyncio.run(run(target, spec, gate_mode=False, outcome=got)).folder
        assert folder is not None
        if content == "prose":
            prose = folder
        f = load(folder)["points"][0]["figures"]
        s = f.get("speculation") or {}
        rows.append({"model": model, "content": content, "run": folder.name, "tpot_p50_ms": f["tpot_ms"]["p50"],
                     "output_tok_s": f["output_tok_s"], "acceptance_rate": s.get("acceptance_rate"),
                     "mean_acceptance_length": s.get("mean_acceptance_length"),
                     "tokens_per_step": s.get("tokens_per_step"), "draft_tokens": s.get("draft_tokens"),
                     "accepted_tokens": s.get("accepted_tokens"), "absent": s.get("absent"), "source": s.get("source")})
    assert prose is not None
    return rows, prose


def ramp_run(cfg: Any, model: str, *, turn_tokens: int, answer_tokens: int) -> dict[str, Any]:
    rspec = RampSpec(turn_tokens=turn_tokens, answer_tokens=answer_tokens, needle_every=2, content="prose", seed=1)
    got = Outcome()
    with measured(cfg, model, False, got) as target:
        folder = asyncio.run(run(target, rspec, gate_mode=False, outcome=got)).folder
    assert folder is not None
    return {"run": folder.name, "cutoff": load(folder)["ramp"]["cutoff"], "turns": read_jsonl(folder / "ramp.jsonl")}


def _f(x: Any, d: int = 2) -> str:
    return "-" if x is None else f"{x:.{d}f}"


def print_speculation(console: Console, title: str, rows: list[dict[str, Any]]) -> None:
    t = Table(title=title)
    for col in ("launch", "content", "drafted", "accepted", "acceptance", "mean acc. length", "tokens/step",
                "TPOT p50 ms", "out tok/s"):
        t.add_column(col)
    for r in rows:
        t.add_row(r["model"], r["content"], _f(r["draft_tokens"], 0), _f(r["accepted_tokens"], 0),
                  "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.1%}",
                  _f(r["mean_acceptance_length"]), _f(r["tokens_per_step"]), _f(r["tpot_p50_ms"], 1),
                  _f(r["output_tok_s"], 1))
    console.print(t)


def print_ramp(console: Console, title: str, ramp_out: dict[str, Any]) -> None:
    t = Table(title=title)
    for col in ("turn", "context", "TTFT s", "prefill tok/s (new)", "decode tok/s", "cached", "needle"):
        t.add_column(col)
    for ln in ramp_out["turns"]:
        n = ln.get("needle")
        t.add_row(str(ln["turn"]), str(ln["context_tokens"]), f"{ln['ttft_s']:.2f}",
                  f"{ln['prefill_tok_s'] or 0:.0f}", f"{ln['decode_tok_s'] or 0:.1f}",
                  "-" if ln["cached_share"] is None else f"{ln['cached_share']:.0%}",
                  "-" if not n else ("found" if n["found"] else "MISSED"))
    console.print(t)
    console.print(f"cut-off: {ramp_out['cutoff']}")
