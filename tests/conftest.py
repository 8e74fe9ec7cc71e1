"""Shared fixtures. Every test gets its own SERVEDECK_HOME (no test can touch real state), and no
engine a test started may outlive it: each test's live engines are stopped by process group after it,
and the session ends by checking that no engine started under a test home is still running."""

from __future__ import annotations

import os
from pathlib import Path

import psutil
import pytest

from servedeck.modelsfile import load
from servedeck.init import default_locations, render_starter

TEST_MARK = "SERVEDECK_TEST_RUN"
SESSION = str(os.getpid())  # engines inherit it; only this session's leftovers are this session's business


@pytest.fixture(autouse=True)
def servedeck_home(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("SERVEDECK_HOME", str(home))
    monkeypatch.setenv(TEST_MARK, SESSION)
    monkeypatch.delenv("SERVEDECK_CONFIG", raising=False)
    yield home
    stop_everything(home)


def stop_everything(home: Path) -> None:
    """Stop, by process group, every engine still recorded live under `home`."""
    from servedeck.supervisor.process import group_members, stop_group

    live = home / "live"
    if not live.exists():
        return
    import json

    for f in live.glob("*.json"):
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if group_members(rec["pgid"]):
            stop_group(rec["pgid"], 10)


# What tests start besides engines: the front door (`servedeck serve`) and the browser its page is tested in.
OTHER_KINDS = ("servedeck serve", "chromium")


def engine_processes_of_tests() -> list[psutil.Process]:
    """Engines, doors and browsers started by this session (found by the mark they inherit)."""
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if p.pid == os.getpid():
                continue
            env = p.environ()
        except (psutil.Error, OSError):
            continue
        cmd = " ".join(p.info["cmdline"] or [])
        if env.get(TEST_MARK) == SESSION and ("servedeck.supervisor.shim" in cmd or any(k in cmd for k in OTHER_KINDS)):
            out.append(p)
    return out


# Other processes the tests start as this session's descendants: the timing instrument
# (servedeck.testing.instrument) and the load generator's client processes (multiprocessing spawn).
DESCENDANT_KINDS = ("servedeck.testing.instrument", "multiprocessing.spawn import spawn_main")


def instruments_and_clients_left() -> list[psutil.Process]:
    out = []
    for p in psutil.Process(os.getpid()).children(recursive=True):
        try:
            cmd = " ".join(p.cmdline())
        except (psutil.Error, OSError):
            continue
        if any(k in cmd for k in DESCENDANT_KINDS):
            out.append(p)
    return out


@pytest.fixture(scope="session", autouse=True)
def no_orphans_at_end():
    yield
    left = engine_processes_of_tests()
    for p in left:
        try:
            os.killpg(p.pid, 9)
        except OSError:
            pass
    others = instruments_and_clients_left()
    for p in others:
        try:
            p.kill()
        except psutil.Error:
            pass
    assert not left, f"engines, doors or browsers left running by tests: {[p.info['cmdline'] for p in left]}"
    assert not others, f"instruments or client processes left running by tests: {[p.pid for p in others]}"


from ports import free_port  # noqa: E402  (below the kernel's ephemeral range: tests/ports.py says why)


@pytest.fixture(scope="session")
def engines_ready() -> dict[str, str]:
    """Paths of the real engines and models that scripts/setup.sh prepared; fail loudly when missing."""
    loc = default_locations()
    missing = [f"{k}={v}" for k, v in loc.items() if k != "cache" and not Path(v).exists()]
    if missing:
        pytest.fail("engines/models not prepared (run scripts/setup.sh): " + ", ".join(missing))
    return loc


@pytest.fixture
def deck_config(tmp_path, engines_ready):
    """The starter models.toml with free ports, written where a user would keep it."""
    text = render_starter()
    for old in ("8081", "8091", "8082"):
        text = text.replace(f"port = {old}", f"port = {free_port()}")
    path = tmp_path / "models.toml"
    path.write_text(text)
    return load(path)


@pytest.fixture
def llama_server(engines_ready):
    return engines_ready["llama_server"]
