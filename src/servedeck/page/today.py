"""The page's sections about the model as models.toml has it today: what it is, whether it runs now,
the launch it would get, its memory, its build, and what to check before the next launch. Each reads
models.toml, the state dir and the machine (NVML, the build's files); none writes or starts anything.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Callable, Optional

from servedeck.config import Config
from servedeck.deck.desired import settings_of
from servedeck.deck.launch import shell_lines
from servedeck.doctor.build import BuildReport, check_requires, verify_build
from servedeck.doctor.verified import last_verification
from servedeck.engines.base import LaunchSpec
from servedeck.errors import ServedeckError
from servedeck.page.records import Launch, when
from servedeck.page.stale import Basis, basis, mark
from servedeck.report.knobs import changed, flags_of

READ_ERRORS = (ServedeckError, OSError, ValueError)
ENDED = ("crashed", "failed", "stopped")  # status shows a launch just found ended once, with its pid


def guarded(what: str, read: Callable[[], Any]) -> tuple[Any, Optional[str]]:
    """(value, None), or (None, why) when the record cannot be read: one unreadable record costs its
    figure, never the page."""
    try:
        return read(), None
    except READ_ERRORS as e:
        return None, f"{what}: {getattr(e, 'message', None) or e}"


def render_today(cfg: Config, name: str) -> tuple[Optional[LaunchSpec], Optional[str]]:
    from servedeck.deck import Deck

    return guarded("rendering the launch", lambda: Deck(cfg).render(name))


def build_now(cfg: Config, name: str) -> BuildReport:
    """The build as it is on disk now: exists, engine version (package metadata, VERSION file or
    `--version`); no hashing (that is `verify-build`, whose last verdict the Build section reads)."""
    m = cfg.models[name]
    return verify_build(cfg.deck.builds[m.build], m.build, cfg, integrity=False)


def now_basis(cfg: Config, name: str, spec: Optional[LaunchSpec], rep: BuildReport) -> Basis:
    m = cfg.models[name]
    return basis(build=m.build, build_path=rep.path, engine_version=rep.engine_version,
                 argv=spec.redacted_argv() if spec else None, env=spec.redacted_env() if spec else None,
                 context=m.context, engine=rep.engine)


def launch_basis(la: Launch, engine_version: Optional[str], engine: str) -> Basis:
    return basis(build=la.build, build_path=la.build_path, engine_version=engine_version, argv=la.argv,
                 env=la.env, context=la.context, engine=engine)


# --- What it is -----------------------------------------------------------------------------------------

def doctor_rows(cfg: Config, name: str) -> tuple[list[Any], Optional[str]]:
    """doctor's rows for the model, read once for the page (the weights row serves What it is too: reading
    a GGUF header skips ~100k tokenizer strings, seconds on a busy host). The build is not hashed here."""
    from servedeck.doctor.checks import run_doctor

    rows, err = guarded("doctor", lambda: run_doctor(lambda: cfg, name, integrity=False))
    return rows or [], err


def what(cfg: Config, name: str, rep: BuildReport, launches: list[Launch], runs: int, campaigns: int,
         doctor: list[Any]) -> dict:
    m = cfg.models[name]
    weights = next((r for r in doctor if r.check == "weights" and r.subject == name), None)
    werr = None if weights else "doctor gave no weights row"
    last_boot = next((la for la in reversed(launches) if la.boot), None)
    ready = [la for la in launches if la.rec.get("ready_at")]
    return {
        "source": m.source,
        "weights": ({"status": weights.status, "saw": weights.saw, "action": weights.action, "data": weights.data}
                    if weights else {"status": "SKIP", "saw": werr, "action": "", "data": {}}),
        "aliases": list(m.aliases), "served_name": m.served_name or name, "port": m.port, "slot": m.slot,
        "host": m.host, "layout": m.layout, "gpus": list(m.gpus), "cpus": list(m.cpus),
        "build": {"name": m.build, "kind": rep.kind, "path": rep.path, "engine": rep.engine, "exists": rep.exists},
        "engine_version": {"value": rep.engine_version, "source": rep.version_source,
                           "problems": list(rep.problems)},
        "context": {"configured": m.context,
                    "last_boot": {k: last_boot.boot[k] for k in ("ctx_total", "ctx_per_slot", "slots",
                                                                 "max_model_len", "context_len", "kv_tokens")
                                  if k in last_boot.boot} if last_boot else {},
                    "last_boot_launch": str(last_boot.dir) if last_boot else None},
        "vision": m.vision, "max_output_tokens": m.max_output_tokens, "notes": m.notes,
        "stop_timeout_s": m.stop_timeout_s, "ready_timeout_s": m.ready_timeout_s, "request": dict(m.request),
        "relaunch": {"tries": cfg.deck.host.relaunch_tries, "spacing_s": cfg.deck.host.relaunch_spacing_s},
        "history": {"launches": len(launches), "ready_launches": len(ready),
                    "first_launch": launches[0].started_at if launches else None,
                    "last_launch": launches[-1].started_at if launches else None,
                    "runs": runs, "campaigns": campaigns},
    }


# --- Now ----------------------------------------------------------------------------------------------

def is_running(row: Optional[dict]) -> bool:
    """Whether `status`'s row says the model's process runs. A state this servedeck does not name (a newer
    deck's `asleep`) is shown as it is: its process is what says whether it runs."""
    return bool(row and row.get("pid") is not None and str(row.get("state")) not in ENDED)


def now_state(cfg: Config, name: str) -> dict:
    """`status`'s row for the model (a query: nothing is settled or written), and, when it does not run,
    whether it would fit and who holds the memory (the fit check's own words)."""
    from servedeck.deck.status import statuses
    from servedeck.gpu.fit import fit_now

    rows, err = guarded("status", lambda: [s for s in statuses({}) if s.model == name])
    row = rows[0].to_json() if rows else None
    state = str(row["state"]) if row else "not running"
    out: dict[str, Any] = {
        "state": state, "running": is_running(row),
        "since": (row or {}).get("started_at"), "uptime_s": (row or {}).get("uptime_s"),
        "pid": (row or {}).get("pid"), "port": (row or {}).get("port"), "launch": (row or {}).get("launch_dir"),
        "desired": bool((row or {}).get("desired")), "detail": (row or {}).get("detail") or "",
        "cause": (row or {}).get("cause"), "error": err, "fit": None}
    if not out["running"]:
        fit, ferr = guarded("the fit check", lambda: fit_now(cfg, name))
        out["fit"] = ({"status": fit.status, "message": fit.message(), "holders": fit.holder_models(),
                       "hint": fit.refusal().hint if not fit.ok else None}
                      if fit else {"status": "unknown", "message": ferr, "holders": [], "hint": None})
    return out


# --- Launch configuration -------------------------------------------------------------------------------

def _why_rows(cfg: Config, name: str, flags: dict[str, str], env: dict[str, str]) -> list[dict]:
    """Each `why` entry beside the flag, env var or models.toml key it names, or beside its absence."""
    m = cfg.models[name]
    out = []
    for key, reason in m.why.items():
        where = None
        for f in (f"--{key}", f"-{key}", f"--{key.replace('_', '-')}"):
            if f in flags:
                where = f"{f} {flags[f]}" if flags[f] != "on" else f
                break
        if where is None and key in env:
            where = f"env {key}={env[key]}"
        if where is None and key in type(m).model_fields and key != "why":
            value = getattr(m, key)
            if value not in (None, "", [], {}) and value != type(m).model_fields[key].default:
                where = f"models.toml {key} = {value!r}"
        out.append({"key": key, "reason": reason, "present": where is not None, "where": where})
    return out


def _forms(launches: list[Launch], today: Optional[tuple[list[str], dict]]) -> list[dict]:
    """Each distinct rendered launch (argv and env exactly as launch.json keeps them, redacted), with the
    launches made in it: the date each form was last launched."""
    forms: dict[str, dict] = {}
    for la in launches:
        if la.argv is None:
            continue
        key = repr((la.argv, sorted(la.env.items())))
        f = forms.setdefault(key, {"argv": la.argv, "env": la.env, "launches": 0, "first": la.started_at,
                                   "last": None, "last_launch": None, "builds": []})
        f["launches"] += 1
        f["last"], f["last_launch"] = la.started_at, str(la.dir)
        if la.build and la.build not in f["builds"]:
            f["builds"].append(la.build)
    tkey = repr((today[0], sorted(today[1].items()))) if today else None
    out = []
    for k, f in forms.items():
        differs = None
        if today:  # what a person must change to get back to this form, flag by flag
            a = {**flags_of(f["argv"]), **{f"env {n}": v for n, v in f["env"].items()}}
            b = {**flags_of(today[0]), **{f"env {n}": v for n, v in today[1].items()}}
            differs = [f"{n}: {x} → {y}" for n, x, y in changed(a, b)]
        out.append({**f, "today": k == tkey, "differs_from_today": differs})
    return sorted(out, key=lambda f: f["last"] or "", reverse=True)


def launch_config(cfg: Config, name: str, spec: Optional[LaunchSpec], err: Optional[str],
                  launches: list[Launch], at: str) -> dict:
    m = cfg.models[name]
    argv = spec.redacted_argv() if spec else []
    env = spec.redacted_env() if spec else {}
    flags = {k: v for k, v in flags_of(argv).items() if k != "executable"} if argv else {}
    why = _why_rows(cfg, name, flags, env)
    by_flag = {r["where"].split(" ")[0]: r["reason"] for r in why if r["present"] and r["where"].startswith("-")}
    by_env = {r["key"]: r["reason"] for r in why if r["present"] and (r["where"] or "").startswith("env ")}
    forms = _forms(launches, (argv, env) if spec else None)
    today = next((f for f in forms if f["today"]), None)
    return {
        "rendered_at": at, "error": err, "argv": argv, "env": env,
        "cmd": " \\\n  ".join(shell_lines(argv)) if argv else "",
        "flags": [{"flag": k, "value": v, "why": by_flag.get(k)} for k, v in flags.items()],
        "env_rows": [{"name": k, "value": v, "why": by_env.get(k)} for k, v in env.items()],
        "why": why, "absent": [r for r in why if not r["present"]],
        "forms": forms, "today_last_launched": today["last"] if today else None,
        "today_last_launch": today["last_launch"] if today else None,
        "today_launches": today["launches"] if today else 0, "notes": m.notes,
    }


# --- Memory -----------------------------------------------------------------------------------------------

PLAN_KEYS = ("engine", "context", "dtype", "kv_dtype", "kv_dtype_why", "weights_bytes", "weights_per_gpu",
             "weights_basis", "kv_bytes_per_token", "kv_bytes_per_token_per_gpu", "request_bytes_per_gpu",
             "gpu_total_bytes", "utilization", "activation_bytes", "non_torch_bytes", "cuda_graph_bytes",
             "overhead_basis", "pool_bytes_per_gpu", "kv_pool_tokens", "full_length_requests",
             "need_bytes_per_gpu", "need_basis", "notes")


def memory(cfg: Config, name: str, now: Basis, launches: list[Launch], engine: str,
           version_of: Callable[[Launch], tuple[Optional[str], Optional[str]]]) -> dict:
    """The planner's figures for today's entry beside the last boot's own (plans/<model>.jsonl), and the
    share of a GPU the launch needs."""
    from servedeck.gpu import measured
    from servedeck.gpu.modelplan import plan_model
    from servedeck.gpu.nvml import inventory

    inv, _ = guarded("NVML", inventory)
    got, err = guarded("the planner", lambda: plan_model(cfg, name, inv))
    plan = got[0].to_json() if got else None
    last = measured.last_measurement(name)
    out: dict[str, Any] = {"predicted": {k: plan.get(k) for k in PLAN_KEYS} if plan else None, "error": err,
                           "measured": None, "share_of_gpu": None, "share_basis": None}
    if plan and plan.get("gpu_total_bytes") and plan.get("need_bytes_per_gpu"):
        out["share_of_gpu"] = plan["need_bytes_per_gpu"] / plan["gpu_total_bytes"]
        out["share_basis"] = plan.get("need_basis")
    elif plan and plan.get("utilization"):
        out["share_of_gpu"], out["share_basis"] = plan["utilization"], "gpu_memory_utilization"
    if last:
        la = next((x for x in launches if str(x.dir) == str(last.get("launch_dir"))), None)
        ver, _src = version_of(la) if la else (last.get("measured", {}).get("engine_version"), "boot log")
        then = (launch_basis(la, ver, engine) if la else
                Basis(build=last.get("build"), engine_version=ver, context=(last.get("predicted") or {}).get("context")))
        out["measured"] = {"at": last.get("at"), "build": last.get("build"), "launch": last.get("launch_dir"),
                           "engine_version": ver, "figures": last.get("measured") or {},
                           "predicted_then": last.get("predicted") or {},
                           "kv_tokens_error_pct": last.get("kv_tokens_error_pct"),
                           "gpu_used_bytes": last.get("gpu_used_bytes") or {},
                           "floor_bytes_per_gpu": last.get("floor_bytes_per_gpu"),
                           "stale": mark(then, now)}
    return out


# --- Build ------------------------------------------------------------------------------------------------

def build_section(cfg: Config, name: str, rep: BuildReport, launches: list[Launch]) -> dict:
    m = cfg.models[name]
    b = cfg.deck.builds[m.build]
    ver = last_verification(m.build)
    stale = None
    if ver:
        then = Basis(build=m.build, build_path=ver.get("path"), engine_version=ver.get("engine_version"))
        stale = mark(then, Basis(build=m.build, build_path=rep.path, engine_version=rep.engine_version))
    used: dict[str, dict] = {}
    for la in launches:
        if la.build:
            u = used.setdefault(la.build, {"build": la.build, "launches": 0, "last": None})
            u["launches"] += 1
            u["last"] = la.started_at
    return {"name": m.build, "kind": rep.kind, "path": rep.path, "engine": rep.engine,
            "engine_version": rep.engine_version, "version_source": rep.version_source, "exists": rep.exists,
            "problems": list(rep.problems), "notes": b.notes, "verified": ver, "verified_stale": stale,
            "requires": [{"path": r.path, "ok": r.ok, "saw": r.saw} for r in check_requires(b.requires, cfg.expand)],
            "builds_used": sorted(used.values(), key=lambda u: u["last"] or "", reverse=True)}


# --- Before the next launch -------------------------------------------------------------------------------

def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict) and d:
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}{k}."))
        return out
    return {prefix.rstrip("."): d}


def entry_changes(then: dict, now: dict) -> list[dict]:
    """Pure: every key of a models.toml entry (as desired.settings_of keeps it) that differs, dotted."""
    a, b = _flat(then), _flat(now)
    return [{"key": k, "then": a.get(k, "(absent)"), "now": b.get(k, "(absent)")}
            for k in list(a) + [k for k in b if k not in a] if a.get(k) != b.get(k)]


def next_launch(cfg: Config, name: str, spec: Optional[LaunchSpec], launches: list[Launch],
                doctor: tuple[list[Any], Optional[str]]) -> dict:
    from servedeck.doctor.checks import OK

    rows, err = doctor
    out: dict[str, Any] = {"doctor": [r.to_json() for r in rows if r.status != OK], "doctor_error": err,
                           "doctor_rows": len(rows), "since_last_launch": None}
    last = launches[-1] if launches else None
    if last is None:
        return out
    entry = last.rec.get("entry")
    since: dict[str, Any] = {"launch": str(last.dir), "at": last.started_at}
    if entry:
        today = {k: v for k, v in settings_of(name, cfg).items() if k not in ("since", "config_path")}
        then = {k: v for k, v in entry.items() if k != "config_path"}
        since.update(basis="the models.toml entry recorded at that launch", changes=entry_changes(then, today))
    else:  # a launch written before launch.json kept the entry: its rendered form is what is known
        then_spec = {"flags": flags_of(last.argv or []), "env": last.env, "port": last.rec.get("port"),
                     "slot": last.rec.get("slot"), "build": last.build}
        now_spec = {"flags": flags_of(spec.redacted_argv()) if spec else {}, "env": spec.redacted_env() if spec else {},
                    "port": cfg.models[name].port, "slot": cfg.models[name].slot, "build": cfg.models[name].build}
        since.update(basis="the launch's rendered command (that launch recorded no models.toml entry)",
                     changes=entry_changes(then_spec, now_spec))
    out["since_last_launch"] = since
    return out


def age_s(ts: Optional[str], now: datetime) -> Optional[float]:
    t = when(ts)
    return (now - t).total_seconds() if t else None
