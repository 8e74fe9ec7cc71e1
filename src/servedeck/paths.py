"""Where servedeck keeps things. One variable, SERVEDECK_HOME, moves all state (tests point it at a temp dir)."""

from __future__ import annotations

import os
from pathlib import Path

import platformdirs


def home() -> Path:
    env = os.environ.get("SERVEDECK_HOME")
    path = Path(env).expanduser() if env else Path(platformdirs.user_state_dir("servedeck"))
    path.mkdir(parents=True, exist_ok=True)
    return path


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
    """Engine builds and prepared models (scripts/*.sh write here; keyed by version)."""
    env = os.environ.get("SERVEDECK_CACHE")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "servedeck"


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
    d = home() / "live"
    d.mkdir(parents=True, exist_ok=True)
    return d


def lock_file() -> Path:
    return home() / "deck.lock"


def results_dir(configured: str | None = None) -> Path:
    env = os.environ.get("SERVEDECK_RESULTS")
    if env:
        return Path(env).expanduser()
    if configured:
        return Path(configured).expanduser()
    return Path("results")
