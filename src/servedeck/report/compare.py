"""`servedeck compare A B`: what changed between two runs (or two variants of a campaign), and
whether it matters.

1. What changed: every knob (report/knobs.py) that differs. More than one configuration knob: the
   difference cannot be credited to any one of them, and the verdict says so first.
2. Whether it matters, per load point both sides measured:
   - TTFT, TPOT, E2E medians. When both sides sent the same prompts (same `prompt_seed`, and the
     records' prompt digests agree index by index: checked, not assumed), request i of A is paired
     with request i of B and the interval is a paired bootstrap; otherwise an unpaired one, labelled.
   - output tok/s: one number per launch, so only repeats give an interval (Welch t across them).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from servedeck.fsio import read_jsonl
from servedeck.loadgen.records import RequestRecord
from servedeck.loadgen.stats import tpot
from servedeck.report.collect import Run
from servedeck.report.knobs import NOT_CONFIG, WORKLOAD_PREFIX, changed
from servedeck.report.stats import NOISE, Verdict, judge

LATENCY = (("TTFT p50", "ttft"), ("TPOT p50", "tpot"), ("E2E p50", "e2e"))


@dataclass
class PointComparison:
    label: str
    pairing: str  # how the latency samples were matched, in words
    paired: bool
    verdicts: list[Verdict] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"label": self.label, "pairing": self.pairing, "paired": self.paired,
                "verdicts": [v.to_json() for v in self.verdicts]}


@dataclass
class Comparison:
    a: list[Run]
    b: list[Run]
    changes: list[tuple[str, str, str]]  # every knob that differs
    config_changes: list[tuple[str, str, str]]
    points: list[PointComparison]
    only_a: list[str]
    only_b: list[str]

    @property
    def attribution(self) -> str:
        n = len(self.config_changes)
        asked = [c[0] for c in self.changes if c[0].startswith(WORKLOAD_PREFIX)]
        if asked:
            return (f"the workloads differ ({', '.join(asked)}): the two sides measured different things, "
                    "so no difference can be attributed to the configuration")
        if n == 0:
            return "same configuration: any difference is run-to-run noise"
        if n == 1:
            return f"one knob changed ({self.config_changes[0][0]}): a difference can be credited to it"
        return (f"{n} knobs changed ({', '.join(c[0] for c in self.config_changes)}): a difference cannot be "
                "attributed to any one of them")

    def to_json(self) -> dict[str, Any]:
        return {"a": [r.name for r in self.a], "b": [r.name for r in self.b],
                "changes": [{"knob": n, "a": x, "b": y} for n, x, y in self.changes],
                "config_changes": [n for n, _, _ in self.config_changes], "attribution": self.attribution,
                "points": [p.to_json() for p in self.points], "only_a": self.only_a, "only_b": self.only_b,
                "noise_threshold": NOISE}


def _records(run: Run) -> dict[str, list[RequestRecord]]:
    """Measured, successful records of a run by point label."""
    labels = {p.get("index"): p.get("label") for p in run.view.get("points") or []}
    out: dict[str, list[RequestRecord]] = {}
    for line in read_jsonl(run.path / "requests.jsonl"):
        idx = line.pop("point", 0)
        try:
            r = RequestRecord.from_json(line)
        except (TypeError, ValueError):
            continue
        if r.kind == "measured" and r.status == "ok" and idx in labels:
            out.setdefault(str(labels[idx]), []).append(r)
    return out


def _value(r: RequestRecord, what: str) -> Optional[float]:
    v = r.ttft if what == "ttft" else tpot(r) if what == "tpot" else r.e2e
    return None if v is None else v * 1000.0


def _pairs(a: list[RequestRecord], b: list[RequestRecord]) -> tuple[list[tuple[RequestRecord, RequestRecord]], str]:
    """Pairs by prompt index whose digests agree, and what was found."""
    if any(r.prompt_digest is None for r in a + b):
        return [], "the records carry no prompt digest (written before servedeck recorded one)"
    ia = {r.prompt_index: r for r in a}
    ib = {r.prompt_index: r for r in b}
    common = sorted(set(ia) & set(ib), key=lambda x: (x is None, x))
    same = [(ia[i], ib[i]) for i in common if ia[i].prompt_digest == ib[i].prompt_digest]
    if len(same) < len(common):
        return [], f"prompt digests differ at {len(common) - len(same)} of {len(common)} shared indices"
    return same, f"{len(same)} requests with identical prompts (digest checked)"


def _point(label: str, a_runs: list[Run], b_runs: list[Run], a_recs: list[dict[str, list[RequestRecord]]],
           b_recs: list[dict[str, list[RequestRecord]]], noise: float) -> PointComparison:
    seeds = {r.view.get("prompt_seed") for r in a_runs + b_runs}
    pairs: list[tuple[RequestRecord, RequestRecord]] = []
    why = ""
    if None in seeds or len(seeds) != 1:
        why = ("no --seed on " + ("either side" if seeds == {None} else "one side") if None in seeds
               else f"different prompt seeds {sorted(seeds)}")
    else:
        # repeat i of A with repeat i of B: both sent the same prompt set
        for ra, rb in zip(a_recs, b_recs):
            got, why = _pairs(ra.get(label, []), rb.get(label, []))
            if not got:
                pairs = []
                break
            pairs += got
    pc = PointComparison(label, "", bool(pairs))
    if pairs:
        pc.pairing = f"paired: {len(pairs)} request pairs, same prompt seed, prompt digests equal index by index"
        for name, what in LATENCY:
            both = [(_value(x, what), _value(y, what)) for x, y in pairs]
            both = [(x, y) for x, y in both if x is not None and y is not None]
            pc.verdicts.append(judge(name, "paired", [x for x, _ in both], [y for _, y in both],
                                     lower_is_better=True, noise=noise))
    else:
        pc.pairing = f"unpaired ({why})"
        for name, what in LATENCY:
            va = [v for recs in a_recs for r in recs.get(label, []) if (v := _value(r, what)) is not None]
            vb = [v for recs in b_recs for r in recs.get(label, []) if (v := _value(r, what)) is not None]
            pc.verdicts.append(judge(name, "unpaired", va, vb, lower_is_better=True, noise=noise))
    tput = []
    for runs in (a_runs, b_runs):
        vals = []
        for r in runs:
            for p in r.view.get("points") or []:
                v = (p.get("figures") or {}).get("output_tok_s")
                if p.get("label") == label and isinstance(v, (int, float)):
                    vals.append(v / r.divisor)
        tput.append(vals)
    pc.verdicts.append(judge(f"output tok/s per {a_runs[0].per}", "repeats", tput[0], tput[1],
                             lower_is_better=False, noise=noise))
    return pc


def compare(a: list[Run], b: list[Run], noise: float = NOISE) -> Comparison:
    """A and B: one run each, or each side's repeats (same configuration)."""
    ka, kb = a[0].knobs, b[0].knobs
    changes = changed(ka, kb)
    config = [c for c in changes if not c[0].startswith(NOT_CONFIG)]
    a_recs = [_records(r) for r in a]
    b_recs = [_records(r) for r in b]
    la = [str(p.get("label")) for p in a[0].view.get("points") or []]
    lb = {str(p.get("label")) for r in b for p in r.view.get("points") or []}
    common = [x for x in la if x in lb]
    points = [_point(label, a, b, a_recs, b_recs, noise) for label in common]
    return Comparison(a, b, changes, config, points, [x for x in la if x not in lb],
                      sorted(lb - set(la)))


def text(c: Comparison) -> str:
    """The comparison for a terminal (and report.md)."""
    out = [f"A: {', '.join(r.name for r in c.a)}", f"B: {', '.join(r.name for r in c.b)}", "", "What changed:"]
    if not c.changes:
        out.append("  nothing: same build, flags, env, host, versions and workload")
    for n, x, y in c.changes:
        out.append(f"  {n}: {x} → {y}")
    out += ["", c.attribution[0].upper() + c.attribution[1:] + ".", ""]
    for p in c.points:
        out.append(f"{p.label} ({p.pairing}):")
        for v in p.verdicts:
            out.append(f"  {v.figure}: {v.text}")
    if c.only_a or c.only_b:
        out.append(f"points measured on one side only: A {c.only_a or '-'}, B {c.only_b or '-'}")
    return "\n".join(out) + "\n"
