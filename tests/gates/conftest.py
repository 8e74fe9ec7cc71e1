"""The gate tests run on the session's shared real servers (tests/shared_servers.py), the
very instances the campaign tests use: SmolLM2 on llama.cpp and on vLLM's CPU build, booted once per session."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from shared_servers import uses_session_home


@pytest.fixture(autouse=True)
def servedeck_home(campaign_home, tmp_path, monkeypatch) -> Iterator[Path]:
    yield from uses_session_home(campaign_home, tmp_path, monkeypatch)
