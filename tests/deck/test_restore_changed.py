"""Issue 31 item 12: `restore` after models.toml changed. desired.json keeps the settings a model was
launched with and restore replays them (seed 004: "a wrong first launch repeats itself until
corrected"); it used to do so silently. Now it says which keys differ, with both values, which one it
started, and `restore --from-config` starts models.toml's instead. On a real llama-server: the boot log's
per-slot context tells which settings really ran."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servedeck.deck import Deck
from servedeck.deck import state as S
from servedeck.deck.desired import settings_of
from servedeck.modelsfile import parse
from servedeck.supervisor.process import group_members

SERVEDECK = str(Path(sys.executable).with_name("servedeck"))


def _reboot(rec) -> None:
    """The engine gone without a stop: desired state still says it should run."""
    os.killpg(rec.pgid, signal.SIGKILL)
    while group_members(rec.pgid):
        time.sleep(0.05)


def _restore(cfg_path: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([SERVEDECK, "--config", str(cfg_path), "restore", *extra], capture_output=True, text=True,
                          timeout=300)


def _ctx_per_slot() -> int:
    [rec] = S.all_live().values()
    return json.loads((Path(rec.launch_dir) / "boot.json").read_text())["ctx_per_slot"]


def test_the_difference_is_pure_and_names_each_key(deck_config):
    from servedeck.deck.desired import settings_diff

    before = settings_of("smollm2", deck_config)
    text = deck_config.path.read_text().replace("context = 8192\nargs = { parallel = 4 }",
                                                "context = 2048\nargs = { parallel = 2 }", 1)
    after = parse(text, deck_config.path)
    diff = settings_diff("smollm2", before, after)
    assert {(d["key"], json.dumps(d["desired"]), json.dumps(d["config"])) for d in diff} == {
        ("context", "8192", "2048"), ("args.parallel", "4", "2")}
    assert settings_diff("smollm2", before, deck_config) == []
    assert settings_diff("smollm2", before, None) == []  # no models.toml to compare with


@pytest.mark.engine
@pytest.mark.llamacpp
def test_restore_says_what_differs_and_the_user_chooses(deck_config):
    rec = Deck(deck_config).start("smollm2").record
    assert _ctx_per_slot() == 8192
    _reboot(rec)
    text = deck_config.path.read_text().replace("context = 8192\nargs = { parallel = 4 }",
                                                "context = 2048\nargs = { parallel = 4 }", 1)
    deck_config.path.write_text(text)

    r = _restore(deck_config.path)
    assert r.returncode == 0, r.stderr
    out = r.stdout + r.stderr
    assert "models.toml differs from the settings smollm2 was launched with" in out, out
    assert "context: 8192 in desired.json, 2048 in models.toml" in out, out
    assert "smollm2: started with desired.json's settings" in out and "restore --from-config" in out, out
    assert _ctx_per_slot() == 8192  # what desired.json says: the launch as it was

    [rec] = S.all_live().values()
    _reboot(rec)
    r = _restore(deck_config.path, "--from-config")
    assert r.returncode == 0, r.stderr
    assert "smollm2: started with models.toml's settings" in r.stdout, r.stdout
    assert _ctx_per_slot() == 2048  # models.toml's, now also what desired.json keeps
    assert S.read_desired()["models"]["smollm2"]["model"]["context"] == 2048
    rows = json.loads(_restore(deck_config.path, "--json").stdout)
    assert [(x["model"], x["outcome"], x["differs"]) for x in rows] == [("smollm2", "adopted", [])]
    subprocess.run([SERVEDECK, "--config", str(deck_config.path), "stop", "--all"], timeout=120, check=True)
