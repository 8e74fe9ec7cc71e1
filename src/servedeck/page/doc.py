"""`servedeck page MODEL`: one model's page, rebuilt from servedeck's own records alone. It writes
nothing and needs no running engine (a running one is asked for its health, as `status` asks).

The page is a JSON document first (`--json`, its shape in docs/page.md, versioned by SCHEMA); the
Markdown and HTML are drawn from that document and nothing else (page/render.py).
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from servedeck import __version__, paths
from servedeck.config import Config
from servedeck.deck.state import now_iso
from servedeck.page import history as H
from servedeck.page import today as T
from servedeck.page.sections import verifiable
from servedeck.page.records import campaigns_of, journal_of, launches_of, notices_of, runs_of
from servedeck.page.tried import tried
from servedeck.page.tuned import tunes_of
from servedeck.campaign.folder import campaigns_root
from servedeck.runs.folder import runs_root
from servedeck.tune.folder import tunes_root

SCHEMA = 1
SECTIONS = ("what", "now", "launch", "memory", "measured", "crashes", "uptime", "build", "tried", "next")


def first_steps(name: str, build: str, verify: bool = True) -> list[dict[str, str]]:
    """What a model with no history should get first, in the order that makes each step's record useful
    to the next (the gate before the figures it validates). `verify` False: verify-build could only answer
    SKIP for this build (a binary with no package record and no `requires`), so it is not suggested."""
    return [
        {"command": f"servedeck doctor {name}", "why": "config, build, weights, port and memory before anything starts"},
        *([{"command": f"servedeck verify-build {build}",
            "why": "the build's files against its package records (kept for this page)"}] if verify else []),
        {"command": f"servedeck start {name}", "why": "a first launch: its folder, boot facts and the planner's check"},
        {"command": f"servedeck gate {name}", "why": "the correctness gate, before any figure counts"},
        {"command": f"servedeck bench {name} --workload chat --concurrency 1,4 --seed 1",
         "why": "single-stream and loaded figures, the same prompts every time"},
        {"command": f"servedeck soak {name} --duration 1h", "why": "evidence that it stays up"},
    ]


def build_page(cfg: Config, model: str) -> dict[str, Any]:
    """The whole page of `model` (a name or alias in models.toml) as a JSON-able document."""
    name = cfg.resolve(model)
    at_text = now_iso()
    at = datetime.fromisoformat(at_text)
    root = runs_root(cfg.deck.host.results_dir)
    launches = launches_of(name)
    by_dir = {str(la.dir): la for la in launches}
    views = runs_of(name, root)
    camps = campaigns_of(name, campaigns_root(cfg.deck.host.results_dir))
    # a tune.json that cannot be read cannot say whose it is: left out, as campaigns_of leaves out such a campaign
    tunes, _ = tunes_of(name, tunes_root(cfg.deck.host.results_dir))
    journal = journal_of(name)
    notices = notices_of(name)
    rep = T.build_now(cfg, name)
    spec, spec_err = T.render_today(cfg, name)
    now = T.now_basis(cfg, name, spec, rep)
    version_of = H.version_finder(views)
    crashes = H.crashes(journal, by_dir, version_of)
    has_history = bool(launches or views or camps or tunes or crashes["count"])
    doctor = T.doctor_rows(cfg, name)
    tried_now = tried(camps, now)
    tried_now["tunes"] = tunes
    sections = {
        "what": T.what(cfg, name, rep, launches, len(views), len(camps), doctor[0]),
        "now": T.now_state(cfg, name),
        "launch": T.launch_config(cfg, name, spec, spec_err, launches, at_text),
        "memory": T.memory(cfg, name, now, launches, rep.engine, version_of),
        "measured": H.measured(views, by_dir, version_of, now),
        "crashes": crashes,
        "uptime": H.uptime(launches, views, notices, by_dir, version_of, now, at),
        "build": T.build_section(cfg, name, rep, launches),
        "tried": tried_now,  # the campaigns' refuted variants, and the tunes' losing trials beside them
        "next": T.next_launch(cfg, name, spec, launches, doctor),
    }
    return {"schema": SCHEMA, "kind": "servedeck-page", "model": name, "asked_as": model,
            "generated_at": at_text, "servedeck": __version__, "config_path": str(cfg.path),
            "home": str(paths.home()), "results": str(root), "history": has_history,
            "first_steps": [] if has_history else first_steps(name, cfg.models[name].build, verifiable(
                sections["build"]["kind"], sections["build"]["requires"])),
            "now_basis": now.to_json(), "sections": sections}
