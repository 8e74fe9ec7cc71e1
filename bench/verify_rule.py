"""Issue 51's verification rule, measured on this box's own launch-to-launch noise: how often it holds a candidate
that is no better than the starter (false holds) and one that is better (power), as rounds are added; the range
rule it replaced beside it.

    .venv/bin/python bench/verify_rule.py [--sims 2000] [--runs docs/tune-runs] [--exclude NAME ...]
                                          [--out bench/results/verify_rule.json]

--exclude leaves out the runs whose folder name is NAME (`--exclude smol8g`: the noise as it stood before smol8g,
the run whose repeats this bench chose).

1. The noise: every starter launch of every llama.cpp tune verification kept under --runs (tune.json's
   verification figures), each as its relative deviation from its own run's median. They are real launches of
   the same entry minutes apart on the 2-core box, so they carry what moves a figure here (other work, heat, a
   capacity search that ended one step lower), including gemma8's launch that met the SLO at no load (0).
2. Simulated verifications: each side's launch r is 1.5 good req/s × (1 + lead for the candidate) × (1 + a
   deviation drawn from 1, with replacement), the two sides drawn independently (no round-to-round drift shared
   by a pair: the pairing's least favourable case). Both rules judge the same draws: tune/verify.py's verdict,
   and the range rule as it stood before this change (median lead > the larger range, every round led, from 3
   rounds the paired interval above 0).
3. The kept verifications themselves, judged by both rules (known after the fact: a check that the rule does not
   turn the runs' near-ties into wins, not evidence that it is right).
Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from servedeck.tune import verify as V

LEADS = (0.0, 0.05, 0.10, 0.20, 0.30)
ROUNDS = (2, 3, 5, 8)


def _fig(value: float, repeat: int) -> dict[str, Any]:
    return {"cell": "sim", "repeat": repeat, "state": "done", "runs": [], "value": value, "bound": False,
            "steps": [], "gate": "passed", "why": None}


def range_rule(figs: dict[str, list[dict[str, Any]]]) -> bool:
    """The rule tune/verify.py used before: the median lead over the larger of the two ranges, every round led,
    and from 3 rounds the paired interval above 0 (kept here only to be measured beside the new one)."""
    base = [f["value"] for f in figs["starter"] if f.get("value") is not None]
    cand = [f["value"] for f in figs["t2"] if f.get("value") is not None]
    margin = statistics.median(cand) - statistics.median(base)
    spread = max(max(cand) - min(cand), max(base) - min(base))
    r = V.paired_rounds(figs["starter"], figs["t2"])
    return margin > spread and r["won"] == r["pairs"] and (r["low"] is None or r["low"] > 0)


def noise(root: Path, exclude: tuple[str, ...] = ()) -> tuple[list[float], list[dict[str, Any]]]:
    """Relative deviations of every kept starter launch from its run's median, and each kept verification."""
    devs: list[float] = []
    kept = []
    for tj in sorted(root.glob("*/*/tune.json")):
        if tj.parent.name in exclude:
            continue
        ver = json.loads(tj.read_text()).get("verification") or {}
        figs = ver.get("figures") or {}
        vals = [f["value"] for f in figs.get("starter", []) if f.get("value") is not None]
        if len(vals) < 2:
            continue
        med = statistics.median(vals)
        devs += [v / med - 1.0 for v in vals]
        kept.append({"run": str(tj.parent.relative_to(root)), "figures": figs, "verdict": ver.get("verdict")})
    return devs, kept


def simulate(devs: list[float], rounds: int, lead: float, sims: int, rng: np.random.Generator) -> dict[str, float]:
    new = old = 0
    d = np.asarray(devs)
    for _ in range(sims):
        b = 1.5 * (1 + rng.choice(d, rounds))
        c = 1.5 * (1 + lead) * (1 + rng.choice(d, rounds))
        figs = {"starter": [_fig(float(x), i + 1) for i, x in enumerate(b)],
                "t2": [_fig(float(x), i + 1) for i, x in enumerate(c)]}
        new += V.verdict(figs, {})["verdict"] == V.VERIFIED
        old += range_rule(figs)
    return {"paired": new / sims, "range": old / sims}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sims", type=int, default=2000)
    ap.add_argument("--runs", type=Path, default=Path("docs/tune-runs"))
    ap.add_argument("--exclude", nargs="*", default=[])
    ap.add_argument("--seed", type=int, default=51)
    ap.add_argument("--out", type=Path, default=Path("bench/results/verify_rule.json"))
    a = ap.parse_args()
    devs, kept = noise(a.runs, tuple(a.exclude))
    rng = np.random.default_rng(a.seed)
    con = Console(width=120)
    con.print(f"noise: {len(devs)} starter launches from {len(kept)} verifications under {a.runs}; relative "
              f"deviation from their run's median: sd {statistics.stdev(devs):.3f}, "
              f"min {min(devs):+.2f}, max {max(devs):+.2f}")
    grid = []
    t = Table(title=f"how often a candidate holds ({a.sims} simulated verifications a cell): paired rule / range rule")
    t.add_column("candidate's lead")
    for n in ROUNDS:
        t.add_column(f"{n} rounds", justify="right")
    for lead in LEADS:
        cells = []
        for n in ROUNDS:
            r = simulate(devs, n, lead, a.sims, rng)
            grid.append({"lead": lead, "rounds": n, **r})
            cells.append(f"{r['paired']:.1%} / {r['range']:.1%}")
        t.add_row(f"{lead:+.0%}", *cells)
    con.print(t)
    past = []
    k = Table(title="the kept verifications, judged by each rule (after the fact)")
    for col in ("run", "candidate", "rounds", "paired rule", "range rule"):
        k.add_column(col)
    for run in kept:
        for name, figs in run["figures"].items():
            if name == V.STARTER:
                continue
            pair = {"starter": run["figures"][V.STARTER], "t2": figs}
            new = V.verdict(pair, {})
            row = new["trials"]["t2"]
            old = range_rule(pair)  # unfiltered: paired_rounds pairs launches by round and skips a missing figure
            past.append({"run": run["run"], "candidate": name, "paired": row["outcome"], "range_holds": old,
                         "why": row.get("why"), "recorded": run["verdict"]})
            k.add_row(run["run"], name, f"{(row.get('rounds') or {}).get('pairs')}", row["outcome"],
                      "holds" if old else "not")
    con.print(k)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps({"sims": a.sims, "seed": a.seed, "exclude": a.exclude, "noise": {"n": len(devs), "deviations": devs},
                                 "grid": grid, "kept": past}, indent=1) + "\n")
    con.print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
