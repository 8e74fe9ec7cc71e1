"""The report's sections, in order. Each is one function from the collected runs to a Section, or
None when the data for it is absent; a new kind of data (ramp, speculation) is one more function
appended to SECTIONS. Every number is computed here from the run folders; none is typed by hand.
"""

from __future__ import annotations

from typing import Callable, Optional

from servedeck.report.attribution import Attribution, attribute
from servedeck.report.capacity import section as capacity_section
from servedeck.report.blocks import Block, Cell, Figure, Link, Para, Pre, Section, Table
from servedeck.report.caveats import BUSY_MARGIN, BUSY_RATIO, Busy, busy_hosts, not_a_result, point_warnings, \
    standing, unit_of
from servedeck.report.collect import Collection, Run
from servedeck.report.accuracy import compare_runs as paired_accuracy, gate_names
from servedeck.report.compare import compare
from servedeck.report.energy import energy_section
from servedeck.report.knobs import changed, config_knobs
from servedeck.report.pareto import LoadPoint, load_points, pareto
from servedeck.report.render import ms, num
from servedeck.report.stats import Spread
from servedeck.report.timeline import timeline_section

FILES = ("summary.json", "requests.jsonl", "niah.log", "cmd.sh", "server.log", "summary.md")


def run_link(r: Run, text: Optional[str] = None) -> Link:
    return Link(text or r.name, r.path)


def file_link(r: Run, name: str) -> Link:
    return Link(name, r.path / name)


def _runs_cell(runs: list[Run]) -> list:
    return [Link(f"#{r.repeat}" if len(runs) > 1 else "run", r.path / "summary.json") for r in runs]


def _ci(s: Spread, fmt: Callable[[Optional[float]], str]) -> str:
    if s.n == 0:
        return "-"
    if s.n == 1:
        return fmt(s.mean)
    return f"{fmt(s.mean)} [{fmt(s.low)}, {fmt(s.high)}]"


def _first(coll: Collection) -> dict[str, Run]:
    return {v: runs[0] for v, runs in coll.variants().items()}


# --- sections ---------------------------------------------------------------------------------------

def what(coll: Collection) -> Optional[Section]:
    blocks: list[Block] = []
    if coll.campaign:
        c = coll.campaign
        blocks.append(Para([f"Campaign {c.get('name')} on {c.get('host')}, model {c.get('model')}, "
                            f"started {c.get('started')}, last updated {c.get('updated')}; base variant "
                            f"{c.get('base_variant') or '-'}. Files: ",
                            Link("campaign.json", coll.folder / "campaign.json"), " ",  # type: ignore[operator]
                            Link("campaign.toml", coll.folder / "campaign.toml")]))  # type: ignore[operator]
        declared = c.get("variants") or {}
        if declared:
            blocks.append(Table(["variant (campaign.json)", "knobs", "replicas", "cells"], [
                [v, ", ".join(f"{k}={x}" for k, x in (d.get("knobs") or {}).items()) or "(base)",
                 str(d.get("replicas", 1)),
                 ", ".join(f"{x.get('id')} {x.get('state')}" for x in c.get("cells") or [] if x.get("variant") == v)]
                for v, d in declared.items()]))
    firsts = _first(coll)
    keys = ("host", "CPUs", "GPUs", "GPU driver", "GPU memory", "GPU power limit", "engine", "engine version",
            "build", "servedeck version", "layout", "context")
    # where the engine put the layers (boot.json `placement`; llama.cpp says it only at log verbosity 4):
    # shown, not a knob, since it follows from the launch
    rows = [[v, str(len(runs)), *[r.knobs.get(k, "-") for k in keys],
             str((r.view.get("boot") or {}).get("placement") or "-"), run_link(r)]
            for (v, runs), r in zip(coll.variants().items(), firsts.values())]
    blocks.append(Table(["variant", "runs", *keys, "placement (boot)", "from"], rows))
    # configuration differences between variants: every config knob whose value is not the same everywhere
    cfgs = {v: config_knobs(r.knobs) for v, r in firsts.items()}
    names: list[str] = []
    for cfg in cfgs.values():
        names += [n for n in cfg if n not in names]
    differ = [n for n in names if len({cfg.get(n, "(absent)") for cfg in cfgs.values()}) > 1]
    if len(cfgs) > 1:
        if differ:
            blocks.append(Para(["Configuration differences between variants (rendered flags and env from each "
                                "run's cmd.sh, secrets redacted):"]))
            follows = _follows(coll, firsts)
            head = ["knob", *cfgs] + (["follows from (campaign.json knobs)"] if follows is not None else [])
            blocks.append(Table(head, [[n, *[cfg.get(n, "(absent)") for cfg in cfgs.values()]]
                                       + ([follows.get(n, "-")] if follows is not None else []) for n in differ]))
        else:
            blocks.append(Para(["The variants' rendered launches are identical."]))
    return Section("what", "What was measured, where, with what", blocks)


def _against_base(coll: Collection, firsts: dict[str, Run]) -> dict[str, Attribution]:
    """Each variant's attribution against the base variant (campaign knobs where declared)."""
    base = coll.base_variant if coll.base_variant in firsts else next(iter(firsts), None)
    if base is None:
        return {}
    b0 = firsts[base]
    return {v: attribute(b0, r, changed(config_knobs(b0.knobs), config_knobs(r.knobs)))
            for v, r in firsts.items() if v != base}


def _follows(coll: Collection, firsts: dict[str, Run]) -> Optional[dict[str, str]]:
    """Rendered knob → the variant's campaign knob it follows from (None for loose runs: nothing declared)."""
    if not coll.campaign or any(r.declared is None for r in firsts.values()):
        return None
    out: dict[str, list[str]] = {}
    for v, att in _against_base(coll, firsts).items():
        asked = ", ".join(f"{n} = {y}" for n, _, y in att.asked)
        for n, _, _ in att.consequences:
            out.setdefault(n, []).append(f"{v}: {asked}")
        for n, _, _ in att.unasked:
            out.setdefault(n, []).append(f"{v}: no campaign knob (it changed unasked)")
    return {n: "; ".join(v) for n, v in out.items()}


def caveats(coll: Collection) -> Optional[Section]:
    """Before the figures: which are not results, which launches began on a busy host, and every warning
    the runs recorded about their own points."""
    blocks: list[Block] = []
    bad = {v: why for v, runs in coll.variants().items()
           if (why := not_a_result([r for r in runs if r.kind == "bench"] or runs))}
    if bad:
        blocks.append(Para(["NOT A RESULT: " + "; ".join(f"{v} ({why})" for v, why in bad.items())
                            + ". Every table and plot below that holds their figures says so: a figure from a "
                              "launch whose gate did not pass is a speed, not a result."]))
    busy = busy_hosts(coll)
    loads = _load_rows(coll, busy)
    if loads:
        blocks.append(Para(["Host load when each launch began (summary.json host.load_avg, 1/5/15-minute "
                            f"averages). A launch is flagged busy when its 1-minute load was at least "
                            f"{BUSY_RATIO:g}× the median at the other launches' starts and {BUSY_MARGIN:g} above "
                            "it, or at least the CPUs the run could use."]))
        blocks.append(Table(["launch", "first run", "load 1/5/15 min", "usable CPUs", "busy"], loads))
    for b in busy.values():
        blocks.append(Para([f"HOST BUSY: {b.text}."]))
    warns = point_warnings(coll)
    if warns:
        blocks.append(Para([f"{len(warns)} warnings recorded by the runs (summary.json figures.warnings), "
                            "point by point:"]))
        blocks.append(Table(["variant", "run", "point", "warning"],
                            [[w.variant, Link(w.run.name, w.run.path / "summary.json"), w.point, w.text]
                             for w in warns]))
    if not blocks:
        return None
    return Section("caveats", "Before reading the figures", blocks)


def _load_rows(coll: Collection, busy: dict[str, Busy]) -> list[list]:
    rows, seen = [], set()
    for r in sorted(coll.runs, key=lambda r: str(r.view.get("created_at") or r.name)):
        unit = unit_of(r)
        la = (r.view.get("host") or {}).get("load_avg")
        if unit in seen or not la:
            continue
        seen.add(unit)
        host = r.view.get("host") or {}
        rows.append([unit, run_link(r), " / ".join(str(x) for x in la),
                     str(host.get("cpus_usable") or host.get("cpus") or "-"), "BUSY" if unit in busy else "-"])
    return rows


def gate(coll: Collection) -> Optional[Section]:
    """One row per gate run: a bench run that reused its launch's gate (summary.json gate.source) is
    listed on that gate's row, not as another gate."""
    groups: dict[tuple[str, str], list[Run]] = {}
    for r in coll.runs:
        src = (r.view.get("gate") or {}).get("source")
        key = src if src and src != "this run" else r.name
        groups.setdefault((r.variant, key), []).append(r)
    rows = []
    for (variant, key), members in groups.items():
        r = next((m for m in members if m.name == key), members[0])
        g = r.view.get("gate") or {}
        res = g.get("result") or {}
        covered = [run_link(m, m.workload_key) for m in members if m.kind == "bench"]
        gate_run: Cell = run_link(r) if r.name == key else [f"{key} (not in this report)"]
        rows.append([variant, str(r.repeat), gate_run, g.get("status", "not run"),
                     num(res.get("score"), 2) if "score" in res else "-",
                     f"{res.get('found')}/{res.get('probes')}" if "probes" in res else "-",
                     str(res.get("context", "-")), str(res.get("threshold", "-")),
                     "–".join(str(t) for t in dict.fromkeys(res.get("prompt_tokens") or [])) or "-",
                     file_link(r, "niah.log") if (r.path / "niah.log").exists() else "no gate",
                     covered or "-"])
    if not rows:
        return None
    return Section("gate", "The gate (needle in a haystack)", [
        Para(["A performance point from a launch whose gate failed or never ran is not a result: it is drawn "
              "hollow and kept off the frontier, and every table holding it says so. One row per gate; the "
              "benchmark runs of the same launch reuse it."]),
        Table(["variant", "repeat", "gate run", "gate", "score", "found", "context", "threshold",
               "prompt tokens", "niah.log", "figures it stands for"], rows)])


def accuracy(coll: Collection) -> Optional[Section]:
    """Each variant's accuracy gate against the reference variant's (campaign `reference`, else the base),
    paired sample by sample: McNemar's exact test and the difference's interval (report/accuracy.py)."""
    variants = {v: sorted(runs, key=lambda r: r.repeat) for v, runs in coll.variants().items()}
    gated = [v for v, runs in variants.items() if gate_names(runs)]
    if not gated:
        return None
    ref = next((v for v in ((coll.campaign or {}).get("reference"), coll.base_variant) if v in gated), gated[0])
    rows = []
    for v in gated:
        if v == ref:
            continue
        for x in paired_accuracy(variants[ref], variants[v]):
            rows.append([ref, v, x.gate, f"{x.a_accuracy:.1%}", f"{x.b_accuracy:.1%}", f"{x.pairs:,}",
                         str(x.gained), str(x.lost), f"{x.difference:+.1f} [{x.low:+.1f}, {x.high:+.1f}]",
                         f"{x.p_value:.3g}", x.text])
    blocks: list[Block] = [Para([f"Accuracy gates, each variant against {ref} on the same questions (same id, same "
                                 "prompt digest): 'gained' = A wrong and B right, 'lost' = A right and B wrong; "
                                 "p from McNemar's exact test, the interval (95 %) of B − A in points is Newcombe's "
                                 "paired hybrid score interval; a difference is named only when p < 0.05."])]
    if rows:
        blocks.append(Table(["A (reference)", "B", "gate", "A accuracy", "B accuracy", "pairs", "gained", "lost",
                             "B − A, points [95 %]", "p (McNemar)", "verdict"], rows))
    else:
        blocks.append(Para([f"No other variant ran an accuracy gate on the questions {ref} answered."]))
    return Section("accuracy", "Accuracy against the reference (paired)", blocks)


def pareto_section(coll: Collection) -> Optional[Section]:
    rows = pareto(coll)
    if not rows:
        return None
    per = "GPU" if all(r.per == "GPU" for r in rows) else "host"
    from servedeck.report import plots  # matplotlib (~0.3 s) only when a figure is drawn: the CLI imports this module

    svg = plots.pareto_svg(rows, list(coll.variants()))
    busy = busy_hosts(coll)
    table = []
    for r in rows:
        lp = r.point
        state = "on the frontier" if r.on_frontier else ("dominated" if r.eligible else
                                                         "hollow: " + "; ".join(r.why_not) + " (not a result)")
        table.append([lp.variant, lp.label, num(r.x), num(r.y), str(len(lp.runs)),
                      str(lp.runs[0].gpus_used or "CPU"), state, standing(lp.runs, busy), _runs_cell(lp.runs)])
    sources = sorted({x.path for row in rows for x in row.point.runs})
    return Section("pareto", "Throughput against latency (Pareto)", [
        Figure(svg, f"x = per-user output tok/s (1 / TPOT p50), y = output tok/s per {per}"
                    + (" (CPU runs: the whole host)" if per == "host" else "")
                    + "; both axes start at zero; one curve per variant across its load points; mean across "
                      "repeats; hollow markers are not results.",
               [Link(p.name, p) for p in sources]),
        Table(["variant", "point", "per-user tok/s", f"output tok/s per {per}", "repeats", "GPUs", "frontier",
               "result", "sources"], table)])


def _agreement(p: LoadPoint, key: str) -> Optional[float]:
    """Mean across repeats of the p50 of one of llama.cpp's agreement figures (runs/figures.py), or None
    when the engine reported no timings."""
    vals = [((f.get("agreement") or {}).get(key) or {}).get("p50") for f in p.figures]
    vals = [v for v in vals if isinstance(v, (int, float))]
    return sum(vals) / len(vals) if vals else None


def _engine_gap(p: LoadPoint, key: str = "ttft") -> Optional[float]:
    """Mean across repeats of client − engine mean (ms) of one figure, from the engine's own latency
    histograms (vLLM; runs/figures.py `histogram_agreement`), or None when the engine has none."""
    vals = [(((f.get("engine_agreement") or {}).get("figures") or {}).get(key) or {}).get("mean_minus_engine_ms")
            for f in p.figures]
    vals = [v for v in vals if isinstance(v, (int, float))]
    return sum(vals) / len(vals) if vals else None


def latency(coll: Collection) -> Optional[Section]:
    from servedeck.report import plots

    pts = [p for p in load_points(coll) if p.curve == "load"]
    if not pts:
        return None
    blocks: list[Block] = []
    for loop in ("closed", "open"):
        mine = [p for p in pts if p.loop == loop]
        if not mine:
            continue
        blocks.append(Figure(plots.latency_svg(mine, list(coll.variants()), loop),
                             f"TTFT and TPOT p50 (solid) and p99 (dotted) against "
                             f"{'concurrency' if loop == 'closed' else 'arrival rate'}; mean across repeats; "
                             "axes start at zero; hollow markers are not results.",
                             sorted({Link(r.name, r.path / "requests.jsonl") for p in mine for r in p.runs},
                                    key=lambda x: x.text)))
    busy = busy_hosts(coll)
    engine = any(_agreement(p, "ttft_minus_prompt_ms") is not None for p in pts)
    hist = any(_engine_gap(p) is not None for p in pts)
    rows = []
    for p in pts:
        rows.append([p.variant, p.label, ms(p.spread("ttft_ms").mean), ms(p.spread("ttft_ms", "p99").mean),
                     *([ms(_agreement(p, "ttft_minus_prompt_ms"))] if engine else []),
                     *([ms(_engine_gap(p)), ms(_engine_gap(p, "tpot"))] if hist else []),
                     ms(p.spread("tpot_ms").mean), ms(p.spread("tpot_ms", "p99").mean),
                     ms(p.spread("e2e_ms").mean), num(p.spread("output_tok_s", "").mean),
                     "+".join(str(int(f["counts"]["ok"])) for f in p.figures if f.get("counts")),
                     standing(p.runs, busy), _runs_cell(p.runs)])
    if engine:
        blocks.append(Para(["TTFT − engine prompt_ms: the client's TTFT minus the prefill time the engine itself "
                            "reported for the same request (llama.cpp `timings`), median: what the client waited "
                            "beyond prefill (HTTP, queueing, the engine's own pauses before it starts)."]))
    if hist:
        blocks.append(Para(["TTFT/TPOT − engine, mean: the client's mean minus the engine's own (its /metrics "
                            "histograms over the same measured phase: vLLM times a request from when its engine "
                            "client received it, after the API server rendered and tokenized the prompt), so what "
                            "lies between: HTTP, the server's front end, the client."]))
    blocks.append(Table(["variant", "point", "TTFT p50", "TTFT p99",
                         *(["TTFT − engine prompt_ms p50"] if engine else []),
                         *(["TTFT − engine mean", "TPOT − engine mean"] if hist else []),
                         "TPOT p50", "TPOT p99", "E2E p50",
                         "output tok/s", "requests ok", "result", "sources"], rows))
    return Section("latency", "TTFT and TPOT against load", blocks)


def long_prompt(coll: Collection) -> Optional[Section]:
    """The runs whose kind puts its points against prompt length (workloads/kinds.py `curve`)."""
    from servedeck.report import plots

    runs = coll.bench_runs("length")
    if not runs:
        return None
    busy = busy_hosts(coll)
    series: dict[str, list] = {}
    rows = []
    for r in runs:
        for p in r.view.get("points") or []:
            f = p.get("figures") or {}
            ag = f.get("agreement") or {}
            tokens = (r.view.get("workload") or {}).get("prompt_tokens")
            pre = (f.get("prefill_tok_s") or {}).get("p50")
            eng = (ag.get("prefill_tok_s_engine") or {}).get("p50")
            gap = (ag.get("ttft_minus_prompt_ms") or {}).get("p50")
            ttft = (f.get("ttft_ms") or {}).get("p50")
            series.setdefault(r.variant, []).append((float(tokens or 0), pre, ttft, eng))
            rows.append([r.variant, str(tokens), p.get("label"), num(pre), num(eng),
                         f"{pre / eng:.0%}" if pre and eng else "-", ms(gap), ms(ttft),
                         str((f.get("prefill_tok_s") or {}).get("n", 0)), standing([r], busy), run_link(r)])
    bad = sorted({v for r in runs if not_a_result([r]) for v in [r.variant]})
    return Section("long-prompt", "Long prompts: prefill and TTFT against length", [
        Figure(plots.long_prompt_svg(series, list(coll.variants()), set(bad)),
               "Client prefill tok/s = prompt tokens / TTFT (prompts not served from the prefix cache), solid; "
               "the engine's own prefill rate (prompt tokens it processed / its prompt_ms), dashed, where the "
               "engine reports one. The gap between them is time in TTFT that is not prefill. Axes start at zero.",
               [Link(r.name, r.path) for r in runs]),
        Table(["variant", "prompt tokens", "point", "prefill tok/s p50 (client: tokens / TTFT)",
               "engine prefill tok/s p50 (its prompt_ms)", "client / engine", "TTFT − engine prompt_ms p50",
               "TTFT p50", "n", "result", "run"], rows)])


HEADLINES = (("TTFT p50", "ttft_ms", "p50", ms), ("TPOT p50", "tpot_ms", "p50", ms),
             ("output tok/s", "output_tok_s", "", num))


def repeats(coll: Collection) -> Optional[Section]:
    pts = [p for p in load_points(coll) if len(p.runs) > 1]
    if not pts:
        return None
    busy = busy_hosts(coll)
    rows = []
    for p in pts:
        for name, key, stat, fmt in HEADLINES:
            s = p.spread(key, stat)
            rows.append([p.variant, p.label, name, str(s.n), _ci(s, fmt),
                         ", ".join(fmt(v) for v in s.values),
                         f"DRIFT: {s.drift} across every repeat" if s.drift else "-", standing(p.runs, busy),
                         _runs_cell(p.runs)])
    return Section("repeats", "Repeats: mean with 95 % interval", [
        Para(["Each headline figure as the mean across repeats (fresh launches) with a 95 % t interval. Drift: a "
              "figure that only rises or only falls across three or more repeats (by chance alone that happens "
              "with probability 2/n!), so check before averaging."]),
        Table(["variant", "point", "figure", "repeats", "mean [95 %]", "each repeat", "drift", "result",
               "sources"], rows)])


def attribution(coll: Collection) -> Optional[Section]:
    variants = coll.variants()
    base = coll.base_variant if coll.base_variant in variants else next(iter(variants), None)
    if base is None or len(variants) < 2:
        return None
    base_runs = [r for r in variants[base] if r.kind == "bench"]
    rows: list[list] = []
    notes: list[Block] = []
    busy = busy_hosts(coll)
    for v, runs in variants.items():
        bench = [r for r in runs if r.kind == "bench"]
        if v == base or not bench or not base_runs:
            continue
        att = attribute(base_runs[0], bench[0], changed(config_knobs(base_runs[0].knobs), config_knobs(bench[0].knobs)))
        renders = f" (renders as {att.consequences_of()})" if att.consequences else ""
        if len(att.knobs) != 1:
            notes.append(Para([f"{v}: {len(att.knobs)} knobs differ from {base} "
                               f"({', '.join(d[0] for d in att.knobs) or 'none'}){renders}: its effect cannot be "
                               "attributed to any one of them."]))
            continue
        knob, was, now = att.knobs[0]
        if att.declared:
            notes.append(Para([f"{v}: the campaign changed one knob, {knob}: {was} → {now}{renders}."]))
        why = not_a_result(bench + base_runs)
        for key in dict.fromkeys(r.workload_key for r in base_runs):
            a = [r for r in base_runs if r.workload_key == key]
            b = [r for r in bench if r.workload_key == key]
            if not b:
                continue
            hot = standing(a + b, busy).partition("; ")[2] or "-"
            label = v + (f" ({why}: not a result)" if why else "")
            for pc in compare(a, b).points:
                for verdict in pc.verdicts:
                    rows.append([f"{knob}: {was} → {now}", label, f"{a[0].workload} {pc.label}", verdict.figure,
                                 verdict.text, hot, _runs_cell(a) + ["vs"] + _runs_cell(b)])
    if not rows and not notes:
        return None
    blocks: list[Block] = [Para([f"Each variant against the base variant {base}. "
                                 + ("Knobs are the campaign's own (campaign.json): rendered flags that follow from "
                                    "a knob are its consequences, not more knobs. " if coll.campaign else "")
                                 + "Where exactly one knob differs, its effect on each headline figure, with the "
                                   "interval; latency intervals are paired request by request when both sent the "
                                   "same prompts."])]
    blocks += notes
    if rows:
        blocks.append(Table(["knob", "variant", "point", "figure", "effect", "host", "sources (base vs variant)"],
                            rows))
    return Section("attribution", "One knob at a time: attribution", blocks)


def failures(coll: Collection) -> Optional[Section]:
    if not coll.failures:
        return None
    blocks: list[Block] = [Table(["what", "state", "reason", "classified cause"],
                                 [[f.what, f.state, f.reason, f.cause] for f in coll.failures])]
    for f in coll.failures:
        if f.excerpt:
            blocks.append(Pre(f.excerpt, Link(f"{f.what}: {f.source.name}", f.source) if f.source else None))
    return Section("failures", "Failures", blocks)


def sources(coll: Collection) -> Optional[Section]:
    rows = [[run_link(r), r.variant, str(r.repeat), r.cell or "-", r.kind or "-", r.workload or "-",
             str(r.view.get("status")), r.view.get("label", "-"),
             [file_link(r, n) for n in FILES if (r.path / n).exists()]] for r in coll.runs]
    return Section("sources", "Sources", [
        Para(["Every figure above is recomputed from these folders (requests.jsonl, niah.log, summary.json) "
              "by servedeck's own code; none is typed by hand."]),
        Table(["run folder", "variant", "repeat", "cell", "kind", "workload", "status", "result", "files"], rows)])


# A section function: Collection → Section or None (absent data, absent section).
SECTIONS: list[Callable[[Collection], Optional[Section]]] = [
    what, caveats, gate, accuracy, pareto_section, capacity_section, energy_section, latency, timeline_section, long_prompt, repeats,
    attribution, failures, sources]


def build(coll: Collection) -> list[Section]:
    return [s for s in (f(coll) for f in SECTIONS) if s is not None]


__all__ = ["SECTIONS", "build"]
