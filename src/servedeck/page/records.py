"""One model's history, read from servedeck's own records and nothing else: its launch folders
(launch.json, boot.json, cmd.sh), the journal, the watch loop's notices, the run folders and the
campaign folders. Reading only; nothing here writes."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

from servedeck.deck import launch as L
from servedeck.deck import state as S
from servedeck.runs.read import list_runs, load, summary_of
from servedeck.watch.notices import read_notices


def when(ts: Any) -> Optional[datetime]:
    """An ISO time as servedeck writes it (with its offset), or None."""
    if not isinstance(ts, str) or not ts:
        return None
    try:
        t = datetime.fromisoformat(ts.replace("Z", "+00:00"))
    except ValueError:
        return None
    return t if t.tzinfo else t.astimezone()


def _json(path: Path) -> dict[str, Any]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


@dataclass
class Launch:
    """One launch folder (deck/launch.py), as it was left."""

    dir: Path
    rec: dict[str, Any]  # launch.json
    boot: dict[str, Any]  # boot.json ({} when the launch never became ready)

    @property
    def started_at(self) -> Optional[str]:
        return self.rec.get("started_at")

    @property
    def state(self) -> str:
        return str(self.rec.get("state") or "unknown")

    @property
    def build(self) -> Optional[str]:
        return self.rec.get("build")

    @property
    def spec(self) -> dict[str, Any]:
        return self.rec.get("spec") or {}

    @property
    def argv(self) -> Optional[list[str]]:
        return self.spec.get("argv")

    @property
    def env(self) -> dict[str, str]:
        return dict(self.spec.get("env") or {})

    @property
    def engine_version(self) -> Optional[str]:
        """The launch's own record (a newer deck writes engine_version into launch.json), else its boot log's."""
        return self.rec.get("engine_version") or self.boot.get("engine_version")

    @property
    def build_path(self) -> Optional[str]:
        entry = self.rec.get("entry") or {}
        b = entry.get("build") or {}
        return b.get("binary") or b.get("python") or b.get("image") or ((self.argv or [None])[0])

    @property
    def context(self) -> Optional[int]:
        return ((self.rec.get("entry") or {}).get("model") or {}).get("context")

    def window_s(self, now: datetime) -> Optional[float]:
        """Seconds from ready to its end (or to now while it runs); None for a launch never ready."""
        ready = when(self.rec.get("ready_at"))
        if ready is None:
            return None
        end = when(self.rec.get("ended_at"))
        if end is None and self.state in ("ready", "stopping"):
            end = now
        return (end - ready).total_seconds() if end else None


def launches_of(model: str) -> list[Launch]:
    """Every launch folder of `model`, oldest first."""
    return [Launch(d, L.read_launch(d), _json(d / "boot.json")) for d in L.past_launches(model)]


def journal_of(model: str) -> list[dict[str, Any]]:
    return list(S.read_journal(model))


def notices_of(model: str) -> list[dict[str, Any]]:
    return list(read_notices(model=model))


def is_own_run(summary: dict[str, Any], model: str) -> bool:
    """A run of the model itself (bench, gate, soak, capacity): not of a campaign's variant of it."""
    if summary.get("model_entry"):
        return summary["model_entry"] == model
    return summary.get("model") == model and not summary.get("campaign")


def runs_of(model: str, root: Path) -> list[dict[str, Any]]:
    """The model's own run folders, each as `servedeck show` rebuilds it (figures from requests.jsonl),
    oldest first. Only folders whose summary names the model are read whole."""
    return [load(p) for p in list_runs(root) if is_own_run(summary_of(p), model)]


def campaigns_of(model: str, root: Path) -> list[Path]:
    """Campaign folders under `root` (<results>/campaigns) whose base model is `model`, oldest first."""
    from servedeck.campaign.folder import list_campaigns

    return [p for p in list_campaigns(root) if _json(p / "campaign.json").get("model") == model]


def versions_by_launch(views: list[dict[str, Any]]) -> dict[str, str]:
    """launch folder → the engine version a run on it recorded (runs/inventory.py asked the engine):
    for launches whose own records carry none."""
    out: dict[str, str] = {}
    for v in views:
        ver = (v.get("versions") or {}).get("engine_version")
        d = (v.get("launch") or {}).get("launch_dir")
        if ver and d:
            out.setdefault(str(d), str(ver))
    return out


def launch_dir_of(view: dict[str, Any]) -> Optional[str]:
    """The launch a run measured: summary.json `launch`, or (a soak) where its server log came from."""
    d = (view.get("launch") or {}).get("launch_dir")
    if d:
        return str(d)
    src = (view.get("server_log") or {}).get("source")
    return str(Path(src).parent) if src else None
