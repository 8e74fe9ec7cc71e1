"""The deck's state on disk: desired.json (what should run), live records (what servedeck started and
believes runs), the journal (everything that happened) and the lock (one start/switch/stop at a time).

desired.json is written atomically and the previous good copy is kept as desired.json.bak; a corrupt
file is an error that names it, never a reason to start things blindly.
"""

from __future__ import annotations

import json
import os
import time
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator


from servedeck import paths
from servedeck.errors import BusyError, StateError
from servedeck.deck.records import LiveRecord
from servedeck.fsio import JsonlRows, append_jsonl, atomic_write_json, exclusive, read_jsonl

DESIRED_SCHEMA = 1


def now_iso() -> str:
    return datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")


# --- desired.json -----------------------------------------------------------------------

def _migrate_0_to_1(doc: dict) -> dict:
    """Version 0 (unversioned) was {model: settings}; version 1 wraps it in {schema, models}."""
    return {"schema": 1, "models": {k: v for k, v in doc.items() if k != "schema"}}


# Named migrations, applied in order; the names applied are recorded in the file.
MIGRATIONS: list[tuple[int, str, Callable[[dict], dict]]] = [(0, "wrap_models_v1", _migrate_0_to_1)]


def read_desired() -> dict[str, Any]:
    path = paths.desired_file()
    if not path.exists():
        return {"schema": DESIRED_SCHEMA, "models": {}, "migrations": []}
    try:
        doc = json.loads(path.read_text())
        if not isinstance(doc, dict):
            raise ValueError("top level is not an object")
    except (json.JSONDecodeError, ValueError, UnicodeDecodeError) as e:
        bak = path.with_suffix(".json.bak")
        raise StateError(
            f"{path}: desired state is corrupt ({e}); nothing was started",
            hint=(f"the previous good copy is {bak}: inspect both, then `cp {bak} {path}` or delete {path} "
                  "to start from nothing" if bak.exists() else f"delete {path} to start from an empty desired state"),
        ) from None
    version = doc.get("schema", 0)
    if version > DESIRED_SCHEMA:
        raise StateError(f"{path}: schema {version} is newer than this servedeck understands ({DESIRED_SCHEMA})",
                         hint="upgrade servedeck")
    applied = list(doc.get("migrations", []))
    for from_version, name, fn in MIGRATIONS:
        if version == from_version:
            doc = fn(doc)
            applied.append(name)
            version = doc["schema"]
    doc["migrations"] = applied
    if not isinstance(doc.get("models"), dict):
        raise StateError(f"{path}: 'models' is not an object", hint="restore desired.json.bak or delete the file")
    return doc


def write_desired(doc: dict[str, Any]) -> None:
    path = paths.desired_file()
    doc = {"schema": DESIRED_SCHEMA, **{k: v for k, v in doc.items() if k != "schema"}}
    if path.exists():
        try:  # keep the last good copy: only a parseable file is worth keeping
            json.loads(path.read_text())
            os.replace(path, path.with_suffix(".json.bak"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            pass
    atomic_write_json(path, doc)


def set_desired(model: str, settings: dict | None) -> None:
    doc = read_desired()
    if settings is None:
        if model not in doc["models"]:
            return
        doc["models"].pop(model)
    else:
        doc["models"][model] = settings
    write_desired(doc)


# --- live records ------------------------------------------------------------------------

def live_path(model: str) -> Path:
    return paths.live_dir() / f"{paths.component(model)}.json"


def read_live(model: str) -> LiveRecord | None:
    try:
        return LiveRecord.from_json(json.loads(live_path(model).read_text()))
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, TypeError, KeyError, ValueError) as e:
        raise StateError(f"{live_path(model)}: live record is corrupt ({type(e).__name__}: {e})",
                         hint="check `ps` for the engine; delete the file once it is stopped") from None


def all_live() -> dict[str, LiveRecord]:
    out = {}
    for f in sorted(paths.live_dir().glob("*.json")):
        rec = read_live(f.stem)
        if rec:
            out[f.stem] = rec
    return out


def write_live(record: LiveRecord) -> None:
    atomic_write_json(live_path(record.model), record.to_json())


def clear_live(model: str) -> None:
    try:
        live_path(model).unlink()
    except FileNotFoundError:
        pass


# --- the watch loop's view -----------------------------------------------------------------
# watch.json is written only by the watch loop (under its own lock) and read by `status`, so that
# `status` can say "stalled" or "gave up" without importing the loop.

def watch_file() -> Path:
    return paths.home() / "watch.json"


def read_watch() -> dict[str, Any]:
    try:
        doc = json.loads(watch_file().read_text())
        return doc if isinstance(doc, dict) else {}
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return {}  # the loop rewrites it whole each time; a bad copy only hides advice, never state


def write_watch(doc: dict[str, Any]) -> None:
    atomic_write_json(watch_file(), doc)


# --- journal -----------------------------------------------------------------------------

def journal(event: str, model: str | None, outcome: str, **detail: Any) -> dict:
    rec = {"ts": now_iso(), "t": time.time(), "event": event, "model": model, "outcome": outcome, **detail}
    append_jsonl(paths.journal_file(), rec)
    return rec


def read_journal(model: str | None = None) -> JsonlRows:
    """Journal rows, oldest first; `.skipped` counts lines that could not be read."""
    return read_jsonl(paths.journal_file()).keep(lambda r: model is None or r.get("model") == model)


# --- the lock ----------------------------------------------------------------------------

@contextmanager
def deck_lock(what: str, wait_s: float = 0.0) -> Iterator[None]:
    """One start/switch/stop/restore at a time per state dir. A second caller is told who holds it."""
    lock_path = paths.lock_file()

    def busy(holder: dict | None) -> BusyError:
        who = (f"pid {holder['pid']} running `{holder.get('what')}` since {holder.get('since')}"
               if holder and "pid" in holder else "another servedeck process")
        return BusyError(f"the deck is busy: {who} holds {lock_path}",
                         hint="wait for it to finish (or pass --wait SECONDS); only one start/switch/stop runs at a time")

    with exclusive(lock_path, what, busy, wait_s):
        yield
