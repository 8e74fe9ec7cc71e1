"""`servedeck compare A B`: what changed between two runs (or two variants of a campaign), and
whether it matters.

1. What changed: every knob (report/knobs.py) that differs. More than one configuration knob: the
   difference cannot be credited to any one of them, and the verdict says so first.
2. Whether it matters, per load point both sides measured:
   - TTFT, TPOT, E2E medians. When both sides sent the same prompts (same `prompt_seed`, and the
     records' prompt digests agree index by index: checked, not assumed), request i of A is paired
     with request i of B and the interval is a paired bootstrap; otherwise an unpaired one, labelled.
   - output tok/s: one number per launch, so only repeats give an interval (Welch t across them).
3. Accuracy, per accuracy gate both sides ran: sample i of A with sample i of B (same id, same prompt
   digest), McNemar's exact test and the paired difference's interval (report/accuracy.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from servedeck.fsio import read_jsonl
from servedeck.loadgen.records import RequestRecord
from servedeck.loadgen.stats import tpot
from servedeck.report.capacity import compare_capacity
from servedeck.report.accuracy import PairedAccuracy, compare_runs as paired_accuracy
from servedeck.report.attribution import Attribution, attribute, sentence
from servedeck.report.collect import Run
from servedeck.report.energy import j_per_token
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
    att: Attribution  # by the campaign's knobs where both sides carry them (report/attribution.py)
    accuracy: list[PairedAccuracy] = field(default_factory=list)  # each accuracy gate both ran (report/accuracy.py)
    capacity: list[dict[str, Any]] = field(default_factory=list)  # each SLO both searched (report/capacity.py)

    @property
    def attribution(self) -> str:
        asked = [c[0] for c in self.changes if c[0].startswith(WORKLOAD_PREFIX)]
        if asked:
            return (f"the workloads differ ({', '.join(asked)}): the two sides measured different things, "
                    "so no difference can be attributed to the configuration")
        return sentence(self.att)

    def to_json(self) -> dict[str, Any]:
        return {"a": [r.name for r in self.a], "b": [r.name for r in self.b],
                "changes": [{"knob": n, "a": x, "b": y} for n, x, y in self.changes],
                "config_changes": [n for n, _, _ in self.config_changes],
                "knobs": [{"knob": n, "a": x, "b": y} for n, x, y in self.att.knobs],
                "knobs_from": "campaign.json" if self.att.declared else "the rendered launches",
                "consequences": [{"knob": n, "a": x, "b": y} for n, x, y in self.att.consequences],
                "attribution": self.attribution,
                "accuracy": [x.to_json() for x in self.accuracy],
                "capacity": self.capacity,
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
    energy = [j_per_token(runs, label) for runs in (a_runs, b_runs)]
    if energy[0] and energy[1]:  # both sides' GPUs were sampled (telemetry): one figure per launch, as tok/s
        pc.verdicts.append(judge("J per output token", "repeats", energy[0], energy[1], lower_is_better=True,
                                 noise=noise))
    return pc


def compare(a: list[Run], b: list[Run], noise: float = NOISE) -> Comparison:
    """A and B: one run each, or each side's runs of one configuration: its repeats, and its workloads
    (runs of one `[[workloads]]` entry are repeats of each other; two chat entries are two workloads)."""
    ka, kb = a[0].knobs, b[0].knobs
    changes = changed(ka, kb)
    config = [c for c in changes if not c[0].startswith(NOT_CONFIG)]
    keys = [k for k in dict.fromkeys(r.workload_key for r in a) if any(x.workload_key == k for x in b)]
    points: list[PointComparison] = []
    only_a: list[str] = []
    only_b: list[str] = []
    labels_seen: set[str] = set()
    for key in keys:
        ra = [r for r in a if r.workload_key == key]
        rb = [r for r in b if r.workload_key == key]
        a_recs, b_recs = [_records(r) for r in ra], [_records(r) for r in rb]
        la = [str(p.get("label")) for p in ra[0].view.get("points") or []]
        lb = {str(p.get("label")) for r in rb for p in r.view.get("points") or []}
        for label in la:
            if label in lb:
                pc = _point(label, ra, rb, a_recs, b_recs, noise)
                if label in labels_seen:  # the same load point in two workloads: say which
                    pc.label = f"{key}: {label}"
                labels_seen.add(label)
                points.append(pc)
        only_a += [x for x in la if x not in lb]
        only_b += sorted(lb - set(la))
    if not keys:  # no workload in common: say what each side has
        only_a = [str(p.get("label")) for r in a for p in r.view.get("points") or []]
        only_b = sorted({str(p.get("label")) for r in b for p in r.view.get("points") or []})
    return Comparison(a, b, changes, config, points, only_a, only_b, attribute(a[0], b[0], config),
                      paired_accuracy(a, b), compare_capacity(a, b))


def text(c: Comparison) -> str:
    """The comparison for a terminal (and report.md)."""
    out = [f"A: {', '.join(r.name for r in c.a)}", f"B: {', '.join(r.name for r in c.b)}", "", "What changed:"]
    if not c.changes:
        out.append("  nothing: same build, flags, env, host, versions and workload")
    follows = {n for n, _, _ in c.att.consequences}
    for n, x, y in c.changes:
        out.append(f"  {n}: {x} → {y}" + ("  (follows from the campaign's knob)" if n in follows else ""))
    if c.att.declared:
        out.append("The campaign's knobs (campaign.json), and what changed that none of them explains:")
        out += [f"  {n}: {x} → {y}" for n, x, y in c.att.knobs] or ["  none differ"]
    out += ["", c.attribution[0].upper() + c.attribution[1:] + ".", ""]
    for x in c.accuracy:
        out += [f"accuracy (gate {x.gate}): A {x.a_accuracy:.1%}, B {x.b_accuracy:.1%}: {x.text}", ""]
    for x in c.capacity:
        out += [f"capacity ({x['slo']}): {x['text']}", ""]
    for p in c.points:
        out.append(f"{p.label} ({p.pairing}):")
        for v in p.verdicts:
            out.append(f"  {v.figure}: {v.text}")
    if c.only_a or c.only_b:
        out.append(f"points measured on one side only: A {c.only_a or '-'}, B {c.only_b or '-'}")
    return "\n".join(out) + "\n"
