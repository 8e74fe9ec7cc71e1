"""One real llama-server (SmolLM2, 4 slots), booted once for the capacity tests and stopped by process
group; as the shared servers (tests/shared_servers.py), every test here sees the session home holding its live record
and its own results directory."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Iterator

import pytest

from servedeck.config import Config
from servedeck.deck import Deck
from servedeck.modelsfile import load
from servedeck.supervisor.process import group_members, stop_group
from ports import starter_toml
from shared_servers import uses_session_home

TEST_MARK = "SERVEDECK_TEST_RUN"
SESSION = str(os.getpid())


@pytest.fixture(scope="session")
def capacity_home(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("capacity-home")


@pytest.fixture(autouse=True)
def servedeck_home(capacity_home, tmp_path, monkeypatch) -> Iterator[Path]:
    yield from uses_session_home(capacity_home, tmp_path, monkeypatch)


def capacity_toml() -> str:
    """The starter models.toml with free ports and one slot per model (SmolLM2 on llama.cpp: 4 slots)."""
    text = starter_toml()
    n = iter(range(1, 10))
    return re.sub(r'slot = "main"', lambda m: f'slot = "s{next(n)}"', text)


@pytest.fixture(scope="session")
def capacity_config(tmp_path_factory, engines_ready) -> Config:
    path = tmp_path_factory.mktemp("capacity-config") / "models.toml"
    path.write_text(capacity_toml())
    return load(path)


@pytest.fixture(scope="session")
def llama(capacity_config, capacity_home) -> Iterator[dict]:
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVEDECK_HOME", str(capacity_home))
        mp.setenv(TEST_MARK, SESSION)
        rec = Deck(capacity_config).start("smollm2").record
        try:
            yield rec
        finally:
            try:
                Deck(capacity_config).stop(["smollm2"], grace_s=20)
            finally:
                if group_members(rec.pgid):
                    stop_group(rec.pgid, 5)
            assert not group_members(rec.pgid), "smollm2's process group outlived the session"
