"""A run's view (runs.read.load) rendered for people: summary.md, `show`, and the `runs` list.

Pure functions from the view dict to text. A result from a server whose gate failed, was never
run, or did not finish says so in its first line and in every row that shows its numbers.
"""

from __future__ import annotations

from typing import Any

from servedeck.gates.samples import describe as describe_gates
from servedeck.mdtable import table as _table
from servedeck.report.knobs import gpu_facts
from servedeck.report.text import ms, num, pct, quantile_text
from servedeck.report.workloads import outputs_section, speculation_section
from servedeck.workloads.kinds import kind_of

NOT_A_RESULT = {
    "failed": "NOT A RESULT: the server failed its correctness gate",
    "not run": "NOT A RESULT: no correctness gate was run on this server",
    "incomplete": "NOT A RESULT: the correctness gate did not finish",
    "pending": "NOT A RESULT: the correctness gate did not finish",
    "running": "NOT A RESULT: the correctness gate did not finish",
}


def gate_cell(view: dict[str, Any]) -> str:
    g = view.get("gate") or {}
    status = g.get("status", "not run")
    r = g.get("result") or {}
    cited = _cited(g)
    if g.get("accuracy"):  # accuracy gates beside (or instead of) the needle
        return f"{status} ({describe_gates(g)}){cited}"
    if status in ("passed", "failed") and "score" in r:
        return f"{status} {round(r['score'], 2)} ({r.get('found')}/{r.get('probes')}){cited}"
    return "no gate" if status == "not run" else status


def _cited(g: dict[str, Any]) -> str:
    """", cited from RUN" where a gate was inherited from an earlier run on the same launch (a --no-gate run stands
    on its launch's gate: its listing must not read as if it ran one)."""
    needle = g.get("source") if g.get("needle", g.get("status")) != "not run" else None
    runs = {s for s in [needle, *((a.get("source") for a in (g.get("accuracy") or {}).values()))]
            if s and s != "this run"}
    return f", cited from {', '.join(sorted(runs))}" if runs else ""


def banner(view: dict[str, Any]) -> str:
    """The first line a person reads: failed run, not a result, or a result."""
    lines = []
    if view.get("status") == "failed":
        lines.append(f"**RUN FAILED**: {view.get('reason') or 'no reason recorded'}")
    elif view.get("status") == "running":
        lines.append("**RUN IN PROGRESS** (figures so far)")
    gate = (view.get("gate") or {}).get("status", "not run")
    r = (view.get("gate") or {}).get("result") or {}
    if (view.get("gate") or {}).get("accuracy"):
        text = describe_gates(view["gate"])
        head = f"GATE {gate.upper()}" if view.get("kind") == "gate" else \
            "Result" if gate == "passed" else NOT_A_RESULT.get(gate, "NOT A RESULT")
        lines.append(f"**{head}**: {text}")
    elif view.get("kind") == "gate":
        if gate in ("passed", "failed"):
            lines.append(f"**GATE {gate.upper()}**: niah score {round(r['score'], 2)} "
                         f"({r['found']}/{r['probes']} found), threshold {r['threshold']}")
        else:
            lines.append(f"**GATE {gate.upper()}**")
    elif gate != "passed":
        extra = f" (score {round(r['score'], 2)} < {r['threshold']})" if gate == "failed" and r else ""
        lines.append(f"**{NOT_A_RESULT.get(gate, 'NOT A RESULT')}**{extra}")
    else:
        lines.append(f"**Result**: gate passed (niah score {round(r['score'], 2)}, {r['found']}/{r['probes']}"
                     f"{_cited(view.get('gate') or {})})")
    lines += [f"**WARNING**: {w}" for w in view.get("warnings") or []]
    return "\n\n".join(lines)


def _gate_section(view: dict[str, Any]) -> list[str]:
    g = view.get("gate") or {}
    out = _accuracy_section(g)
    if g.get("accuracy") and g.get("needle") == "not run":
        return out  # an accuracy gate alone: no needle section to show
    out += ["## Gate: needle in a haystack", ""]
    if g.get("needle", g.get("status")) == "not run":
        out.append(f"Not run. {g.get('note') or ''}".strip())
        return out
    r = g.get("result") or {}
    src = g.get("source")
    out.append(f"{g['status']}: score {round(r.get('score', 0), 2)} = {r.get('found')}/{r.get('probes')} probes "
               f"found the code (threshold {r.get('threshold')}; {r.get('errors', 0)} probe requests failed). "
               f"Context {r.get('context', '-')}, prompts of {'–'.join(str(t) for t in r.get('prompt_tokens') or [])} "
               f"tokens by the server's count, depths {r.get('depths', '-')}."
               + (f" Source: {src}." if src and src != "this run" else ""))
    probes = g.get("probes") or []
    if probes:
        out += ["", _table(["key", "depth", "prompt tokens", "found", "latency", "cached", "answer"], [
            [str(p.get("key")), str(p.get("depth")), str(p.get("prompt_tokens")), "yes" if p.get("ok") else "NO",
             f"{p['latency_s']:.1f} s" if isinstance(p.get("latency_s"), (int, float)) else "-",
             str(p.get("cached_tokens")), str(p.get("answer", ""))[:60].replace("\n", " ")] for p in probes])]
    return out


def _accuracy_section(g: dict[str, Any]) -> list[str]:
    """Each accuracy gate: its verdict, where its questions came from, and its sample file."""
    out: list[str] = []
    for name, a in (g.get("accuracy") or {}).items():
        r, spec = a.get("result") or {}, a.get("spec") or {}
        out += [f"## Gate: {name} ({a.get('kind')})", ""]
        what = spec.get("path") or spec.get("task") or "-"
        if "score" not in r:
            out += [f"{a.get('status')}: {a.get('note') or 'no scored questions'} ({what}).", ""]
            continue
        out += [f"{a.get('status')}: score {r['score']:.3f} = {r['correct']}/{r['samples']} correct "
                f"(threshold {r['threshold']}; {r['errors']} questions whose request failed, counted as not correct). "
                f"Questions: {what}" + (f", the first {spec['limit']}" if spec.get("limit") else "")
                + f"; record {a.get('file')}" + (f" in {a['source']}" if a.get("source") not in (None, "this run") else "")
                + (f"; {a['wall_s']} s" if a.get("wall_s") is not None else "") + ".", ""]
    return out


def _workload(view: dict[str, Any]) -> list[str]:
    """The run's workload in a line, as its kind says it (workloads/kinds.py)."""
    w = view.get("workload") or {}
    if view.get("kind") == "gate":
        return []
    kind = kind_of(view)
    if kind is not None and kind.describe is not None:
        return ["## Workload", "", kind.describe(w)]
    return ["## Workload", "", f"workload **{w.get('workload')}**; points {', '.join(w.get('points') or [])}."]


def _figures(view: dict[str, Any]) -> list[str]:
    pts = view.get("points") or []
    if not pts:
        return []
    mark = "" if (view.get("gate") or {}).get("status") == "passed" else f" ({gate_cell(view)}: not a result)"
    kind = kind_of(view)
    if kind is not None and kind.figures is not None:  # figures of its own in place of the load-point tables
        return kind.figures(view, mark)
    lat, thr = [], []
    for p in pts:
        f = p["figures"]
        c = f["counts"]
        good = f.get("goodput") or {}
        name = p["label"] + ("" if p.get("status") == "ok" else f" ({p.get('status')})")
        lat.append([name, f"{c['ok']}/{c['measured']}",
                    f"{ms(f['ttft_ms']['p50'])} / {ms(f['ttft_ms']['p90'])} / {ms(f['ttft_ms']['p99'])}",
                    f"{ms(f['tpot_ms']['p50'])} / {ms(f['tpot_ms']['p99'])}", ms(f["itl_ms"]["p50"]),
                    ms(f["e2e_ms"]["p50"])])
        thr.append([name, num(f.get("output_tok_s")), num((f.get("per_user_tok_s") or {}).get("p50")),
                    num(f.get("request_s"), 2), num(f["prefill_tok_s"]["p50"]), pct(f.get("cached_fraction")),
                    pct(good.get("fraction")) if good else "-"])
    out = [f"## Figures{mark}", "",
           _table(["point", "ok/measured", "TTFT p50/p90/p99", "TPOT p50/p99", "ITL p50", "E2E p50"], lat), "",
           _table(["point", "out tok/s", "per-user tok/s p50", "req/s", "prefill tok/s p50", "cached", "goodput"],
                  thr), "",
           "TTFT: send → first non-empty content token. TPOT = (E2E − TTFT)/(output tokens − 1). ITL: chunk gaps "
           "shared among the chunk's tokens. Rates over the measured window. Prefill: prompt tokens / TTFT, "
           "only for prompts ≥ 1024 tokens not served from the prefix cache. Cached: share of prompt tokens "
           "the prefix cache served (engine counters when available)."]
    for p in pts:
        f = p["figures"]
        notes = list(f.get("warnings") or [])
        cl = f.get("client") or {}
        lag = (cl.get("lag_ms") or {})
        nproc = cl.get("processes") or 1
        cpu_of = "of one core" if nproc == 1 else f"of one core (the busiest of {nproc} client processes)"
        notes.append(f"client self-check: schedule lag p50 {ms(lag.get('p50'))}, p99 {ms(lag.get('p99'))}; client "
                     f"CPU {pct(cl.get('cpu_fraction'))} {cpu_of}"
                     + (f"; event loop {cl['loop']}" if cl.get("loop") else "")
                     + ("; **client-bound**" if cl.get("client_bound") else ""))
        ctr = (f.get("cache") or {}).get("counters") or {}
        if ctr.get("available"):
            notes.append(f"engine prefix-cache counters over the measured phase: {num(ctr.get('hit_tokens'), 0)} of "
                         f"{num(ctr.get('queried_tokens'), 0)} prompt tokens from cache ({pct(ctr.get('fraction'))})")
        ag = f.get("agreement")
        if ag:
            notes.append(f"vs llama.cpp's own timings ({ag['requests']} requests, medians): TTFT − prompt_ms "
                         f"{ms(ag['ttft_minus_prompt_ms']['p50'])}; TPOT − engine per-token "
                         f"{ms(ag['tpot_minus_engine_ms']['p50'])} (ratio {num(ag['tpot_ratio']['p50'], 3)}); "
                         f"prefill tok/s servedeck/engine {num(ag['prefill_ratio']['p50'], 3)}")
        ea = f.get("engine_agreement")
        if ea:
            notes.append(engine_agreement_line(ea))
        out += ["", f"**{p['label']}**:", ""] + [f"- {n}" for n in notes]
    return out


def _bucket(b: Any) -> Any:
    return (b[0], b[1]) if b else None


def engine_agreement_line(ea: dict[str, Any]) -> str:
    """One line: the client's TTFT, TPOT and E2E means beside the engine's own histograms' (runs/figures.py)."""
    parts = []
    for key, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E"), ("queue", "engine queue")):
        row = (ea.get("figures") or {}).get(key)
        if not row:
            continue
        e = row["engine"]
        bucket = e.get("p50_bucket_ms")  # the histogram's resolution: a quantile is said as its bucket
        p50 = quantile_text(e.get("p50_ms"), _bucket(bucket))
        if row.get("client"):
            c = row["client"]
            parts.append(f"{label} mean {ms(c['mean_ms'])} client / {ms(e['mean_ms'])} engine (exact: sum / count); "
                         f"p50 {quantile_text(c['p50_ms_binned'], _bucket(c.get('p50_bucket_ms_binned')))} / {p50} "
                         "in the engine's buckets")
        else:
            parts.append(f"{label} mean {ms(e['mean_ms'])} (engine; exact: sum / count), p50 {p50} (its bucket)")
    n = ((ea.get("figures") or {}).get("ttft") or {}).get("engine", {}).get("requests")
    same = "" if ea.get("same_requests") is not False else \
        f"; **the engine counted {n} first tokens, the client {ea.get('client_first_tokens')}: not the same requests**"
    return "vs the engine's own histograms (/metrics, over the measured phase): " + "; ".join(parts) + same


def _where(view: dict[str, Any]) -> list[str]:
    v = view.get("versions") or {}
    h = view.get("host") or {}
    g = view.get("gpus") or {}
    facts = gpu_facts(g)
    gpus = (", ".join(f"{x.get('index')}: {x.get('name')}" for x in g.get("gpus", []))
            + "".join(f"; {k.removeprefix('GPU ')} {v}" for k, v in facts.items())
            if g.get("available") else f"none ({g.get('reason', 'not read')})")
    launch = view.get("launch") or {}
    out = ["## Where and with what", "",
           f"- servedeck {v.get('servedeck')}, Python {v.get('python')}, {v.get('engine')} {v.get('engine_version')}",
           f"- host {h.get('hostname')}: {h.get('cpu_model')}, {h.get('cpus')} CPUs, {h.get('mem_gib')} GiB; "
           f"load average at start {h.get('load_avg')}",
           f"- GPUs: {gpus}",
           f"- launch {launch.get('launch_dir')} (started {launch.get('started_at')}"
           + ("; started and stopped by this run)" if launch.get("launched_by_run") else ")"),
           "- files: cmd.sh, server.log, boot.json, niah.log, requests.jsonl, summary.json"]
    boot = view.get("boot") or {}
    if boot:
        out.append("- boot: " + ", ".join(f"{k}={boot[k]}" for k in sorted(boot) if not isinstance(boot[k], dict)))
    return out


def markdown(view: dict[str, Any]) -> str:
    head = [f"# {view['run']}", "", banner(view), "",
            _table(["model", "engine", "layout", "context", "kind", "status", "created", "finished"], [[
                str(view.get("model")), str(view.get("engine")), str(view.get("layout")), str(view.get("context")),
                str(view.get("kind")), str(view.get("status")), str(view.get("created_at")),
                str(view.get("finished_at"))]]), ""]
    kind = kind_of(view)
    head_sections = kind.head_sections if kind is not None and kind.head_sections else (lambda v: [])
    tail_sections = kind.tail_sections if kind is not None and kind.tail_sections else (lambda v: [])
    body = (_gate_section(view) + [""] + _workload(view) + [""] + head_sections(view) + [""] + outputs_section(view)
            + [""] + _figures(view)
            + [""] + speculation_section(view) + [""] + tail_sections(view)
            + [""] + _where(view))
    return "\n".join(head + body).replace("\n\n\n", "\n\n") + "\n"


def headline_cell(view: dict[str, Any]) -> str:
    """One line of figures for the `runs` list: as the run's kind says it, else per point."""
    kind = kind_of(view)
    if kind is not None and kind.headline is not None:
        return kind.headline(view)
    parts = []
    for p in view.get("points") or []:
        h = p.get("headline") or {}
        parts.append(f"{p['label']}: TTFT {ms(h.get('ttft_p50_ms'))}, TPOT {ms(h.get('tpot_p50_ms'))}, "
                     f"{num(h.get('output_tok_s'))} tok/s")
        if h.get("cached_fraction"):
            parts[-1] += f", cached {pct(h['cached_fraction'])}"
    return "; ".join(parts) or "-"


def list_row(view: dict[str, Any]) -> dict[str, Any]:
    """What `runs --json` gives per run (and the table shows)."""
    return {"run": view["run"], "kind": view.get("kind"), "model": view.get("model"), "engine": view.get("engine"),
            "layout": view.get("layout"), "context": view.get("context"),
            "workload": (view.get("workload") or {}).get("workload"), "status": view.get("status"),
            "reason": view.get("reason"), "gate": gate_cell(view), "label": view.get("label"),
            "headline": headline_cell(view), "path": view.get("path")}
