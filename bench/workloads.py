"""Issue 10's tables, measured on real llama.cpp with SmolLM2-135M: speculation on prose vs code,
the conversation ramp to the model's 8K context, and the NIAH gate at 2K/4K/8K (near the training
context the gate may miss; it is scored as it is; this was a 6-minute test, now a measurement).

    .venv/bin/python bench/workloads.py [--requests 4] [--output-tokens 128] [--turn-tokens 1500]
                                        [--answer-tokens 16] [--out bench/results/workloads.json]

Speculation: the same model launched twice, plain and with `--spec-type ngram-simple
--spec-draft-n-max 4` (n-gram drafting, no draft model), one point each at concurrency 1 on
`--content prose` and `--content code`; acceptance, mean acceptance length and tokens per decoding
step from the engine's own counters, TPOT from servedeck's records; plus the greedy output check
between the two launches. Ramp: one conversation of `--turn-tokens` prose a turn, answers of
`--answer-tokens`, needle every 2 turns, until the 8K context. Every launch is stopped afterwards.
Timings on a shared 2-core machine are noisy; the ratios side by side are what to read.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from _workloadkit import print_ramp, print_speculation, ramp_run, speculation_points

from servedeck.workloads.outputs import compare_runs
from servedeck.workloads.session import Outcome, gate, measured
from servedeck.gates.niah import GateSpec, read_log
from servedeck.modelsfile import load as load_config
from servedeck.deck import Deck
from servedeck.init import render_starter
from servedeck.testing.ports import free_port  # below the ephemeral range: that module says why


def config(tmp: Path):
    text = render_starter()
    for old in ("8081", "8091", "8082"):
        text = text.replace(f"port = {old}", f"port = {free_port()}")
    text = text.replace("context = 4096\nargs = { parallel = 4 }", "context = 8192\nargs = { parallel = 1 }")
    source = re.search(r'source = "([^"]+smollm2[^"]+\.gguf)"', text)
    assert source
    text += (f'\n[models.smollm2-spec]\nsource = "{source.group(1)}"\nbuild = "llamacpp"\nport = {free_port()}\n'
             'slot = "spec"\ncontext = 8192\nargs = { parallel = 1, spec-type = "ngram-simple", spec-draft-n-max = 4 }\n')
    path = tmp / "models.toml"
    path.write_text(text)
    return load_config(path)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--input-tokens", type=int, default=512)
    ap.add_argument("--output-tokens", type=int, default=128)
    ap.add_argument("--turn-tokens", type=int, default=1500)
    ap.add_argument("--answer-tokens", type=int, default=16)
    ap.add_argument("--no-ramp", action="store_true", help="speculation table only")
    ap.add_argument("--gate-contexts", default="2048,4096,8192",
                    help="the NIAH gate at these contexts on the plain launch ('' for none)")
    ap.add_argument("--check-outputs", action="store_true", help="also the 8-prompt greedy output check")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "bench/results"), "workloads.json"))
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="servedeck-workloads-"))
    os.environ.setdefault("SERVEDECK_HOME", str(tmp / "home"))
    os.environ.setdefault("SERVEDECK_RESULTS", str(tmp / "results"))
    cfg = config(tmp)
    console = Console()
    out: dict[str, Any] = {"speculation": [], "ramp": None, "outputs": None, "gates": []}
    deck = Deck(cfg)
    try:
        runs: dict[str, Path] = {}
        for model in ("smollm2", "smollm2-spec"):
            deck.start(model)
            rows, runs[model] = speculation_points(cfg, model, input_tokens=a.input_tokens,
                                                   output_tokens=a.output_tokens, requests=a.requests,
                                                   check_outputs=a.check_outputs)
            out["speculation"] += rows
            for ctx in (int(x) for x in a.gate_contexts.split(",") if x.strip()) if model == "smollm2" else ():
                # near the training context the gate may miss: whatever it scores is the figure
                got = Outcome()
                with measured(cfg, model, False, got) as target:
                    res = asyncio.run(gate(target, GateSpec(context=ctx), outcome=got))
                assert got.folder is not None
                probes, _ = read_log((got.folder / "niah.log").read_text())
                out["gates"].append({"context": ctx, "run": got.folder.name, "found": res.gate.found,
                                     "score": res.gate.score, "passed": res.gate.passed,  # type: ignore[union-attr]
                                     "probes": [{k: p.get(k) for k in ("depth", "ok", "answer", "latency_s",
                                                                       "prompt_tokens")} for p in probes]})
            if model == "smollm2" and not a.no_ramp:
                out["ramp"] = ramp_run(cfg, model, turn_tokens=a.turn_tokens, answer_tokens=a.answer_tokens)
            deck.stop([model])
        if a.check_outputs:
            out["outputs"] = compare_runs(runs["smollm2-spec"], runs["smollm2"])
    finally:
        deck.stop(["smollm2", "smollm2-spec"])
    print_speculation(console, "Speculation (llama.cpp ngram-simple, draft max 4) vs plain, SmolLM2-135M, c=1",
                      out["speculation"])
    if out["gates"]:
        t = Table(title="NIAH gate by context, SmolLM2-135M on llama.cpp (training context 8192)")
        for col in ("context", "found", "score", "verdict", "probe latencies s"):
            t.add_column(col)
        for g in out["gates"]:
            t.add_row(str(g["context"]), f"{g['found']}/{len(g['probes']) or 3}", f"{g['score']:.2f}",
                      "passed" if g["passed"] else "FAILED",
                      ", ".join(f"{p['latency_s']}" for p in g["probes"]))
        console.print(t)
    o = out["outputs"]
    if o:
        console.print(f"greedy output check, speculating vs plain: {o['verdict']} ({o['identical']}/{o['prompts']})")
    if out["ramp"] is None:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(out, indent=1))
        console.print(f"wrote {a.out}")
        return
    print_ramp(console, f"Ramp: SmolLM2 on llama.cpp, {a.turn_tokens} prose tokens a turn, {a.answer_tokens}-token "
               "answers (32 on needle turns)", out["ramp"])
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=1))
    console.print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
