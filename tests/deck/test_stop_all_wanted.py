"""Issue 31 item 13: `stop --all` means "want nothing": a model the watch loop gave up on (wanted, not
running) leaves desired state too, so no later `restore` or watch loop starts it again. On a real
llama-server that fails on every boot (a flag it does not know), as the watch loop's own give-up test."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from servedeck.deck import Deck
from servedeck.deck import state as S
from servedeck.deck.desired import settings_of
from servedeck.watch import Watcher

sys.path.insert(0, str(Path(__file__).parent.parent / "watch"))
from watchkit import edit, kinds, wait_for, with_host  # noqa: E402

SERVEDECK = str(Path(sys.executable).with_name("servedeck"))

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]


def test_stop_all_drops_a_given_up_model_from_desired_state(deck_config):
    cfg = with_host(deck_config, relaunch_tries=1, relaunch_spacing_s=0.2, liveness_interval_s=60.0)
    bad = edit(cfg, "args = { parallel = 4 }", "args = { parallel = 4, no-such-flag = true }")
    S.set_desired("smollm2", settings_of("smollm2", bad))  # what was launched: every relaunch fails at boot
    w = Watcher(cfg, interval_s=0.2)

    def gave_up() -> bool:
        w.tick()
        return "gave-up" in kinds()

    wait_for(gave_up, 60, step=0.3, what="the loop to give up")
    assert [(s.model, s.state) for s in Deck(cfg).status()] == [("smollm2", "gave-up")]

    r = subprocess.run([SERVEDECK, "--config", str(cfg.path), "stop", "--all"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "smollm2: not running; no longer wanted" in r.stdout, r.stdout
    assert S.read_desired()["models"] == {}
    rows = json.loads(subprocess.run([SERVEDECK, "--config", str(cfg.path), "status", "--json"], capture_output=True,
                                     text=True, timeout=60).stdout)
    assert rows == []
    assert any(j["event"] == "stop" and j["model"] == "smollm2" and j["outcome"] == "not-running"
               for j in S.read_journal())
