"""Where a tune's Optuna study lives: `study.db` (SQLite) in the tune folder, the default, or a database the user
names with `servedeck tune FILE --storage URL` (any SQLAlchemy URL Optuna's RDB storage takes; PostgreSQL with the
`postgres` extra: `postgresql://USER@HOST:5432/DB`).

    tune.json   storage      "study.db", or the URL with its password hidden (never written in the clear)
                study_name   the study's name there: the tune's own in its folder's study.db; in a named database,
                             the tune folder's name, this host's and a random tag (`smol__1207-183458@gpu1.3f9a02c1`),
                             so two tunes of one file, two results folders on one host started in the same second,
                             or two hosts sharing a database, never continue each other's study

A password is best given outside the URL (PGPASSWORD, ~/.pgpass: libpq reads both), since a resume without
`--storage` connects to the recorded URL, which has none. A resume given `--storage` must name the database the
tune began in. Pure but for `connect` and `open_existing`, which reach the database.
"""

from __future__ import annotations

import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from servedeck.errors import RunError, UsageError

SQLITE = "study.db"  # the default: Optuna's SQLite file in the tune folder
EXTRA = {"postgresql": "pip install 'servedeck[postgres]' (psycopg, PostgreSQL's driver)"}


@dataclass(frozen=True)
class StudyAt:
    url: str  # what Optuna connects to
    shown: str  # what tune.json keeps and messages say: "study.db", or the URL without its password
    name: str  # the study's name in that storage

    @property
    def in_folder(self) -> bool:
        return self.shown == SQLITE


def hidden(url: str) -> str:
    """The URL as it may be written down and shown: its password, if any, replaced by ***."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def check(url: str) -> str:
    """A --storage URL checked before anything starts: it parses, its database kind is known and its driver is
    installed (UsageError naming what to do otherwise). Returns it as shown."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError

    try:
        u = make_url(url)
    except ArgumentError:
        raise UsageError(f"--storage: {url!r} is not a database URL",
                         hint="like --storage postgresql://USER@HOST:5432/DB (the password in PGPASSWORD or "
                              "~/.pgpass), or leave it out for study.db in the tune folder") from None
    try:
        u.get_dialect().import_dbapi()
    except NoSuchModuleError:
        raise UsageError(f"--storage: {u.drivername!r} is not a database kind SQLAlchemy knows",
                         hint="postgresql://…, mysql+pymysql://… or sqlite:///PATH") from None
    except ImportError as e:
        raise UsageError(f"--storage {hidden(url)}: its driver is not installed ({e})",
                         hint=EXTRA.get(u.get_backend_name(), f"install the Python driver for {u.drivername}")) from None
    return hidden(url)


def _in_folder(folder: Path, name: str) -> StudyAt:
    return StudyAt(f"sqlite:///{folder / SQLITE}", SQLITE, name)


def for_new(folder: Path, tune_name: str, given: Optional[str]) -> StudyAt:
    """Where a new tune's study goes: study.db in its folder, or the named database under a name of its own."""
    if not given:
        return _in_folder(folder, tune_name)
    return StudyAt(given, check(given), f"{folder.name}@{socket.gethostname()}.{uuid.uuid4().hex[:8]}")


def for_resume(folder: Path, doc: dict[str, Any], given: Optional[str]) -> StudyAt:
    """Where a resumed tune's study is: as tune.json recorded it (a folder from before `storage` was a URL: study.db
    and the tune's name). `given` (--storage) must name the same database; without it a recorded URL is used as it
    was written down, without its password (libpq's PGPASSWORD or ~/.pgpass gives one)."""
    from sqlalchemy.engine import make_url

    recorded = str(doc.get("storage") or SQLITE)
    name = str(doc.get("study_name") or doc.get("name"))
    if recorded == SQLITE:
        if given:
            raise UsageError(f"--storage: this tune's study is in its folder ({folder / SQLITE}), not {hidden(given)}",
                             hint="resume it without --storage")
        return _in_folder(folder, name)
    if given:
        if check(given) != recorded:
            raise UsageError(f"--storage: this tune's study is in {recorded}, not {hidden(given)}",
                             hint=f"resume with --storage naming {recorded} (the password may differ), or without "
                                  "--storage")
        return StudyAt(given, recorded, name)
    url = make_url(recorded)
    if url.password == "***":
        url = url.set(password=None)
    return StudyAt(url.render_as_string(hide_password=False), recorded, name)


def connect(optuna: Any, url: str) -> Any:
    """Optuna's storage at a URL, connected (its tables made where they are not): a database that cannot be reached
    is a RunError naming it and what to check, never a traceback. Done before a new tune makes its folder."""
    from sqlalchemy.exc import SQLAlchemyError

    if url.startswith("sqlite:///"):
        return url  # Optuna opens the file itself
    try:
        return optuna.storages.RDBStorage(url)
    except SQLAlchemyError as e:
        first = str(getattr(e, "orig", None) or e).strip().splitlines()[0]
        raise RunError(f"the tune's study storage {hidden(url)} cannot be reached: {first}",
                       hint="is the database server up, and do the URL's host, port, user and database exist? "
                            "A password comes from the URL given with --storage, PGPASSWORD or ~/.pgpass") from None


def open_existing(optuna: Any, at: StudyAt) -> Any:
    """The study for reading (`tune show`): None where study.db or the study is missing; RunError where a database
    cannot be reached."""
    if at.in_folder and not Path(at.url.removeprefix("sqlite:///")).exists():
        return None
    try:
        return optuna.load_study(study_name=at.name, storage=connect(optuna, at.url))
    except KeyError:  # no study of that name there
        return None
