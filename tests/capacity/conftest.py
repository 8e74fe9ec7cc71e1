"""One real llama-server (SmolLM2, 4 slots), booted once for the capacity tests and stopped by process
group; as the shared servers (tests/shared_servers.py), every test here sees the session home holding its live record
and its own results directory."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Iterator

import pytest

from servedeck.config import Config
from servedeck.modelsfile import load
from ports import starter_toml
from shared_servers import shared_server, uses_session_home


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
    """SmolLM2 on llama.cpp, 4 slots, started and stopped as the shared servers are."""
    yield from shared_server(capacity_config, capacity_home, "smollm2")
