"""Each section of the page document as blocks, in seed 004's order. Pure: the document in, blocks out;
every number shown is one the document holds, and every figure's row links the folder it came from.
A model with no history gets the short page: what it is, its launch, its build, what to run first."""

from __future__ import annotations

from typing import Any, Callable, Optional

from servedeck.page.blocks import Cell, Mark, Para, Pre, Section, Table
from servedeck.page.stale import why_text
from servedeck.page.tried import one_line

MakeLink = Callable[[str, str], Cell]
TITLES = {"what": "What it is", "now": "Now", "launch": "Launch configuration", "memory": "Memory",
          "measured": "Measured", "crashes": "Crashes", "uptime": "Evidence of staying up", "build": "Build",
          "tried": "Tried and refuted", "next": "Before the next launch", "first": "What to run first"}


def day(ts: Optional[str]) -> str:
    """2026-12-02T14:03:07+00:00 → 2026-12-02 14:03:07 (the offset is the state dir's, kept in --json)."""
    return ts[:19].replace("T", " ") if ts else "-"


def num(x: Optional[float], digits: int = 1) -> str:
    if x is None:
        return "-"
    return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.{digits}f}"


def ms(x: Optional[float]) -> str:
    return "-" if x is None else f"{x / 1000:.2f} s" if x >= 10_000 else f"{x:.1f} ms"


def gib(b: Optional[float]) -> str:
    return "-" if b is None else f"{b / 2**30:.2f} GiB"


def span(s: Optional[float]) -> str:
    if s is None:
        return "-"
    s = float(s)
    if s < 120:
        return f"{s:.0f} s"
    h, rest = divmod(int(s), 3600)
    return f"{h} h {rest // 60} min" if h else f"{int(s) // 60} min {int(s) % 60} s"


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "es" if word.endswith("h") else "s")


def verifiable(kind: str, requires: Any) -> bool:
    """Whether `servedeck verify-build` can say anything of a build: a venv has package records, an image its
    id; a binary has neither, so only its `requires` paths (if any) are checked."""
    return kind != "binary" or bool(requires)


def not_ok(rows: list[dict[str, Any]], total: int) -> str:
    """`4 of 9 rows are SKIP`, or `3 of 9 rows are not OK (2 WARN, 1 SKIP)`: what the rows are, not a blanket."""
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["status"]] = counts.get(r["status"], 0) + 1
    of = f"{len(rows)} of {plural(total, 'row')} {'is' if len(rows) == 1 else 'are'}"
    if len(counts) == 1:
        return f"{of} {next(iter(counts))}"
    return f"{of} not OK (" + ", ".join(f"{n} {k}" for k, n in counts.items()) + ")"


def holds_sentence(m: Optional[dict[str, Any]], holds: str) -> Cell:
    """stale_cell as the end of a sentence (a bare `holds` there dangles): `its figures still hold against
    today's entry`, or the stale mark."""
    if not m:
        return f"whether {holds} is not known"
    if m.get("stale"):
        return stale_cell(m)
    unknown = m.get("unknown") or []
    return f"{holds} against today's entry" + (f" (not recorded: {', '.join(unknown)})" if unknown else "")


def stale_cell(m: Optional[dict[str, Any]]) -> Cell:
    if not m:
        return "-"
    if m.get("stale"):
        return Mark("STALE: " + why_text(m).removeprefix("stale: "))
    unknown = m.get("unknown") or []
    return "holds" + (f" (not recorded: {', '.join(unknown)})" if unknown else "")


# --- sections -----------------------------------------------------------------------------------------

def what(doc: dict[str, Any], link: MakeLink) -> list:
    w = doc["sections"]["what"]
    b, ev, ctx, h = w["build"], w["engine_version"], w["context"], w["history"]
    boot = ", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in ctx["last_boot"].items())
    rows: list[list[Cell]] = [
        ["source", w["source"]],
        ["weights on disk", [Mark(w["weights"]["status"], "ok" if w["weights"]["status"] == "OK" else "warn"),
                             w["weights"]["saw"] or ""]],
        ["aliases", ", ".join(w["aliases"]) or "-"], ["served as", w["served_name"]],
        ["port / slot", f"{w['port']} / {w['slot']}"], ["layout", w["layout"] + (f", GPUs {w['gpus']}" if w["gpus"] else "")
                                                         + (f", CPUs {w['cpus']}" if w["cpus"] else "")],
        ["build", f"{b['name']} ({b['kind']}, {b['engine']}): {b['path']}" + ("" if b["exists"] else " — does not exist")],
        ["engine version", f"{ev['value']} ({ev['source']})" if ev["value"] else
         Mark("unknown: " + ("; ".join(ev["problems"]) or "the build states none"), "warn")],
        ["context", (f"{ctx['configured']:,} tokens configured" if ctx["configured"] else "the engine's default")
         + (f"; last boot: {boot}" if boot else "")],
    ]
    if w["vision"]:
        rows.append(["vision", "on (models.toml vision = true); servedeck sends no image: untested by its runs"])
    if w["request"]:
        rows.append(["every request servedeck sends adds", str(w["request"])])
    rows.append(["stop / start limits", f"SIGTERM grace {w['stop_timeout_s']:g} s, then SIGKILL; a start may take "
                                        f"{w['ready_timeout_s']:g} s; the watch loop relaunches "
                                        f"{plural(w['relaunch']['tries'], 'time')}, {w['relaunch']['spacing_s']:g} s apart"])
    if w["max_output_tokens"]:
        rows.append(["max output tokens", f"{w['max_output_tokens']:,}"])
    rows.append(["history", (f"{plural(h['launches'], 'launch')} under servedeck ({h['ready_launches']} became "
                             f"ready), first {day(h['first_launch'])}, last {day(h['last_launch'])}" if h["launches"]
                             else "never launched under servedeck")
                 + f"; {plural(h['runs'], 'run folder')}, {plural(h['campaigns'], 'campaign')}"])
    out: list = [Table(["", ""], rows)]
    if w["notes"]:
        out.append(Para([f"Notes (models.toml): {w['notes']}"]))
    return out


def now(doc: dict[str, Any], link: MakeLink) -> list:
    n = doc["sections"]["now"]
    if n["running"]:
        parts: list[Cell] = [Mark(n["state"], "ok" if n["state"] == "ready" else "warn"),
                             f" since {day(n['since'])}" + (f" (up {span(n['uptime_s'])})" if n["uptime_s"] else "")
                             + f", pid {n['pid']}, port {n['port']}"]
        if n["launch"]:
            parts += [", launch ", link("folder", n["launch"])]
        if n["detail"]:
            parts.append(f"; {n['detail']}")
        return [Para(parts)]
    state = "no launch of it is live" if n["state"] == "not running" else n["state"]
    parts = [f"Not running ({state}" + (", wanted by desired state" if n["desired"] else "") + ")."]
    if n["detail"]:
        parts.append(f" {n['detail']}.")
    fit = n.get("fit") or {}
    if fit:
        parts.append(f" Fit check: {fit['message']}" + (f" (held by {', '.join(fit['holders'])})" if fit["holders"] else "")
                     + (f"; {fit['hint']}" if fit.get("hint") else ""))
    if n.get("error"):
        parts.append(f" {n['error']}")
    return [Para(parts)]


def launch(doc: dict[str, Any], link: MakeLink) -> list:
    la = doc["sections"]["launch"]
    if la["error"]:
        return [Para([Mark("cannot render", "warn"), f" {la['error']}"])]
    last = la["today_last_launched"]
    out: list = [Para([f"Rendered from [models.{doc['model']}] of {doc['config_path']} at {day(la['rendered_at'])}; "
                       + (f"launched in exactly this form {plural(la['today_launches'], 'time')}, last {day(last)} ("
                          if last else "never launched in exactly this form."),
                       *([link("launch", la["today_last_launch"]), ")."] if last else [])])]
    env_lines = [f"{k}={v}" for k, v in la["env"].items()]
    out.append(Pre("\n".join(env_lines + [la["cmd"]])))
    out.append(Table(["flag", "value", "why (models.toml why)"],
                     [[f["flag"], f["value"], f["why"] or ""] for f in la["flags"]]))
    if la["env_rows"]:
        out.append(Table(["environment", "value", "why"], [[e["name"], e["value"], e["why"] or ""] for e in la["env_rows"]]))
    other = [w for w in la["why"] if w["present"] and not (w["where"] or "").startswith(("-", "env "))]
    if other:
        out.append(Para(["Set on purpose: " + "; ".join(f"{w['where']}: {w['reason']}" for w in other)]))
    if la["absent"]:
        out.append(Para([Mark("Deliberately absent", "warn"), ": "
                         + "; ".join(f"{w['key']} — {w['reason']}" for w in la["absent"])]))
    if la["forms"]:
        out.append(Table(["last launched", "launches", "first", "builds", "this form against today's", "launch"],
                         [[day(f["last"]), str(f["launches"]), day(f["first"]), ", ".join(f["builds"]),
                           "today's form" if f["today"] else "; ".join(f["differs_from_today"] or []) or "-",
                           link("folder", f["last_launch"])] for f in la["forms"]]))
    if la["notes"]:
        out.append(Para([f"Notes: {la['notes']}"]))
    return out


def memory(doc: dict[str, Any], link: MakeLink) -> list:
    m = doc["sections"]["memory"]
    p = m["predicted"] or {}
    got = (m["measured"] or {})
    f = got.get("figures") or {}
    then = got.get("predicted_then") or {}
    rows = [
        ["context", num(p.get("context"), 0), num(f.get("ctx_total") or f.get("context_len"), 0)],
        ["KV dtype", f"{p.get('kv_dtype', '-')} ({p.get('kv_dtype_why', '')})" if p else "-", str(f.get("kv_cache_dtype") or "-")],
        ["weights", gib(p.get("weights_bytes")) + (f" ({p.get('weights_basis')})" if p.get("weights_basis") else ""),
         f"{f['model_loading_gib']} GiB loaded" if f.get("model_loading_gib") is not None else
         f"{f['weights_gib']} GiB" if f.get("weights_gib") is not None else "-"],
        ["KV bytes per token", num(p.get("kv_bytes_per_token"), 0), "-"],
        ["one full-length request's KV", gib(p.get("request_bytes_per_gpu")), "-"],
        ["KV pool", gib(p.get("pool_bytes_per_gpu")), f"{f['kv_gib']} GiB" if f.get("kv_gib") is not None else "-"],
        ["KV pool tokens", num(p.get("kv_pool_tokens"), 0),
         num(f.get("kv_tokens"), 0) + (f" (predicted then {num(then.get('kv_pool_tokens'), 0)}, "
                                       f"{got['kv_tokens_error_pct']:+.2f} %)" if got.get("kv_tokens_error_pct") is not None else "")],
        ["full-length requests that fit", num(p.get("full_length_requests")), num(f.get("max_concurrency"))],
        ["graphs", gib(p.get("cuda_graph_bytes")), f"{f['graph_capture_gib']} GiB" if f.get("graph_capture_gib") is not None else "-"],
        ["a start needs per GPU", gib(p.get("need_bytes_per_gpu")) + (f" ({p.get('need_basis')})" if p.get("need_basis") else ""),
         gib(got.get("floor_bytes_per_gpu")) + " floor" if got.get("floor_bytes_per_gpu") else "-"],
        ["share of the GPU", f"{m['share_of_gpu']:.0%} ({m['share_basis']})" if m["share_of_gpu"] is not None
         else "- (no GPU here: sized for none)", "-"],
    ]
    head = ["", "planner, today's entry", "last boot" + (f" ({day(got.get('at'))}, build {got.get('build')}, "
                                                        f"engine {got.get('engine_version') or 'not recorded'})" if got else "")]
    out: list = [Table(head, rows)]
    if got:
        out.append(Para(["Last boot: ", link("launch", got["launch"]) if got.get("launch") else "-", "; ",
                         holds_sentence(got.get("stale"), "its figures still hold")]))
    else:
        out.append(Para(["No boot of this model measured yet: the planner's figures stand alone."]))
    if m["error"]:
        out.append(Para([Mark("planner", "warn"), f" {m['error']}"]))
    for note in p.get("notes") or []:
        out.append(Para([f"Planner note: {note}"]))
    return out


def _fig_row(e: dict[str, Any], link: MakeLink, point: Optional[dict[str, Any]], what: str) -> list[Cell]:
    pv = e["provenance"]
    p = point or {}
    return [day(e["at"]), link(e["run"], e["path"]), e["kind"], e["gate"]["text"], what,
            num(p.get("output_tok_s")), num(p.get("per_user_tok_s_p50")), ms(p.get("ttft_p50_ms")),
            ms(p.get("tpot_p50_ms")), num(p.get("j_per_output_token"), 2) if p.get("j_per_output_token") else "-",
            pv["build"] or "-", pv["command"], stale_cell(e["stale"])]


MEASURED_HEAD = ["date", "run", "kind", "gate", "point", "output tok/s", "per-user tok/s p50", "TTFT p50",
                 "TPOT p50", "J/token", "build", "command (rebuilt from summary.json)", "still holds?"]


def measured(doc: dict[str, Any], link: MakeLink) -> list:
    m = doc["sections"]["measured"]
    if not m["runs"]:
        return [Para(["No gate or benchmark run of this model yet: `servedeck gate` and `servedeck bench` make them."])]
    out: list = [Para([f"{plural(m['runs'], 'run')}, newest first, grouped by engine version; {m['stale_runs']} measured "
                       "on something other than today's launch (marked)."])]
    for g in m["by_engine_version"]:
        rows = []
        for e in g["runs"]:
            if e["kind"] == "gate" or not e["points"] and not e["capacity"]:
                rows.append(_fig_row(e, link, None, e["status"] if e["status"] != "ok" else "gate"))
            for p in e["points"]:
                single = " (single stream)" if p["single_stream"] else ""
                rows.append(_fig_row(e, link, p, ("search step " if p["search_step"] else "") + f"{p['label']}{single}"))
            if e["capacity"]:
                c = e["capacity"]
                rows.append(_fig_row(e, link, {"output_tok_s": c.get("output_tok_s")},
                                     f"capacity under {c.get('slo_text')}: {num(c.get('capacity'), 0)} "
                                     f"({c.get('find')}, {c.get('verdict')})"))
        out += [Para([Mark(f"engine version {g['engine_version']}", "ok")]), Table(MEASURED_HEAD, rows)]
    return out


def crashes(doc: dict[str, Any], link: MakeLink) -> list:
    c = doc["sections"]["crashes"]
    if not c["count"]:
        return [Para(["No crash and no failed start recorded for this model (the journal's crash and start events)."])]
    out: list = [Para([f"{c['count']} ends other than a stop, grouped by build and engine version"
                       + (f"; {c['not_its_fault']} of them not this model's fault" if c["not_its_fault"] else "") + "."])]
    for g in c["groups"]:
        rows = []
        for x in g["crashes"]:
            cause = x["cause"]
            kernel = "; ".join(f"{'Xid ' + str(k['code']) if k['kind'] == 'xid' else k['kind']}"
                               f"{' pid ' + str(k['pid']) if k.get('pid') is not None else ''}: {k['whose']}"
                               for k in x["kernel"]) or "none"
            rows.append([day(x["at"]), f"{x['event']} {x['outcome']}",
                         f"{cause.get('id')}: {cause.get('summary')}", cause.get("matched_line") or "-",
                         kernel, Mark(x["fault_note"], "warn") if x["not_its_fault"] else "this model's",
                         cause.get("action") or "-", link("launch", x["launch"]) if x["launch"] else "-"])
        out += [Para([f"build {g['build']}, engine version {g['engine_version']}:"]),
                Table(["when", "end", "classified cause", "evidence", "kernel events", "whose fault", "to do", "launch"], rows)]
    return out


def uptime(doc: dict[str, Any], link: MakeLink) -> list:
    u = doc["sections"]["uptime"]
    w = u["longest_window"]
    out: list = []
    if w:
        how = "still running" if w["running"] else f"ended {w['ended']}" + (f" ({w['cause']})" if w["cause"] else "")
        out.append(Para([f"Longest window of any launch: {span(w['seconds'])}, {day(w['ready_at'])} → "
                         f"{day(w['ended_at']) if w['ended_at'] else 'now'}, build {w['build']}, engine "
                         f"{w['engine_version'] or 'not recorded'}, {how} (", link("launch", w["launch"]),
                         f"; {plural(u['windows'], 'launch')} became ready)."]))
    else:
        out.append(Para(["No launch of this model became ready yet."]))
    if u["soaks"]:
        out.append(Table(["date", "soak", "status", "ran", "requests (errors)", "longest clean window", "faults",
                          "command", "still holds?"],
                         [[day(s["at"]), link(s["run"], s["path"]), s["status"] + (f": {s['reason']}" if s["reason"] else ""),
                           span(s["elapsed_s"]), f"{s['requests']} ({s['errors']})", span(s["longest_clean_window_s"]),
                           str(s["faults"]), s["provenance"]["command"], stale_cell(s["stale"])] for s in u["soaks"]]))
    else:
        out.append(Para(["No soak of this model yet: `servedeck soak MODEL --duration 8h` makes one."]))
    wt = u["watch"]
    if wt["notices"]:
        counts = ", ".join(f"{k} ×{n}" for k, n in sorted(wt["counts"].items()))
        out.append(Para([f"The watch loop: {plural(wt['relaunches'], 'relaunch')} ({counts}); its last notices:"]))
        out.append(Table(["when", "kind", "message"], [[day(n["ts"]), n["kind"], n["message"]] for n in wt["notices"]]))
    else:
        out.append(Para(["The watch loop never relaunched or reported on this model."]))
    return out


def build(doc: dict[str, Any], link: MakeLink) -> list:
    b = doc["sections"]["build"]
    out: list = [Para([f"Build {b['name']} ({b['kind']}, {b['engine']} {b['engine_version'] or 'version unknown'}"
                       f"{', ' + b['version_source'] if b['version_source'] else ''}): {b['path']}"
                       + ("" if b["exists"] else " — does not exist") + (f". {b['notes']}" if b["notes"] else "")])]
    v = b["verified"]
    if v:
        if v["integrity_checked"]:
            what = (f"{v['files_matched']:,} of {v['files_total']:,} files match their RECORD hashes "
                    f"({v['dists']} distributions)")
            extra = [f"{k} {v[k]['count']}" for k in ("changed", "missing", "untracked", "no_record") if v[k]["count"]]
            if extra:
                what += "; " + ", ".join(extra)
        else:
            what = f"integrity not checked: {v['integrity_skip']}"
        out.append(Para([f"Last `servedeck verify-build {b['name']}`: {day(v['at'])}, ",
                         Mark(v["verdict"], "ok" if v["verdict"] == "intact" else "warn"),
                         f", {v['engine']} {v['engine_version']}: {what}; ", holds_sentence(b["verified_stale"], "the verdict still holds"),
                         "."]))
    elif verifiable(b["kind"], b["requires"]):
        out.append(Para([Mark("never verified", "warn"), f": `servedeck verify-build {b['name']}` checks the install "
                         "against its package records and keeps its verdict for this page."]))
    else:  # verify-build could only answer SKIP: a binary has no package record and this one requires nothing
        out.append(Para(["A binary: no package record to verify it against (its version is its build id)."]))
    if b["requires"]:
        out.append(Table(["requires", "now"], [[r["path"], r["saw"] if r["ok"] else Mark(r["saw"], "warn")]
                                                for r in b["requires"]]))
    if b["builds_used"]:
        out.append(Para(["Builds this model was launched on: " + "; ".join(
            f"{u['build']} ×{u['launches']} (last {day(u['last'])})" for u in b["builds_used"])]))
    return out


def tried(doc: dict[str, Any], link: MakeLink) -> list:
    t = doc["sections"]["tried"]
    if not t["campaigns"]:
        return [Para(["No campaign has varied this model yet: `servedeck campaign run FILE` with variants of it does."]),
                *tuned(t.get("tunes") or [], link)]
    out: list = []
    if t["refuted"]:
        out.append(Table(["variant", "tried in", "verdict", "why", "runs", "still holds?"],
                         [[f"{r['variant']} ({r['knobs']})", link(r["campaign"] or "campaign", r["folder"]),
                           Mark(r["verdict"], "warn"), "; ".join(r["lost"] + r["reasons"]) or "-",
                           [link(x["run"], x["path"]) for x in r["runs"]] or "-", stale_cell(r.get("stale"))]
                          for r in t["refuted"]]))
        out.append(Para(["In a line each: " + " • ".join(one_line(r) for r in t["refuted"])]))
    else:
        out.append(Para(["No variant was refuted."]))
    for c in t["campaigns"]:
        kept = [v for v in c["variants"] if not v["refuted"]]
        knobs = c["base_knobs"] if (c["base_knobs"] or "").startswith("(") else f"({c['base_knobs']})"
        out.append(Para([f"Campaign {c['name']} ({day(c['started'])}): base variant {c['base_variant']} "
                         f"{knobs}, gate {', '.join(c['base_gate']) or 'not run'}; "
                         + (("not refuted: " + "; ".join(f"{v['variant']} ({v['knobs']}): {v['verdict']}" for v in kept))
                            if kept else "every other variant refuted") + " (", link("folder", c["folder"]), ")."]))
    for u in t["unreadable"]:
        out.append(Para([Mark("unreadable", "warn"), f" {u}"]))
    return out + tuned(t.get("tunes") or [], link)


def tuned(tunes: list[dict[str, Any]], link: MakeLink) -> list:
    """Each finished tune of the model (page/tuned.py), newest first: what its verification decided, then every
    searched trial that lost, a row each, with why in the tune's own words (a document from before tunes has none)."""
    out: list = []
    for u in tunes:
        kept = f": {u['winner']} kept" if u.get("winner") else ""
        lost = u.get("lost") or []
        head: list = [f"Tune {u.get('name')} ({day(u.get('started'))}): {'verification ' if u.get('verified') else ''}{u.get('verdict')}{kept}; "
                      f"{len(lost)} of {u.get('searched')} searched trials lost (", link("folder", u["folder"]),
                      ")" + (f"; what moved its objective (fANOVA shares): {u['importance']}" if u.get("importance")
                             else "") + (":" if lost else ".")]
        out.append(Para(head))
        if lost:
            rows: list = [[r["trial"], r["values"], Mark(r["verdict"], "warn"), r["why"]] for r in lost]
            out.append(Table(["trial", "values", "verdict", "why"], rows))
    return out


def next_launch(doc: dict[str, Any], link: MakeLink) -> list:
    n = doc["sections"]["next"]
    out: list = []
    if n["doctor"]:
        out.append(Para([f"`servedeck doctor {doc['model']}`: {not_ok(n['doctor'], n['doctor_rows'])} "
                         "(build integrity is not hashed here: the Build section has the last verdict):"]))
        out.append(Table(["check", "subject", "status", "saw", "to do"],
                         [[r["check"], r["subject"], Mark(r["status"], "warn"), r["saw"], r["action"]] for r in n["doctor"]]))
    elif n["doctor_error"]:
        out.append(Para([Mark("doctor", "warn"), f" {n['doctor_error']}"]))
    else:
        out.append(Para([f"Every one of the doctor's {n['doctor_rows']} rows is OK."]))
    s = n["since_last_launch"]
    if s is None:
        out.append(Para(["Never launched: nothing to compare models.toml with."]))
    elif s["changes"]:
        out.append(Para([f"Changed since the last launch ({day(s['at'])}, ", link("launch", s["launch"]),
                         f"; compared with {s['basis']}):"]))
        out.append(Table(["key", "then", "now"], [[c["key"], str(c["then"]), str(c["now"])] for c in s["changes"]]))
    else:
        out.append(Para([f"models.toml is as it was at the last launch ({day(s['at'])}, ", link("launch", s["launch"]), ")."]))
    return out


def first(doc: dict[str, Any], link: MakeLink) -> list:
    return [Para([f"{doc['model']} has no history under servedeck yet (no launch, run, campaign or crash). Run, in order:"]),
            Table(["command", "why"], [[s["command"], s["why"]] for s in doc["first_steps"]])]


RENDER = {"what": what, "now": now, "launch": launch, "memory": memory, "measured": measured, "crashes": crashes,
          "uptime": uptime, "build": build, "tried": tried, "next": next_launch, "first": first}
SHORT = ("what", "now", "launch", "first", "build", "next")  # a model with no history


def section_blocks(doc: dict[str, Any], link: MakeLink) -> list[Section]:
    order = SHORT if not doc["history"] else tuple(doc["sections"])
    return [Section(sid, TITLES[sid], RENDER[sid](doc, link)) for sid in order]
