"""Not collected by the suite (its name does not start with `test_`): tests/campaign/test_orphan_guard.py
runs it as a pytest session of its own, to show that the session guard in tests/conftest.py sees what
campaign tests leave behind. Two real llama.cpp engines are left running on purpose:

- `victim`, started by a session-scoped fixture in the style of the shared servers
  (tests/shared_servers.py's `shared_server`), which never stops it and sets no mark of its own;
- `gemma`, started by a `servedeck start` CLI subprocess inside a test, as test_cli and test_failures run
  the CLI.

ORPHAN_CASE_PIDS names a file where both launches' shim and engine pids are written, so the outer test
can check that the guard named and stopped each one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servedeck.deck import Deck
from servedeck.deck import state as S


def _note(name: str, rec) -> None:
    path = Path(os.environ["ORPHAN_CASE_PIDS"])
    seen = json.loads(path.read_text()) if path.exists() else {}
    seen[name] = {"shim": rec.pid, "engine": rec.engine_pid}
    path.write_text(json.dumps(seen))


@pytest.fixture(scope="session")
def left_running(campaign_config, campaign_home):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVEDECK_HOME", str(campaign_home))
        rec = Deck(campaign_config).start("victim").record
    _note("victim", rec)
    yield rec  # and no stop: this is the leftover


def test_a_fixture_leaves_its_engine_and_a_cli_subprocess_leaves_another(campaign_config, left_running):
    r = subprocess.run([sys.executable, "-m", "servedeck", "--config", str(campaign_config.path), "start", "gemma"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    rec = S.read_live("gemma")
    assert rec is not None
    _note("gemma", rec)
