"""Capacity under an SLO, for people: one run's search (summary.md, `show`), and across a campaign's
variants the capacity per SLO and the recommendation (campaign.md, the report).

Pure functions over run views (runs.read.load) and their search.json; nothing is measured here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional, Sequence

from servedeck.mdtable import table as _table
from servedeck.report.capacity_energy import at_capacity, j_text, mean_at_capacity, w_text
from servedeck.report.recommend import bound_step, outputs_of, pair, recommendations
from servedeck.report.stats import spread


def _n(x: Optional[float], digits: int = 1) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{digits}f}"


def load_label(find: str, load: Optional[float]) -> str:
    if load is None:
        return "-"
    return f"c={load:g}" if find == "max-concurrency" else f"{load:g} req/s"


def search_of(view: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The run's search.json, or None (not a capacity run, or the file is gone)."""
    if not view.get("capacity") or not view.get("path"):
        return None
    try:
        return json.loads((Path(view["path"]) / "search.json").read_text())
    except (OSError, ValueError):
        return None


def _limit_text(row: dict[str, Any]) -> str:
    if row["key"] == "error_rate":
        return f"{row['limit'] * 100:g} %"
    return f"{row['limit']:g} ms"


def _value_text(row: dict[str, Any]) -> str:
    if row.get("value") is None:
        return "∞ (failed requests)"
    return f"{row['value'] * 100:.1f} %" if row["key"] == "error_rate" else f"{row['value']:.1f} ms"


def run_section(view: dict[str, Any]) -> list[str]:
    """One capacity run: the answer, then every step with each threshold's figure."""
    doc = search_of(view)
    cap = view.get("capacity")
    if not cap:
        return []
    out = ["## Capacity", ""]
    find = cap["find"]
    what = "concurrency" if find == "max-concurrency" else "request rate"
    verdict = cap["verdict"]
    if verdict == "fails at smallest load":
        out.append(f"**The SLO `{cap['slo_text']}` fails already at the smallest load** "
                   f"({load_label(find, (cap['boundary'] or {}).get('min_failing'))}).")
    elif cap.get("capacity") is None:
        out.append(f"No capacity found for `{cap['slo_text']}` ({verdict}).")
    else:
        b = cap["boundary"]
        step = bound_step(cap)  # a search that did not pin the capacity down: a lower bound (report/recommend.py)
        ge = _ge(step is not None)
        how = (f"a lower bound on the max {what} within `{cap['slo_text']}`: the search ended {verdict}; {step} "
               "would pin it down" if step
               else f"max {what} within `{cap['slo_text']}`; {verdict}")
        out.append(f"**Capacity {ge}{load_label(find, cap['capacity'])}** ({how}): the first failing load is "
                   f"{load_label(find, b.get('min_failing'))}"
                   + (f", binding constraint **{cap['binding']}**" if cap.get("binding") else "")
                   + (f", a {cap['shape']} boundary" if cap.get("shape") else "")
                   + f". Goodput there {ge}{_n(cap.get('goodput_request_s'), 2)} requests/s, "
                   f"{ge}{_n(cap.get('output_tok_s'))} output tok/s."
                   + _energy_sentence(at_capacity(view)))
    out.append("")
    out.append(f"{cap['steps']} steps, {cap['requests']} measured requests; cap {load_label(find, cap['cap']['load'])} "
               f"({cap['cap']['reason']}).")
    if cap.get("notes"):
        out += [""] + [f"- {note}" for note in cap["notes"]]
    if doc and (doc.get("shape") or {}).get("detail"):
        out += ["", f"Boundary: {doc['shape']['detail']}."]
    if doc:
        keys = [t["key"] for t in doc["slo"]["thresholds"]]
        rows = []
        for s in doc["steps"]:
            j = s["judged"]
            cells = {r["key"]: f"{_value_text(r)}{'' if r['passed'] else ' ✗'}" for r in j["thresholds"]}
            rows.append([str(s["step"]), load_label(find, s["load"]), s["phase"],
                         *[cells.get(k, "-") for k in keys],
                         "pass" if s["passed"] else ("overloaded" if j.get("overloaded") else "fail"), s["why"]])
        head = ["step", "load", "phase", *[f"{k} ≤ {_limit_text(t)}" for k, t in
                                            zip(keys, doc["slo"]["thresholds"])], "verdict", "why"]
        out += ["", _table(head, rows)]
    out.append("")
    return out


def _energy_sentence(e: dict[str, Any]) -> str:
    if e.get("j_per_output_token") is None:
        return f" Energy there: {e.get('missing') or 'none recorded'}."
    return (f" Energy there {e['j_per_output_token']:.4g} J per output token ({e.get('energy_source')})"
            + (f", mean power {e['mean_power_w']:.0f} W" if e.get("mean_power_w") is not None else "") + ".")


# --- across a campaign's variants ---------------------------------------------------------------

def per_gpu(x: Optional[float], gpus: Optional[int]) -> Optional[float]:
    """A figure per GPU; on a host without GPUs (gpus 0) the figure as it is, per launch."""
    if x is None:
        return None
    return x / gpus if gpus else x


def _gate_of(v: dict[str, Any]) -> str:
    return str((v.get("gate") or {}).get("status") or "not run")


def capacity_rows(views: list[dict[str, Any]], outputs: Optional[dict[str, dict[str, Any]]] = None) -> list[dict[str, Any]]:
    """One row per variant and SLO: the capacity of each repeat, their mean and interval, and what it carried
    there per GPU (goodput, output tok/s); whether it is a lower bound (a search that did not end `found`:
    report/recommend.py) and the steps that would pin it down; the launches' gate (a capacity whose gate is
    not `passed` is recorded but is not a result: `result` False); the energy at the capacity point
    (report/capacity_energy.py); and `outputs`, the variant's greedy outputs against the campaign's
    reference (recommend.outputs_of), None where nothing was checked."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for v in views:
        cap = v.get("capacity")
        if not cap:
            continue
        variant = (v.get("campaign") or {}).get("variant") or v.get("layout") or v.get("run")
        groups.setdefault((cap.get("slo") or "slo", variant), []).append(v)
    rows = []
    for (slo, variant), vs in sorted(groups.items()):
        caps = [v["capacity"] for v in vs]
        gpus = vs[0].get("gpus_used") or 0
        with_cap = [c for c in caps if c.get("capacity") is not None]
        loads = [c["capacity"] for c in with_cap]
        per = [p for p in (per_gpu(x, gpus) for x in loads) if p is not None]
        tok = [per_gpu(c.get("output_tok_s"), gpus) for c in with_cap]
        good = [g for g in (per_gpu(c.get("goodput_request_s"), gpus) for c in with_cap) if g is not None]
        steps = [s for s in dict.fromkeys(bound_step(c) for c in with_cap) if s]
        # every repeat stopped below its floor (stop_below): its figure is a bound, and so is what it could reach
        ceilings = [x for x in (per_gpu((c.get("below_floor") or {}).get("ceiling"), gpus) for c in caps)
                    if x is not None]
        gates = [_gate_of(v) for v in vs]
        energy = mean_at_capacity(vs)
        rows.append({"slo": slo, "slo_text": caps[0].get("slo_text"), "variant": variant, "find": caps[0]["find"],
                     "capacity": (sum(loads) / len(loads)) if loads else None,
                     "capacity_per_gpu": (sum(per) / len(per)) if per else None, "capacities_per_gpu": per,
                     "interval": _interval(loads), "repeats": len(caps), "gpus": gpus,
                     "goodput_per_gpu": _mean(good), "goodputs_per_gpu": good, "goodput_interval": _interval(good),
                     "output_tok_s_per_gpu": _mean(tok), "bound": bool(steps), "steps": steps,
                     "ceiling_per_gpu": max(ceilings) if caps and len(ceilings) == len(caps) else None,
                     "outputs": (outputs or {}).get(variant) if outputs else None, "checked": bool(outputs),
                     "binding": caps[-1].get("binding"), "verdicts": [c["verdict"] for c in caps],
                     "gates": gates, "gate": ", ".join(dict.fromkeys(gates)),
                     "result": all(g == "passed" for g in gates),
                     "j_per_output_token": energy["j_per_output_token"], "mean_power_w": energy["mean_power_w"],
                     "energy_source": energy["energy_source"], "energy_missing": energy["missing"],
                     "energy_partial": energy.get("partial") or 0,
                     "runs": [v.get("run") for v in vs], "point": caps[-1].get("point")})
    return rows


def _interval(xs: list[float]) -> Optional[dict[str, float]]:
    sp = spread(xs)
    return {"lo": sp.low, "hi": sp.high} if sp.low is not None and sp.high is not None else None


def _mean(xs: Sequence[Optional[float]]) -> Optional[float]:
    vals = [x for x in xs if x is not None]
    return sum(vals) / len(vals) if vals else None


def _energy(row: dict[str, Any]) -> dict[str, Any]:
    return {"j_per_output_token": row.get("j_per_output_token"), "mean_power_w": row.get("mean_power_w"),
            "missing": row.get("energy_missing"), "partial": row.get("energy_partial")}


def _ge(bound: bool) -> str:
    return "≥ " if bound else ""


def _good_text(r: dict[str, Any], interval: bool = True) -> str:
    """Good requests/s per GPU at capacity: "≥ 52.57" for a lower bound, with the repeats' interval."""
    ci = r.get("goodput_interval") if interval else None
    return _ge(r["bound"]) + _n(r["goodput_per_gpu"], 2) + (f" [{ci['lo']:.4g}, {ci['hi']:.4g}]" if ci else "")


def _cap_text(r: dict[str, Any]) -> str:
    """The load the capacity took (per launch), "≥ c=32" for a lower bound, with the repeats' interval."""
    ci = r.get("interval")
    return _ge(r["bound"]) + load_label(r["find"], r["capacity"]) + (f" [{ci['lo']:.3g}, {ci['hi']:.3g}]" if ci else "")


def outputs_text(r: dict[str, Any]) -> str:
    """The variant's greedy outputs against the reference variant's, for the tables."""
    o = r.get("outputs")
    if not r.get("checked"):
        return "not checked (no campaign `reference`)"
    if not o:
        return "not checked"
    ref, check = o["reference"], o["check"]
    if check == "reference":
        return "the reference"
    if check == "identical":
        return f"identical to {ref} ({o['identical']}/{o['prompts']})"
    if check == "differs":
        return (f"differ from {ref} ({o['identical']}/{o['prompts']} identical)"
                + (", allowed: outputs_may_differ" if o.get("may_differ") else ": not recommended"))
    return f"{check} against {ref}"


def _how(rec: dict[str, Any], unit: str) -> str:
    """By how much the recommended variant carries more than the next one, in words."""
    if rec["next"] is None:
        return "the only variant whose capacity is a result and whose outputs may be served"
    nxt = f"{rec['next']} ({_n(rec['next_goodput_per_gpu'], 2)})"
    least = "at least " if rec["bound"] else ""
    if rec["by"] is None:
        return f"over {nxt}"
    ci = rec.get("by_interval")
    if ci is None:
        return f"{least}{rec['by']:+.0%} over {nxt}" + (f"; no interval: {rec['no_interval']}"
                                                        if rec.get("no_interval") else "")
    if not ci["spread"]:
        return (f"{least}{rec['by']:+.0%} [{ci['lo']:+.0%}, {ci['hi']:+.0%}] over {nxt}; every repeat of both "
                "carried the same")
    text = f"{least}{rec['by']:+.0%} [{ci['lo']:+.0%}, {ci['hi']:+.0%}] (95 %, repeats, Welch t) over {nxt}"
    if ci["lo"] <= 0:
        text += "; the interval includes no difference: not distinguishable from noise"
    return text


def _undecided_text(rec: dict[str, Any], unit: str) -> str:
    lead = f"{rec['leading']} ({_ge(rec['bound'])}{_n(rec['goodput_per_gpu'], 2)})"
    could = "; ".join(f"{u['variant']} (≥ {_n(u['goodput_per_gpu'], 2)} req/s {unit}) could still carry more "
                      f"than {lead}" for u in rec["undecided"])
    steps = "; ".join(f"{u['step']} for {u['variant']} would decide" for u in rec["undecided"])
    return f"{rec['leading']} leads with {_good_text(rec)} good req/s {unit} at {_cap_text(rec)}, but {could}: {steps}"


def _left_out_text(rec: dict[str, Any], unit: str) -> str:
    return "; ".join(f"{x['variant']} ({_ge(x['bound'])}{_n(x['goodput_per_gpu'], 2)} req/s {unit} at "
                     f"{_ge(x['bound'])}{load_label(x['find'], x['capacity'])}; {x['why']})"
                     for x in rec.get("left_out") or []) or "-"


def recommendation_rows(rows: list[dict[str, Any]], unit: str, *, bold: bool) -> list[list[str]]:
    """The recommendation table's rows (SLO, run this variant, carrying, left out): campaign.md's and the
    report's alike."""
    out = []
    for rec in recommendations(rows):
        slo = f"{rec['slo']} (`{rec['slo_text']}`)" if bold else f"{rec['slo']} ({rec['slo_text']})"
        if rec["verdict"] == "none":
            out.append([slo if rec.get("slo_text") else rec["slo"], "-", rec["note"], _left_out_text(rec, unit)])
        elif rec["verdict"] == "undecided":
            out.append([slo, "**undecided**" if bold else "undecided", _undecided_text(rec, unit),
                        _left_out_text(rec, unit)])
        else:
            tok = (f" ({_ge(rec['bound'])}{_n(rec['output_tok_s_per_gpu'])} output tok/s)"
                   if rec.get("output_tok_s_per_gpu") else "")
            out.append([slo, f"**{rec['best']}**" if bold else rec["best"],
                        f"{_good_text(rec)} good req/s {unit}{tok} at {_cap_text(rec)}, {_how(rec, unit)}",
                        _left_out_text(rec, unit)])
    return out


CAPACITY_HEAD = ["SLO", "variant", "goodput req/s {unit}", "output tok/s {unit}", "load at capacity",
                 "greedy outputs", "binding constraint", "J / output token at capacity", "mean W at capacity",
                 "gate", "repeats", "search"]
RULES = ("Ranked by good requests/s per GPU at capacity (requests that met the SLO); the load is what that "
         "took. \"≥\" marks a lower bound: a search that did not end `found` (client-bound, capped at `max`, "
         "unstable above, step budget spent, cut short; a cap the engine set, its slots or KV cache, is a figure). "
         "A bound below another's figure decides nothing: undecided, with "
         "the step that would decide. A capacity whose gate is not `passed` is not a result, and a variant whose "
         "greedy outputs differ from the reference variant's is not recommended unless its entry says "
         "`outputs_may_differ = true`: the recommendation leaves both out.")


def _row_cells(r: dict[str, Any], slo: str) -> list[str]:
    return [slo, r["variant"], _good_text(r), _ge(r["bound"]) + _n(r["output_tok_s_per_gpu"]), _cap_text(r),
            outputs_text(r), r["binding"] or "-", j_text(_energy(r)), w_text(_energy(r)),
            r["gate"] if r["result"] else f"{r['gate']}: not a result", str(r["repeats"]), ", ".join(r["verdicts"])]


def campaign_section(rows: list[dict[str, Any]]) -> list[str]:
    """campaign.md's and the report's capacity tables (from capacity_rows): per variant and SLO, then the
    recommendation."""
    if not rows:
        return []
    unit = "per GPU" if any(r["gpus"] for r in rows) else "per launch (CPU)"
    out = ["## Capacity under each SLO", "",
           _table([h.format(unit=unit) for h in CAPACITY_HEAD],
                  [_row_cells(r, f"{r['slo']} (`{r['slo_text']}`)") for r in rows]),
           "", RULES, "", "### Recommendation", ""]
    out += [_table(["SLO", "run this variant", "carrying", "left out"], recommendation_rows(rows, unit, bold=True)),
            ""]
    return out


def section(coll: Any) -> Any:
    """The report's section (report/sections.py SECTIONS): the capacity table and the recommendation, each
    capacity linked to the search.json it came from; None when no run searched for a capacity."""
    from servedeck.report.blocks import Link, Para, Section, Table

    runs = [r for r in coll.runs if r.view.get("capacity")]
    if not runs:
        return None
    views = []
    for r in runs:
        v = dict(r.view)
        v.setdefault("campaign", {})
        v["campaign"] = {**(v.get("campaign") or {}), "variant": r.variant or (v["campaign"] or {}).get("variant")}
        views.append(v)
    rows = capacity_rows(views, outputs=outputs_of(coll.campaign or {}))
    by_name = {r.name: r for r in runs}
    gpus = any(r["gpus"] for r in rows)
    unit = "per GPU" if gpus else "per launch (CPU)"
    table: list[list[Any]] = []
    for row in rows:
        links = [Link(f"search.json #{i + 1}" if len(row["runs"]) > 1 else "search.json",
                      by_name[name].path / "search.json") for i, name in enumerate(row["runs"]) if name in by_name]
        table.append([*_row_cells(row, f"{row['slo']} ({row['slo_text']})"), links])
    return Section("capacity", "Capacity under each SLO", [
        Para(["The most load each variant carried within each SLO, found by a search (bracket by doubling, "
              "bisect, both ends re-measured with fresh prompts); every step is a point of its run folder. "
              "The energy is the capacity step's (its GPUs' energy over the measured window; mean power summed "
              "over the launch's GPUs). " + RULES]),
        Table([*(h.format(unit=unit) for h in CAPACITY_HEAD), "sources"], table),
        Para(["Recommendation: for each SLO, among the variants whose gate passed and whose outputs may be "
              "served, the one carrying the most good requests/s " + unit + "; the interval is from the repeats."]),
        Table(["SLO", "run this variant", "carrying", "left out"], recommendation_rows(rows, unit, bold=False))])


def compare_capacity(a: list[Any], b: list[Any]) -> list[dict[str, Any]]:
    """`servedeck compare A B`: per SLO both sides searched, what each carried within it per GPU (good requests/s
    and output tok/s at its capacity, the mean of its repeats; "≥" where a search did not pin it down), the
    load that took, which carries more by the recommendation's rules (report/recommend.py pair: "undecided"
    with the step that would decide where a bound decides nothing), the greedy outputs of the two sides
    where both answered the output check, each side's gate and the energy at its capacity points. `a`, `b`:
    report Runs (collect.Run), each side one configuration."""
    def by_slo(runs: list[Any], side: str) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for r in runs:
            cap = r.view.get("capacity")
            if cap:
                view = {**r.view, "campaign": {**(r.view.get("campaign") or {}), "variant": side},
                        "gpus_used": getattr(r, "gpus_used", None) or r.view.get("gpus_used") or 0}
                out.setdefault(f"{cap['find']} under {cap.get('slo')} ({cap.get('slo_text')})", []).append(view)
        return out

    sa, sb = by_slo(a, "A"), by_slo(b, "B")
    outputs = outputs_ab(a, b)
    rows = []
    for key in [k for k in sa if k in sb]:
        got = {r["variant"]: r for r in capacity_rows(sa[key] + sb[key], outputs=outputs)}
        ra, rb = got["A"], got["B"]
        unit = "per GPU" if ra["gpus"] or rb["gpus"] else "per launch (CPU)"
        d = pair(ra, rb)
        ea, eb = mean_at_capacity(sa[key]), mean_at_capacity(sb[key])
        not_results = [f"{n}'s gate {r['gate']}: not a result" for n, r in (("A", ra), ("B", rb)) if not r["result"]]
        text = (f"A {_side_text(ra)}, B {_side_text(rb)} (good req/s {unit} at the load it took)"
                + f": {_pair_text(d, ra, rb)}"
                + f" (searches: A {', '.join(ra['verdicts'])}; B {', '.join(rb['verdicts'])})"
                + (f"; {_outputs_pair_text(rb)}" if outputs else "; greedy outputs not compared (both sides need "
                   "outputs.jsonl: `bench --check-outputs`)")
                + f"; at capacity J / output token A {j_text(ea)}, B {j_text(eb)}, mean W A {w_text(ea)}, "
                  f"B {w_text(eb)}"
                + (f"; {'; '.join(not_results)}" if not_results else ""))
        rows.append({"slo": key, "a": ra["capacity"], "b": rb["capacity"],
                     "a_goodput": ra["goodput_per_gpu"], "b_goodput": rb["goodput_per_gpu"],
                     "a_output_tok_s": ra["output_tok_s_per_gpu"], "b_output_tok_s": rb["output_tok_s_per_gpu"],
                     "a_bound": ra["bound"], "b_bound": rb["bound"], "per": unit,
                     "change": d["change"], "verdict": d["verdict"], "decide": d["step"],
                     "outputs": rb["outputs"], "a_verdicts": ", ".join(ra["verdicts"]),
                     "b_verdicts": ", ".join(rb["verdicts"]), "a_gate": ra["gate"], "b_gate": rb["gate"],
                     "a_energy": ea, "b_energy": eb, "text": text})
    return rows


def _side_text(r: dict[str, Any]) -> str:
    return f"{_good_text(r, interval=False)} at {_ge(r['bound'])}{load_label(r['find'], r['capacity'])}"


def _pair_text(d: dict[str, Any], ra: dict[str, Any], rb: dict[str, Any]) -> str:
    if d["verdict"] == "no figure":
        return "no goodput recorded at one side's capacity"
    if d["verdict"] == "undecided":
        low, high = (rb, ra) if d["open"] == "B" else (ra, rb)
        return (f"undecided: {d['open']} (≥ {_n(low['goodput_per_gpu'], 2)}) could still carry more than "
                f"{'A' if d['open'] == 'B' else 'B'} ({_good_text(high, interval=False)}); {d['step']} for "
                f"{d['open']} would decide")
    if d["verdict"] == "same":
        return "both carry the same"
    return f"B carries {d['qualifier']}{d['change']:+.0%}"


def _outputs_pair_text(rb: dict[str, Any]) -> str:
    o = rb.get("outputs") or {}
    if o.get("check") == "differs":
        return (f"B's greedy outputs differ from A's ({o['identical']}/{o['prompts']} prompts identical)"
                + (": allowed by its campaign entry's outputs_may_differ" if o.get("may_differ") else
                   ": B is not recommended in A's place unless its campaign entry says outputs_may_differ = true"))
    if o.get("check") == "identical":
        return f"greedy outputs identical ({o['identical']}/{o['prompts']} prompts)"
    return f"greedy outputs {o.get('check') or 'not checked'}"


def outputs_ab(a: list[Any], b: list[Any]) -> Optional[dict[str, dict[str, Any]]]:
    """A's and B's greedy outputs (each side's first run with outputs.jsonl) in recommend.outputs_of's shape, A
    the reference; None unless both sides answered the output check. B's campaign entry (its campaign.json
    beside the run folders) says whether its outputs may differ."""
    from servedeck.fsio import read_jsonl
    from servedeck.loadgen.outputs import compare as compare_outputs

    ra = next((r for r in a if (r.path / OUTPUTS).is_file()), None)
    rb = next((r for r in b if (r.path / OUTPUTS).is_file()), None)
    if ra is None or rb is None:
        return None
    try:
        got = compare_outputs(list(read_jsonl(ra.path / OUTPUTS)), list(read_jsonl(rb.path / OUTPUTS)))
    except (OSError, ValueError):
        return None
    return {"A": {"check": "reference", "reference": "A", "may_differ": False},
            "B": {"check": got["verdict"], "reference": "A", "identical": got["identical"],
                  "prompts": got["prompts"], "may_differ": _may_differ(rb)}}


OUTPUTS = "outputs.jsonl"  # the output check's file (workloads/outputs.py FILE)


def _may_differ(run: Any) -> bool:
    """Whether the campaign that made `run` let its variant's outputs differ (campaign.json, under the same
    results tree, as collect.declared_knobs reads it); False for a run of no campaign."""
    c = run.view.get("campaign") or {}
    if not c.get("folder") or not c.get("variant"):
        return False
    try:
        doc = json.loads((run.path.parent.parent / "campaigns" / str(c["folder"]) / "campaign.json").read_text())
        return bool((doc["variants"][c["variant"]] or {}).get("outputs_may_differ"))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def is_capacity_point(point: Any) -> bool:
    """Whether a report LoadPoint (report/pareto.py) is the load one of its runs' searches found as capacity."""
    for r in point.runs:
        cap = r.view.get("capacity") or {}
        load = cap.get("capacity")
        if load is None:
            continue
        if cap.get("find") == "max-concurrency" and point.label == f"c={load:g}":
            return True
        if cap.get("find") == "max-rate" and str(point.label).startswith(f"rate={load:g}/s"):
            return True
    return False
