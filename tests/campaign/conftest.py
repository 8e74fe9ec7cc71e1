"""The campaign tests run on the session's shared real servers (tests/shared_servers.py: SmolLM2 on
llama.cpp and on vLLM's CPU build, booted once per session for every directory that uses them, and
stopped by process group).

The root conftest gives each test its own SERVEDECK_HOME and stops what that home started; the
shared servers live in one session home instead, so this directory overrides `servedeck_home`:
every test here sees the session home (where the shared servers' live records are) and its own
results directory.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from shared_servers import uses_session_home


@pytest.fixture(autouse=True)
def servedeck_home(campaign_home, tmp_path, monkeypatch) -> Iterator[Path]:
    yield from uses_session_home(campaign_home, tmp_path, monkeypatch)
