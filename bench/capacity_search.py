"""Issue 22's check of the capacity search against a grid, on real llama.cpp (SmolLM2-135M).

    .venv/bin/python bench/capacity_search.py [--parallel 32] [--duration 8s] [--searches 3]
                                              [--resolution 10%] [--out bench/results/capacity_search.json]
                                              [--models-toml PATH --model NAME]

--models-toml/--model: a model of the user's models.toml in place of the starter's SmolLM2 (its args.parallel
and context are set from --parallel as for SmolLM2: 512 tokens a slot; a vLLM model's max-num-seqs instead);
scripts/gpu-capacity-search.sh runs it so on the H200, where the client has cores to spare, and
`--models-toml STARTER --model smollm2-vllm --parallel 8` (STARTER: the models.toml `servedeck init` writes)
on vLLM CPU.

1. The grid: one point at every concurrency 1..--parallel, once.
2. The SLO, read off the grid before any search runs: the --figure (default TTFT p90) limit where a straight
   line fitted through the whole grid stands halfway between its middle load and the next (fitted_limit),
   so the boundary falls mid-range whatever this machine's speed, plus error_rate<=1%. A fit, not the two
   middle points themselves: a limit placed between the points that happened to split the grid cleanly
   picks the grid's own lucky draws, and every re-measure (each search's) then lands below it.
   TTFT, not TPOT: on llama.cpp on 2 cores TPOT p90 is flat from c=4 to c=9 (26-40 ms, repeats of one
   load spreading as widely as the loads), so no TPOT limit can place a boundary to one stream, while a
   closed loop's TTFT rises about 125 ms per stream (docs/capacity.md).
   The grid's boundary is the highest load that passed below the lowest that failed (each point judged
   by servedeck.slo.judge, as the search judges).
3. The search: `servedeck bench --find max-concurrency` (workloads/capacity.py) --searches times, each on a
   freshly started server, as the grid was (--same-server: on the grid's).
4. The grid again (--no-grid-again: not), after the searches, on a fresh server: a second draw of the
   reference, so the table shows how far the grid itself moves between two measurements.
Goal: each search's boundary within one resolution step of the grid's, using at most 40 % of the grid's
measured requests, and the searches within one step of each other. Prints a table, writes JSON.
Timings on a shared 2-core machine are noisy: the load average is recorded beside each figure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from servedeck.workloads.points import BenchSpec
from servedeck.workloads.capacity import SEARCH_FILE, CapacitySpec
from servedeck.workloads.search import parse_resolution
from servedeck.workloads.session import Outcome, measured, run
from servedeck.deck import Deck
from servedeck.fsio import read_jsonl
from servedeck.init import render_starter
from servedeck.loadgen import ClosedLoop, RequestRecord
from servedeck.loadgen.loop import run as run_loop
from servedeck.modelsfile import load as load_config
from servedeck.runs import load
from servedeck.slo import judge, parse_slo
from servedeck.timeparse import seconds
from servedeck.testing.ports import free_port  # below the ephemeral range: that module says why


def config(tmp: Path, parallel: int, models_toml: Path | None = None, model: str = "smollm2"):
    if models_toml is None:
        text = render_starter()
        for old in ("8081", "8091", "8082"):
            text = text.replace(f"port = {old}", f"port = {free_port()}")
        text = re.sub(r"context = 4096\nargs = \{ parallel = 4 \}",
                      f"context = {512 * parallel}\nargs = {{ parallel = {parallel} }}", text, count=1)
        path = tmp / "models.toml"
        path.write_text(text)
        return load_config(path)
    cfg = load_config(models_toml)
    m = cfg.models[model]
    if cfg.deck.builds[m.build].engine == "vllm":  # its slots are max-num-seqs; the context stays the model's
        cfg.models[model] = m.model_copy(update={"args": {**m.args, "max-num-seqs": parallel}})
    else:
        cfg.models[model] = m.model_copy(update={"context": 512 * parallel, "args": {**m.args, "parallel": parallel}})
    return cfg


MODEL = "smollm2"  # --model
FIGURES = {f"{f}_p{p}": (f"{f}_ms", f"p{p}") for f in ("ttft", "tpot") for p in (50, 90, 99)}  # --figure


def _points(cfg: Any, spec: BenchSpec) -> Path:
    out = Outcome()
    with measured(cfg, MODEL, False, out) as target:
        run_loop(run(target, spec, gate_mode=False, outcome=out))
    assert out.folder is not None
    return out.folder


def _judged(folder: Path, slo: Any) -> list[dict[str, Any]]:
    by: dict[int, list[RequestRecord]] = {}
    for ln in read_jsonl(folder / "requests.jsonl"):
        by.setdefault(int(ln.pop("point")), []).append(RequestRecord.from_json(ln))
    view = load(folder)
    return [{"load": p["shape"]["concurrency"], **judge(by.get(p["index"], []), slo, client=p["figures"]["client"])}
            for p in view["points"]]


def fitted_limit(by_load: dict[int, float]) -> tuple[float, int]:
    """The limit a least-squares line through every grid point gives halfway between the middle load k and
    k + 1, and k: chosen from the grid's shape, not from which two of its points happened to split it."""
    loads = sorted(by_load)
    slope, at0 = np.polyfit(np.array(loads, float), np.array([by_load[c] for c in loads], float), 1)
    if not slope > 0:
        raise SystemExit(f"the figure does not rise with load on this grid ({by_load}): no mid-range limit")
    k = loads[len(loads) // 2 - 1]
    return float(at0 + slope * (k + 0.5)), k


def grid_boundary(judged: list[dict[str, Any]]) -> tuple[int | None, int | None]:
    fails = [j["load"] for j in judged if not j["passed"]]
    hi = min(fails) if fails else None
    lo = max((j["load"] for j in judged if j["passed"] and (hi is None or j["load"] < hi)), default=None)
    return lo, hi


def _load_avg() -> float:
    return round(os.getloadavg()[0], 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--parallel", type=int, default=32, help="llama-server slots: the search's cap and the grid's top")
    ap.add_argument("--duration", default="8s", help="each point's length (grid and search alike)")
    ap.add_argument("--input-tokens", type=int, default=64)
    ap.add_argument("--output-tokens", type=int, default=32)
    ap.add_argument("--searches", type=int, default=3)
    ap.add_argument("--resolution", default="10%")
    ap.add_argument("--figure", default="ttft_p90", choices=sorted(FIGURES),
                    help="the SLO's figure, its limit read off the grid (ttft_p90; tpot_p90 as before 2026-12-01 18:40)")
    ap.add_argument("--no-grid-again", action="store_true", help="skip the second grid after the searches")
    ap.add_argument("--same-server", action="store_true",
                    help="measure the searches on the server that measured the grid (default: a fresh one each)")
    ap.add_argument("--models-toml", type=Path, default=None, help="a models.toml in place of the starter's")
    ap.add_argument("--model", default="smollm2", help="the model of --models-toml to search")
    ap.add_argument("--out", default=os.path.join(os.environ.get("OUT", "bench/results"), "capacity_search.json"))
    a = ap.parse_args()
    global MODEL
    MODEL = a.model
    tmp = Path(tempfile.mkdtemp(prefix="servedeck-capacity-"))
    os.environ.setdefault("SERVEDECK_HOME", str(tmp / "home"))
    os.environ.setdefault("SERVEDECK_RESULTS", str(tmp / "results"))
    cfg = config(tmp, a.parallel, a.models_toml, a.model)
    point = dict(workload="chat", input_tokens=a.input_tokens, output_tokens=a.output_tokens,
                 duration_s=seconds(a.duration, "--duration"), warmup=1)
    res = parse_resolution(a.resolution)
    console = Console(width=160)
    out: dict[str, Any] = {"args": vars(a), "searches": []}
    deck = Deck(cfg)
    try:
        deck.start(MODEL)
        load0 = _load_avg()
        folder = _points(cfg, BenchSpec(shapes=tuple(ClosedLoop(c) for c in range(1, a.parallel + 1)), **point))
        key, pct = FIGURES[a.figure]
        by_load = {p["shape"]["concurrency"]: p["figures"][key][pct] for p in load(folder)["points"]}
        limit, k = fitted_limit(by_load)
        slo = parse_slo(f"{a.figure}<={limit:.2f}ms,error_rate<=1%")
        out["slo"] = {"text": slo.text, "from_grid": {"fitted_at": k + 0.5, "figure": a.figure,
                                                      f"{a.figure}_ms": by_load}}
        console.print(f"SLO {slo.text}, from a line through the grid at c={k + 0.5} of 1..{a.parallel}")
        out["grid"] = _grid_entry(folder, slo, a.figure, load0)
        _save(out, a, res)
        for _ in range(a.searches):
            if not a.same_server:  # each search starts on a fresh server, as the grid did
                deck.stop([MODEL])
                deck.start(MODEL)
            load0 = _load_avg()
            cspec = CapacitySpec(find="max-concurrency", slo=slo, bench=BenchSpec(shapes=(), **point), resolution=res)
            got = Outcome()
            with measured(cfg, MODEL, False, got) as target:
                run_loop(run(target, cspec, gate_mode=False, outcome=got))
            assert got.folder is not None
            doc = json.loads((got.folder / SEARCH_FILE).read_text())
            out["searches"].append({"run": got.folder.name, "verdict": doc["verdict"], "capacity": doc["capacity"],
                                    "min_failing": doc["boundary"]["min_failing"],
                                    "unstable": doc["boundary"]["unstable"], "steps": len(doc["steps"]),
                                    "requests": sum(s["judged"]["measured"] for s in doc["steps"]),
                                    "binding": doc["binding"], "shape": (doc.get("shape") or {}).get("kind"),
                                    "load_avg": [load0, _load_avg()]})
            _save(out, a, res)
        if not a.no_grid_again:
            deck.stop([MODEL])
            deck.start(MODEL)
            load0 = _load_avg()
            again = _points(cfg, BenchSpec(shapes=tuple(ClosedLoop(c) for c in range(1, a.parallel + 1)), **point))
            out["grid_again"] = _grid_entry(again, slo, a.figure, load0)
            _save(out, a, res)
    finally:
        deck.stop([MODEL])
    g = out["grid"]
    step = _save(out, a, res)
    engine = cfg.deck.builds[cfg.models[MODEL].build].engine
    t = Table(title=f"Capacity search against a grid: {MODEL} on {engine}, --parallel {a.parallel}, "
                    f"SLO {out['slo']['text']}, {a.duration} points")
    for col in ("", "capacity (max passing)", "first failing", "steps", "requests", "% of grid's",
                "within a step of grid / grid again", "verdict", "load avg"):
        t.add_column(col)
    t.add_row("grid 1.." + str(a.parallel), str(g["max_passing"]), str(g["min_failing"]), str(g["points"]),
              str(g["requests"]), "100 %", "-", "-", f"{g['load_avg'][0]}–{g['load_avg'][1]}")
    if "grid_again" in out:
        g2 = out["grid_again"]
        t.add_row("grid again", str(g2["max_passing"]), str(g2["min_failing"]), str(g2["points"]),
                  str(g2["requests"]), f"{g2['requests'] / max(1, g['requests']):.0%}",
                  ("yes" if g2["within_one_step"] else "NO") + " / -", "-",
                  f"{g2['load_avg'][0]}–{g2['load_avg'][1]}")
    for i, s in enumerate(out["searches"]):
        near = ("yes" if s["within_one_step"] else "NO") + (
            "" if "within_one_step_of_grid_again" not in s else
            " / " + ("yes" if s["within_one_step_of_grid_again"] else "NO"))
        t.add_row(f"search {i + 1}", str(s["capacity"]), str(s["min_failing"]), str(s["steps"]), str(s["requests"]),
                  f"{s['share_of_grid_requests']:.0%}", near, s["verdict"],
                  f"{s['load_avg'][0]}–{s['load_avg'][1]}")
    caps = [s["capacity"] for s in out["searches"] if s["capacity"] is not None]
    console.print(t)
    console.print(f"one step = {step:g}; the searches {'agree' if out['searches_agree'] else 'DISAGREE'} within one "
                  f"step ({', '.join(str(c) for c in caps)})")
    console.print(f"wrote {a.out}")


def _grid_entry(folder: Path, slo: Any, figure: str, load0: float) -> dict[str, Any]:
    judged = _judged(folder, slo)
    lo, hi = grid_boundary(judged)
    return {"run": folder.name, "max_passing": lo, "min_failing": hi,
            "requests": sum(j["measured"] for j in judged), "points": len(judged),
            "load_avg": [load0, _load_avg()],
            "judged": [{"load": j["load"], "passed": j["passed"], f"{figure}_ms": j["thresholds"][0]["value"]}
                       for j in judged]}


def _save(out: dict[str, Any], a: argparse.Namespace, res: Any) -> float:
    """Judge the searches so far against the grid and write the JSON: after the grid and after each search,
    so a run cut short (a device call's time limit) keeps what it measured. Returns one resolution step."""
    g = out["grid"]
    step = max(1.0, res.width(g["min_failing"] or a.parallel))
    for s in out["searches"]:
        s["within_one_step"] = s["capacity"] is not None and g["max_passing"] is not None and \
            abs(s["capacity"] - g["max_passing"]) <= step
        s["share_of_grid_requests"] = s["requests"] / max(1, g["requests"])
    caps = [s["capacity"] for s in out["searches"] if s["capacity"] is not None]
    out["searches_agree"] = bool(caps) and max(caps) - min(caps) <= step
    if "grid_again" in out:
        g2 = out["grid_again"]
        g2["within_one_step"] = None not in (g2["max_passing"], g["max_passing"]) and \
            abs(g2["max_passing"] - g["max_passing"]) <= step
        for s in out["searches"]:
            s["within_one_step_of_grid_again"] = s["capacity"] is not None and g2["max_passing"] is not None and \
                abs(s["capacity"] - g2["max_passing"]) <= step
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(a.out).with_suffix(".tmp")
    tmp.write_text(json.dumps(out, indent=2, default=str))
    tmp.replace(a.out)
    return step


if __name__ == "__main__":
    main()
