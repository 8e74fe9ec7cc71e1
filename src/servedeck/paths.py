"""Where servedeck keeps things. One variable, SERVEDECK_HOME, moves all state (tests point it at a temp dir)."""

from __future__ import annotations

import os
import re
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Iterator

import platformdirs

# A model's name becomes one path component: live/<name>.json, launches/<name>/, run folders
# <name>__<layout>__…, a campaign's cells <name>@<variant>. So it may hold only what is safe as one:
# no "/" (a repo id as a name lost its engine in a subfolder of live/), no ".." (a name of
# ../../tmp/x wrote outside $SERVEDECK_HOME), no leading "-" (it would read as an option), no "__"
# (it separates the parts of a run folder's name), and short enough for a file system's 255 bytes.
NAME_MAX = 128
NAME_RULE = (f"letters, digits and . _ - @ + = , : only, starting with a letter or digit, no '__', "
             f"at most {NAME_MAX} characters")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+=,:-]*")


def name_problem(name: str) -> str | None:
    """Why `name` cannot be a model's name (one path component under $SERVEDECK_HOME), or None."""
    if not isinstance(name, str) or not name:
        return "it is empty"
    if len(name) > NAME_MAX:
        return f"it is {len(name)} characters long"
    if _NAME.fullmatch(name) and "__" not in name:
        return None
    bad = sorted({c for c in name if not re.fullmatch(r"[A-Za-z0-9._@+=,:-]", c)})
    if bad:
        return "it contains " + ", ".join(repr(c) for c in bad)
    if "__" in name:
        return "it contains '__'"
    return f"it starts with {name[0]!r}"


def suggested_name(name: str) -> str:
    """A usable name for `name`: a repo id's last part (HuggingFaceTB/SmolLM2-135M → SmolLM2-135M),
    other characters replaced by '-'."""
    last = name.rstrip("/").rsplit("/", 1)[-1] if isinstance(name, str) else ""
    out = re.sub(r"_{2,}", "_", re.sub(r"[^A-Za-z0-9._@+=,:-]", "-", last)).lstrip(".-_@+=,:")[:NAME_MAX]
    return out or "model"


def component(name: str, what: str = "model") -> str:
    """`name`, checked to be one safe path component (see NAME_RULE); UsageError otherwise. Every place
    a model's name becomes a path goes through this, behind models.toml's own check at load."""
    problem = name_problem(name)
    if problem:
        from servedeck.errors import UsageError

        raise UsageError(f"{name!r} cannot be a {what} name: {problem} ({what} names become file names "
                         f"under $SERVEDECK_HOME: {NAME_RULE})",
                         hint=f"name it {suggested_name(name)!r}, keeping {name!r} as an alias if clients send it")
    return name


# Commands that promise to write nothing (`page`) run under reading_only(): the state folders are then named,
# never made, so a first `servedeck page` on a machine leaves no ~/.local/state/servedeck behind.
_reading_only: ContextVar[bool] = ContextVar("servedeck_reading_only", default=False)


@contextmanager
def reading_only() -> Iterator[None]:
    token = _reading_only.set(True)
    try:
        yield
    finally:
        _reading_only.reset(token)


def made(d: Path) -> Path:
    """`d`, created unless under reading_only() (where a folder that is not there is read as empty)."""
    if not _reading_only.get():
        d.mkdir(parents=True, exist_ok=True)
    return d


def home() -> Path:
    env = os.environ.get("SERVEDECK_HOME")
    return made(Path(env).expanduser() if env else Path(platformdirs.user_state_dir("servedeck")))


def config_file(explicit: str | os.PathLike | None = None) -> Path:
    """--config wins, then SERVEDECK_CONFIG, then ./models.toml if present, then $SERVEDECK_HOME/models.toml."""
    if explicit:
        return Path(explicit).expanduser()
    env = os.environ.get("SERVEDECK_CONFIG")
    if env:
        return Path(env).expanduser()
    local = Path("models.toml")
    if local.exists():
        return local
    return home() / "models.toml"


def cache_dir() -> Path:
    """Engine builds and prepared models (`servedeck install` and scripts/*.sh write here; keyed by version).
    The installer's rule, so the two never disagree: it runs with the standard library alone."""
    from servedeck.install import cache_dir as installer_cache

    return installer_cache()


def launches_dir() -> Path:
    return home() / "launches"


def desired_file() -> Path:
    return home() / "desired.json"


def journal_file() -> Path:
    return home() / "journal.jsonl"


def notices_file() -> Path:
    return home() / "notices.jsonl"


def live_dir() -> Path:
    """One record per model that servedeck believes is running (pid, pgid, launch folder)."""
    return made(home() / "live")


def lock_file() -> Path:
    return home() / "deck.lock"


def results_dir(configured: str | None = None) -> Path:
    env = os.environ.get("SERVEDECK_RESULTS")
    if env:
        return Path(env).expanduser()
    if configured:
        return Path(configured).expanduser()
    return Path("results")
