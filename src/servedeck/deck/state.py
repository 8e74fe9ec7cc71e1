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
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterator


from pydantic import TypeAdapter, ValidationError

from servedeck import paths
from servedeck.errors import BusyError, DiskFullError, StateError
from servedeck.deck.records import LaunchState, LiveRecord
from servedeck.fsio import JsonlRows, append_jsonl, atomic_write_json, exclusive, read_jsonl, say_holder

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


def settings_problem(settings: Any) -> str | None:
    """What a desired.json entry lacks to rebuild a launch from (restore, the watch loop); None if nothing."""
    if not isinstance(settings, dict):
        return f"not a JSON object ({_kind(settings)})"
    for key, kind in (("model", dict), ("build_name", str), ("build", dict)):
        if not isinstance(settings.get(key), kind):
            return f"{key}: expected {'an object' if kind is dict else 'a string'}, got {_kind(settings.get(key))}"
    return None


def wanted() -> tuple[set[str], str | None]:
    """The models desired state wants, and None; or nothing and why, when desired.json cannot be read:
    for stop and status, which must work whatever desired.json holds."""
    try:
        return set(read_desired()["models"]), None
    except StateError as e:
        return _wanted_raw(), f"{e.message} ({e.hint})" if e.hint else e.message


def _wanted_raw() -> set[str]:
    """The names a damaged desired.json still lists, when its top level can be read at all."""
    try:
        doc = json.loads(paths.desired_file().read_text())
        models = doc.get("models", doc) if isinstance(doc, dict) else {}
        return {m for m in models if isinstance(m, str)} if isinstance(models, dict) else set()
    except (OSError, ValueError):
        return set()


def state_problems() -> list[str]:
    """What cannot be read under $SERVEDECK_HOME, in sentences: desired.json, live records."""
    out = []
    _, desired = wanted()
    if desired:
        out.append(desired)
    out += [f"{p}; it is left out (`{stop_command(m)}` sets it aside)" for m, p in unreadable_live().items()]
    return out


# --- room to record a stop on a full disk ---------------------------------------------------
# Every start keeps RESERVE bytes in $SERVEDECK_HOME/.reserve. A stop that finds the disk full gives
# them up and records itself in that room (live record, launch.json, desired.json, journal), so that
# a model stopped on a full disk is not started again once there is space.
RESERVE = 1 << 20


def reserve_path() -> Path:
    return paths.home() / ".reserve"


def keep_reserve() -> None:
    """Make sure the reserve exists (a start calls this once it knows there is room)."""
    path = reserve_path()
    if path.exists():
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            os.posix_fallocate(fd, 0, RESERVE)
        finally:
            os.close(fd)
    except OSError:
        path.unlink(missing_ok=True)  # no room for it, or no fallocate: a stop then records what fits


def with_reserve(write: Callable[[], Any]) -> tuple[Any, str | None]:
    """`write()`; on a full disk the reserve is given up and it is tried once more. Second: a sentence
    saying the reserve was used (None when it was not needed). DiskFullError when even that fails."""
    try:
        return write(), None
    except DiskFullError as e:
        try:
            reserve_path().unlink()
        except FileNotFoundError:
            raise e from None
        return write(), (f"{e.message}: this stop was recorded in the room servedeck keeps for it "
                         f"({RESERVE >> 20} MiB); free space on that disk before the next start")


def drop_desired(model: str) -> str | None:
    """Take `model` out of desired state; what went wrong (desired.json unreadable, the disk full) as a
    sentence instead of an error: a stop goes on whatever desired.json holds."""
    try:
        _, note = with_reserve(lambda: set_desired(model, None))
        return note
    except StateError as e:
        return f"{model} could not be taken out of desired state: {e.message}"
    except OSError as e:
        return f"{model} could not be taken out of desired state: cannot write {paths.desired_file()}: {e.strerror or e}"
    return None


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


_LIVE_SHAPE = TypeAdapter(LiveRecord)  # pydantic checks each field's type against the dataclass


def parse_live(path: Path) -> LiveRecord:
    """The live record in `path`, its shape checked; ValueError saying what is wrong (FileNotFoundError
    when there is none). A record whose file cannot be trusted is never half-used."""
    try:
        doc = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise ValueError(f"not a JSON object ({_kind(doc)}): {json.dumps(doc)[:60]}")
    if doc.get("state", "starting") not in {s.value for s in LaunchState}:
        raise ValueError(f"state: {doc.get('state')!r} is not a launch state "
                         f"({', '.join(s.value for s in LaunchState)})")
    try:
        rec = LiveRecord.from_json(doc)
        return _LIVE_SHAPE.validate_python(asdict(rec))
    except ValidationError as e:
        raise ValueError(first_problem(e)) from None
    except (TypeError, KeyError, ValueError) as e:
        raise ValueError(str(e).replace("LiveRecord.__init__() ", "")) from None


def first_problem(e: ValidationError) -> str:
    """A pydantic error as one line: the key path, what was expected, what was found."""
    err = e.errors()[0]
    where = ".".join(str(p) for p in err["loc"]) or "the record"
    more = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
    return f"{where}: {err['msg']} (got {err.get('input')!r}){more}"


def _kind(v: Any) -> str:
    return {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}.get(
        type(v), "null" if v is None else type(v).__name__)


def read_live(model: str) -> LiveRecord | None:
    """The model's live record; None when there is none; StateError naming the file when it is unreadable."""
    path = live_path(model)
    try:
        return parse_live(path)
    except FileNotFoundError:
        return None
    except ValueError as e:
        raise StateError(f"{path}: live record is unreadable: {e}",
                         hint=f"`servedeck stop {model}` stops its engine (found by its launch folder) and sets "
                              "the file aside") from None


def stop_command(model: str) -> str:
    """The stop that reaches this model's record: by name, or `--all` for a file name no model could have."""
    return f"servedeck stop {model}" if paths.name_problem(model) is None else "servedeck stop --all"


def live_or_none(model: str) -> LiveRecord | None:
    """The model's live record, or None when there is none or it cannot be read (`unreadable_live` says
    why): for readers that only show or probe what runs."""
    try:
        return read_live(model)
    except StateError:
        return None


def _live_files() -> list[Path]:
    return sorted(paths.live_dir().glob("*.json"))


def all_live() -> dict[str, LiveRecord]:
    """Every readable live record, by model. An unreadable one is left out, never a crash: see
    `unreadable_live`, and deck/status.py's `live_records`, which finds its engine by its launch folder."""
    out = {}
    for f in _live_files():
        try:
            out[f.stem] = parse_live(f)
        except (FileNotFoundError, ValueError):
            continue
    return out


def unreadable_live() -> dict[str, str]:
    """The live records that cannot be read, by model: the file and what is wrong with it."""
    out = {}
    for f in _live_files():
        try:
            parse_live(f)
        except FileNotFoundError:
            continue
        except ValueError as e:
            out[f.stem] = f"{f}: {e}"
    return out


def set_aside(path: Path) -> Path | None:
    """Rename an unreadable state file to <name>.corrupt-<stamp> beside it (kept as evidence, out of
    every reader's way); None when there was nothing to move."""
    target = path.with_name(f"{path.name}.corrupt-{datetime.now().strftime('%Y%m%d-%H%M%S')}")
    try:
        os.replace(path, target)
    except FileNotFoundError:
        return None
    return target


def _aside_if_unreadable(path: Path) -> Path | None:
    try:
        parse_live(path)
    except FileNotFoundError:
        return None
    except ValueError:
        return set_aside(path)
    return None


def write_live(record: LiveRecord) -> Path | None:
    """Write the model's record; an unreadable one in its place is set aside first (returned)."""
    path = live_path(record.model)
    aside = _aside_if_unreadable(path)
    atomic_write_json(path, record.to_json())
    return aside


def clear_live(model: str) -> Path | None:
    """Remove the model's record (nothing is written: works on a full disk); an unreadable one is set
    aside instead (returned)."""
    path = live_path(model)
    aside = _aside_if_unreadable(path)
    if aside is None:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
    return aside


# --- the watch loop's view -----------------------------------------------------------------
# watch.json is written only by the watch loop (under its own lock) and read by `status`, so that
# `status` can say "stalled" or "gave up" without importing the loop.

def watch_file() -> Path:
    return paths.home() / "watch.json"


def read_watch() -> dict[str, Any]:
    """watch.json, its tables of the expected shape: per model an object, or left out. The loop rewrites
    it whole each time; a bad copy only hides advice, never state."""
    try:
        doc = json.loads(watch_file().read_text())
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return {}
    if not isinstance(doc, dict):
        return {}
    for part in ("models", "liveness"):
        table = doc.get(part)
        if part in doc:
            doc[part] = {k: v for k, v in table.items() if isinstance(v, dict)} if isinstance(table, dict) else {}
    return doc


def write_watch(doc: dict[str, Any]) -> None:
    atomic_write_json(watch_file(), doc)


# --- journal -----------------------------------------------------------------------------

def journal(event: str, model: str | None, outcome: str, **detail: Any) -> dict:
    rec = {"ts": now_iso(), "t": time.time(), "event": event, "model": model, "outcome": outcome, **detail}
    append_jsonl(paths.journal_file(), rec)
    return rec


def _journal_problem(row: dict) -> str | None:
    """What a journal row needs to be read (history, status): ts, event and outcome as strings, the model
    a string or null; None when it has them."""
    for key in ("ts", "event", "outcome"):
        if not isinstance(row.get(key), str):
            return f"{key}: expected a string, got {_kind(row.get(key)) if key in row else 'nothing'}"
    if row.get("model") is not None and not isinstance(row["model"], str):
        return f"model: expected a string or null, got {_kind(row['model'])}"
    return None


def read_journal(model: str | None = None) -> JsonlRows:
    """Journal rows, oldest first; `.skipped` counts lines that could not be read or lack what a row
    needs (`_journal_problem`), and `.first_error` says the first one."""
    return read_jsonl(paths.journal_file(), check=_journal_problem).keep(
        lambda r: model is None or r.get("model") == model)


# --- the lock ----------------------------------------------------------------------------

WATCH_TICK = "watch: reconcile"  # what a watch loop's routine pass holds the lock as (the door's loop too)
WATCH_TICK_PATIENCE_S = 5.0  # such a pass holds it for milliseconds: a caller waits through it, not told busy


def watch_tick_patience(holder: dict | None) -> float:
    """How long a caller waits, beyond its own --wait, for the lock's holder: through a watch loop's routine
    pass (a `servedeck sleep` beside `servedeck serve` was told busy by one, at random), or a holder that has
    taken the lock and not yet said who it is; not through a start, a switch or a relaunch, which take minutes
    and are said at once."""
    return WATCH_TICK_PATIENCE_S if holder is None or holder.get("what") == WATCH_TICK else 0.0


def deck_lock_says(what: str) -> None:
    """The deck lock's holder (this process) now does `what`: a caller told busy hears that, not the words the
    hold began with (a watch pass that relaunches a model holds the lock through the whole boot)."""
    say_holder(paths.lock_file(), what)


@contextmanager
def deck_lock(what: str, wait_s: float = 0.0, patient: bool = True) -> Iterator[None]:
    """One start/switch/stop/restore at a time per state dir. A second caller is told who holds it, after its
    `wait_s` and, while the holder is a watch loop's routine pass, up to WATCH_TICK_PATIENCE_S more (unless
    not `patient`: the loop itself, and `status`, look again later instead). A caller that waits reads the state
    it acts on under the lock, never before it: what it read may have changed while it waited."""
    lock_path = paths.lock_file()

    def busy(holder: dict | None) -> BusyError:
        who = (f"pid {holder['pid']} running `{holder.get('what')}` since {holder.get('since')}"
               if holder and "pid" in holder else "another servedeck process")
        return BusyError(f"the deck is busy: {who} holds {lock_path}",
                         hint="wait for it to finish (or pass --wait SECONDS); only one start/switch/stop runs at a time")

    with exclusive(lock_path, what, busy, wait_s, patience=watch_tick_patience if patient else None):
        yield
