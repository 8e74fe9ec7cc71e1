"""The page's sections about what happened to the model: what was measured, how it crashed, how long it
stayed up. Each figure carries its provenance (run folder or launch, the command, the date, the engine
version, the build) and a stale mark against today's launch (page/stale.py).
"""

from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path
from typing import Any, Callable, Optional

from servedeck.page.records import Launch, launch_dir_of, versions_by_launch
from servedeck.page.stale import Basis, basis, mark

VersionOf = Callable[[Launch], tuple[Optional[str], Optional[str]]]
WATCH_KINDS = ("crashed", "relaunch", "relaunched", "relaunch-failed", "gave-up", "stable", "stalled", "slow",
               "recovered", "reaped", "absent", "adopted", "resumed")


_TAKEN = re.compile(r"\d{4}-\d{6}-(\d+)$")  # fsio.unique_dir's -2, -3 for a second run folder made in the same second


def newest_first_key(e: dict[str, Any]) -> tuple[str, int]:
    """Order of records stamped to the second: the stamp, then the -N that fsio.unique_dir gave a folder made
    in a second already taken (a gate and the bench after it often share one), so the later one sorts later."""
    m = _TAKEN.search(Path(str(e.get("path") or "")).name)
    return (e.get("at") or "", int(m.group(1)) if m else 1)


def version_finder(views: list[dict[str, Any]]) -> VersionOf:
    """A launch's engine version and where it was read: launch.json (a deck that records it), its boot
    log, or a run measured on that launch (the run asked the engine: runs/inventory.py)."""
    by_launch = versions_by_launch(views)

    def of(la: Launch) -> tuple[Optional[str], Optional[str]]:
        if la.rec.get("engine_version"):
            return str(la.rec["engine_version"]), "launch.json"
        if la.boot.get("engine_version"):
            return str(la.boot["engine_version"]), "boot log"
        v = by_launch.get(str(la.dir))
        return (v, "a run measured on this launch") if v else (None, None)

    return of


# --- provenance of a run ----------------------------------------------------------------------------------

def command_of(v: dict[str, Any]) -> str:
    """The servedeck command that made a run, rebuilt from its summary.json (the summary keeps what was
    asked, not the words typed)."""
    model = v.get("model_entry") or v.get("model") or "?"
    w = v.get("workload") or {}
    camp = v.get("campaign") or {}
    if camp:
        return f"servedeck campaign run (campaign {camp.get('name')}, cell {camp.get('cell')}, variant {camp.get('variant')})"
    kind = v.get("kind")
    if kind == "gate":
        spec = (v.get("gate") or {}).get("spec") or w.get("gate") or {}
        depths = ",".join(f"{d:g}" for d in spec.get("depths") or [])
        return f"servedeck gate {model} --context {spec.get('context', v.get('context'))}" + \
            (f" --depths {depths}" if depths else "")
    if kind == "soak":
        return (f"servedeck soak {model} --duration {w.get('duration_s', 0):g}s --concurrency {w.get('concurrency')}"
                + (f" --burst-every {w.get('burst_every_s', 0):g}s" if w.get("burst_every_s") else ""))
    cap = w.get("capacity") or {}
    if cap:
        slo = (cap.get("slo") or {}).get("text") or (v.get("capacity") or {}).get("slo_text") or "?"
        return f"servedeck bench {model} --workload {w.get('workload')} --find {cap.get('find')} --slo \"{slo}\""
    # a load-point bench (chat, long-prompt, decode) keeps every setting in its workload; other kinds their own
    flags = bench_flags(w) if "points" in w else ([f"--seed {w['seed']}"] if w.get("seed") is not None else [])
    return f"servedeck bench {model} --workload {w.get('workload')}" + "".join(f" {x}" for x in flags) + \
        (" --no-gate" if (v.get("gate") or {}).get("status") == "not run" else "")


_RATE = re.compile(r"rate=([0-9.e+-]+)/s (\w+)")


def _secs(x: Any) -> str:
    return "none" if x is None else f"{float(x):g}s"


def bench_flags(w: dict[str, Any]) -> list[str]:
    """The options of a load-point bench, from the workload its summary.json keeps (BenchSpec.to_json): every
    setting that shapes the run, so the command run again makes a run with the same settings."""
    pts = [str(p) for p in w.get("points") or []]
    out: list[str] = []
    rates = [_RATE.fullmatch(p) for p in pts]
    if pts and all(p.startswith("c=") for p in pts):
        out.append("--concurrency " + ",".join(p.removeprefix("c=") for p in pts))
    elif pts and all(rates):
        out.append("--rate " + ",".join(m.group(1) for m in rates if m))
        gaps = {m.group(2) for m in rates if m}
        if gaps != {"poisson"}:
            out.append("--arrivals " + gaps.pop())
    elif pts:
        out.append(f"(points {', '.join(pts)})")
    if w.get("prompt_tokens") is not None:
        out.append(f"--prompt-tokens {w['prompt_tokens']}")
    elif w.get("input_tokens") is not None:
        out.append(f"--input-tokens {w['input_tokens']}")
    if w.get("output_tokens") is not None:
        out.append(f"--output-tokens {w['output_tokens']}")
    if w.get("requests") is not None:
        out.append(f"--requests {w['requests']}")
    if w.get("duration_s") is not None:
        out.append(f"--duration {_secs(w['duration_s'])}")
    if w.get("warmup") is not None:
        out.append(f"--warmup {w['warmup']}")
    if w.get("repeat_prompt"):
        out.append("--repeat-prompt")
    if w.get("seed") is not None:
        out.append(f"--seed {w['seed']}")
    if w.get("content") not in (None, "random"):
        out.append(f"--content {w['content']}")
    if "request_timeout_s" in w:
        out.append(f"--request-timeout {_secs(w['request_timeout_s'])}")
    if w.get("stall_after_s", 300.0) != 300.0:
        out.append(f"--stall-after {_secs(w.get('stall_after_s'))}")
    slo = w.get("slo") or {}
    bounds = [f"{k}={slo[k + '_ms']:g}ms" for k in ("ttft", "tpot", "e2e") if slo.get(k + "_ms") is not None]
    if bounds:
        out.append("--slo " + ",".join(bounds))
    if w.get("check_outputs"):
        out.append("--check-outputs")
    if (w.get("client_procs") or 1) != 1:
        out.append(f"--client-procs {w['client_procs']}")
    return out


def run_basis(v: dict[str, Any], version: Optional[str]) -> Basis:
    from servedeck.report.knobs import launch_of

    cfg = v.get("config") or {}
    b = cfg.get("build") or {}
    argv, env, _ = launch_of(Path(v["path"]), v)
    context = v.get("configured_context") or (cfg.get("model") or {}).get("context")
    return basis(build=cfg.get("build_name"), build_path=b.get("binary") or b.get("python") or b.get("image"),
                 engine_version=version, argv=argv or None, env=env if argv else None, context=context,
                 engine=str(v.get("engine") or ""))


def provenance(v: dict[str, Any], version: Optional[str], version_from: Optional[str]) -> dict[str, Any]:
    cfg = v.get("config") or {}
    b = cfg.get("build") or {}
    cmd = Path(v["path"]) / "cmd.sh"
    return {"run": v["path"], "run_name": v.get("run"), "launch": launch_dir_of(v), "at": v.get("created_at"),
            "command": command_of(v), "engine": v.get("engine"), "engine_version": version,
            "engine_version_from": version_from, "build": cfg.get("build_name"),
            "build_path": b.get("binary") or b.get("python") or b.get("image"),
            "context": v.get("configured_context") or (cfg.get("model") or {}).get("context"),
            "engine_command": str(cmd) if cmd.exists() else None}


def run_version(v: dict[str, Any], launches: dict[str, Launch], version_of: VersionOf) -> tuple[Optional[str], Optional[str]]:
    ver = (v.get("versions") or {}).get("engine_version")
    if ver:
        return str(ver), "the run (the engine asked when it began)"
    la = launches.get(launch_dir_of(v) or "")
    return version_of(la) if la else (None, None)


# --- Measured ---------------------------------------------------------------------------------------------

def _p50(fig: dict[str, Any], key: str) -> Optional[float]:
    return (fig.get(key) or {}).get("p50")


def point_row(p: dict[str, Any], search: bool = False) -> dict[str, Any]:
    f = p.get("figures") or {}
    shape = p.get("shape") or {}
    c = shape.get("concurrency")
    return {"label": p.get("label"), "status": p.get("status"), "concurrency": c, "rate": shape.get("rate"),
            "single_stream": c == 1, "search_step": search, "output_tok_s": f.get("output_tok_s"),
            "per_user_tok_s_p50": _p50(f, "per_user_tok_s"), "ttft_p50_ms": _p50(f, "ttft_ms"),
            "tpot_p50_ms": _p50(f, "tpot_ms"), "e2e_p50_ms": _p50(f, "e2e_ms"),
            "ok": (f.get("counts") or {}).get("ok"), "errors": (f.get("counts") or {}).get("error"),
            "cached_fraction": f.get("cached_fraction"),
            "j_per_output_token": ((f.get("telemetry") or {}).get("gpu") or {}).get("j_per_output_token")}


def gate_of(v: dict[str, Any]) -> dict[str, Any]:
    from servedeck.report.render import gate_cell

    g = v.get("gate") or {}
    return {"status": g.get("status", "not run"), "text": gate_cell(v)}


def measured(views: list[dict[str, Any]], launches: dict[str, Launch], version_of: VersionOf,
             now: Basis) -> dict[str, Any]:
    """The model's gate and bench runs (soaks are the Evidence section's), newest first, grouped by the
    engine version they ran on."""
    entries = []
    for v in views:
        if v.get("kind") not in ("gate", "bench"):
            continue
        ver, src = run_version(v, launches, version_of)
        cap = v.get("capacity")
        entries.append({"run": v.get("run"), "path": v["path"], "kind": v.get("kind"), "at": v.get("created_at"),
                        "status": v.get("status"), "reason": v.get("reason"), "label": v.get("label"),
                        "gate": gate_of(v), "provenance": provenance(v, ver, src),
                        "stale": mark(run_basis(v, ver), now),
                        "points": [point_row(p, search=isinstance(cap, dict)) for p in v.get("points") or []]
                        if v.get("kind") == "bench" else [],
                        "capacity": ({k: cap.get(k) for k in ("slo", "slo_text", "find", "capacity", "verdict",
                                                              "binding", "output_tok_s", "goodput_request_s")}
                                     if isinstance(cap, dict) else None)})
    entries.sort(key=newest_first_key, reverse=True)
    groups: dict[str, list] = {}
    for e in entries:
        groups.setdefault(e["provenance"]["engine_version"] or "not recorded", []).append(e)
    return {"runs": len(entries), "stale_runs": sum(e["stale"]["stale"] for e in entries),
            "by_engine_version": [{"engine_version": k, "runs": rs} for k, rs in groups.items()]}


# --- Crashes ----------------------------------------------------------------------------------------------

def _fault(cause: dict[str, Any]) -> tuple[bool, str]:
    """Whether a classified end was not the model's doing, and why, from the catalogue's own words: an
    event of the node (Xid 79: the card fell off the bus) is the host's."""
    if cause.get("severity") == "node" or cause.get("family") == "gpu-lost":
        return True, f"{cause.get('summary')}: the host's fault, not this model's ({cause.get('action')})"
    return False, ""


def crash_rows(journal: list[dict[str, Any]], launches: dict[str, Launch], version_of: VersionOf) -> list[dict]:
    """Crashes while serving and starts that failed with a classified cause (what `servedeck crashes`
    lists), each with the build and engine version it belongs to: the record's own keys when the deck
    wrote them, else its launch folder's."""
    out = []
    for r in journal:
        if not (r.get("event") == "crash" or (r.get("event") == "start" and r.get("outcome") == "failed"
                                               and r.get("cause"))):
            continue
        la = launches.get(str(r.get("launch_dir") or ""))
        build = r.get("build") or (la.build if la else None)
        ver, src = (str(r["engine_version"]), "the crash record") if r.get("engine_version") else \
            (version_of(la) if la else (None, None))
        cause = r.get("cause") or {}
        theirs, why = _fault(cause)
        kernel = [{**{k: k_ev.get(k) for k in ("code", "at", "pci", "pid", "process", "text")},
                   "kind": k_ev.get("kind") or ("xid" if k_ev.get("code") is not None else "kernel"),
                   "ours": k_ev.get("ours"), "whose": k_ev.get("whose") or
                   ("not this model's" if k_ev.get("ours") is False else
                    "matched by time only" if k_ev.get("ours") is None else "this model's")}
                  for k_ev in (cause.get("kernel") or []) + (cause.get("kernel_other") or [])]
        out.append({"at": r.get("ts"), "event": r.get("event"), "outcome": r.get("outcome"),
                    "launch": r.get("launch_dir"), "build": build, "engine_version": ver,
                    "engine_version_from": src, "detail": r.get("detail"), "exit": r.get("exit"),
                    "cause": {k: cause.get(k) for k in ("id", "family", "summary", "action", "matched_line",
                                                        "source", "severity", "priority")},
                    "evidence": [{"id": e.get("id"), "line": e.get("matched_line"), "source": e.get("source")}
                                 for e in cause.get("evidence") or []],
                    "kernel": kernel, "not_its_fault": theirs, "fault_note": why,
                    "log_tail": list(r.get("log_tail") or [])})
    return out


def crashes(journal: list[dict[str, Any]], launches: dict[str, Launch], version_of: VersionOf) -> dict[str, Any]:
    rows = sorted(crash_rows(journal, launches, version_of), key=lambda c: c["at"] or "", reverse=True)
    groups: dict[tuple[str, str], list] = {}
    for c in rows:
        groups.setdefault((c["build"] or "not recorded", c["engine_version"] or "not recorded"), []).append(c)
    return {"count": len(rows), "not_its_fault": sum(c["not_its_fault"] for c in rows),
            "groups": [{"build": b, "engine_version": v, "crashes": cs} for (b, v), cs in groups.items()]}


# --- Evidence of staying up ---------------------------------------------------------------------------------

def uptime(launches: list[Launch], views: list[dict[str, Any]], notices: list[dict[str, Any]],
           by_dir: dict[str, Launch], version_of: VersionOf, now: Basis, at: datetime) -> dict[str, Any]:
    windows = []
    for la in launches:
        s = la.window_s(at)
        if s is None:
            continue
        ver, _ = version_of(la)
        cause = (la.rec.get("cause") or {}).get("id")
        windows.append({"launch": str(la.dir), "build": la.build, "engine_version": ver,
                        "ready_at": la.rec.get("ready_at"), "ended_at": la.rec.get("ended_at"),
                        "seconds": round(s, 1), "ended": la.state, "cause": cause,
                        "running": la.rec.get("ended_at") is None})
    longest = max(windows, key=lambda w: w["seconds"], default=None)
    soaks = []
    for v in views:
        if v.get("kind") != "soak":
            continue
        ver, src = run_version(v, by_dir, version_of)
        counts = v.get("counts") or {}
        soaks.append({"run": v.get("run"), "path": v["path"], "at": v.get("created_at"), "status": v.get("status"),
                      "reason": v.get("reason"), "elapsed_s": v.get("elapsed_s"),
                      "requests": counts.get("total"), "errors": counts.get("error"), "ok": counts.get("ok"),
                      "longest_clean_window_s": v.get("longest_clean_window_s"),
                      "faults": len(v.get("faults") or []), "kernel_log": v.get("kernel_log"),
                      "provenance": provenance(v, ver, src), "stale": mark(run_basis(v, ver), now)})
    soaks.sort(key=newest_first_key, reverse=True)
    watch = [n for n in notices if n.get("kind") in WATCH_KINDS]
    kinds: dict[str, int] = {}
    for n in watch:
        kinds[n["kind"]] = kinds.get(n["kind"], 0) + 1
    return {"longest_window": longest, "windows": len(windows), "soaks": soaks,
            "watch": {"counts": kinds, "relaunches": kinds.get("relaunched", 0),
                      "notices": [{"ts": n.get("ts"), "kind": n.get("kind"), "message": n.get("message")}
                                  for n in watch[-20:]][::-1]}}
