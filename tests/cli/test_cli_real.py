"""Commands through the real CLI (the installed `servedeck` script, as a subprocess), on real llama.cpp
where the command needs an engine: init, unit (+ the foreground mode it runs), logs, history, restore,
watch + notices, soak. Issue 8 defects 9 and 12."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SERVEDECK = str(Path(sys.executable).with_name("servedeck"))


def sd(cfg_path: Path, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run([SERVEDECK, "--config", str(cfg_path), *args], capture_output=True, text=True,
                       timeout=timeout, cwd=cfg_path.parent)
    if check:
        assert r.returncode == 0, f"servedeck {' '.join(args)} → {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r


def status(cfg_path: Path) -> dict:
    return {row["model"]: row for row in json.loads(sd(cfg_path, "status", "--json").stdout)}


def wait_for(pred, timeout: float, what: str, every: float = 0.3):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(every)
    raise AssertionError(f"timed out waiting for {what}")


def kill_engine(cfg_path: Path, model: str) -> int:
    """Kill the engine itself (not its shim): the shim records the signal, as for a real crash."""
    rec = json.loads((Path(os.environ["SERVEDECK_HOME"]) / "live" / f"{model}.json").read_text())
    eng = json.loads((Path(rec["launch_dir"]) / "engine.json").read_text())["engine_pid"]
    os.kill(eng, signal.SIGKILL)
    return eng


def test_init_writes_once_and_refuses_to_overwrite(tmp_path):
    target = tmp_path / "models.toml"
    r = sd(target, "init")
    assert target.exists() and "wrote" in r.stdout and "[models.smollm2]" in target.read_text()
    r = sd(target, "init", check=False)
    assert r.returncode != 0 and "already exists" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.engine
def test_unit_verifies_and_runs_the_model_through_the_deck(deck_config, tmp_path):
    cfg = deck_config.path
    unit = sd(cfg, "unit", "smollm2").stdout
    exec_line = next(ln for ln in unit.splitlines() if ln.startswith("ExecStart="))
    argv = shlex.split(exec_line.removeprefix("ExecStart="))
    assert argv[-3:] == ["start", "smollm2", "--foreground"] and "KillMode=mixed" in unit
    assert f"SERVEDECK_HOME={os.environ['SERVEDECK_HOME']}" in unit and "Restart=on-failure" in unit
    path = tmp_path / "servedeck-smollm2.service"
    path.write_text(unit)
    if shutil.which("systemd-analyze"):
        v = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
        assert v.returncode == 0 and str(path) not in v.stderr, v.stderr  # no warning about our unit
    else:
        pytest.skip("systemd-analyze is not installed here: the unit could not be verified")  # pragma: no cover

    # What systemd would run: the deck records it, so status, logs and history see it.
    fg = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: status(cfg).get("smollm2", {}).get("state") == "ready", 120, "smollm2 ready")
        row = status(cfg)["smollm2"]
        assert row["desired"] is True and row["pid"]
        assert len(sd(cfg, "logs", "smollm2", "-n", "50").stdout.splitlines()) == 50  # the log is longer than that
        port = deck_config.models["smollm2"].port
        assert f"llama_server: listening on http://127.0.0.1:{port}" in sd(cfg, "logs", "smollm2", "-n", "1000").stdout
        fg.send_signal(signal.SIGTERM)  # systemctl stop
        assert fg.wait(60) == 0, fg.stderr.read()
        assert "smollm2" not in status(cfg)  # stopped through the deck, out of desired state
        hist = json.loads(sd(cfg, "history", "smollm2", "--json").stdout)
        assert [h["event"] for h in hist][-1] == "stop" and hist[-1]["outcome"] == "stopped"
        assert any(h["event"] == "start" and h["outcome"] == "spawned" for h in hist)

        # A crash: the foreground process leaves with the engine's code, so Restart=on-failure restarts it
        fg = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: status(cfg).get("smollm2", {}).get("state") == "ready", 120, "smollm2 ready again")
        kill_engine(cfg, "smollm2")
        assert fg.wait(60) == 128 + signal.SIGKILL
        hist = json.loads(sd(cfg, "history", "smollm2", "--json").stdout)
        assert hist[-1]["event"] == "crash" and hist[-1]["outcome"] == "crashed"
        table = sd(cfg, "history").stdout
        assert "crash" in table and "smollm2" in table
        past = sd(cfg, "logs", "smollm2", "--launch", "-1", "-n", "5", check=False)
        assert past.returncode == 0, past.stderr
    finally:
        if fg.poll() is None:
            fg.send_signal(signal.SIGTERM)
            fg.wait(60)
        sd(cfg, "stop", "--all", check=False)


@pytest.mark.engine
def test_restore_watch_and_notices(deck_config):
    cfg = deck_config.path
    sd(cfg, "start", "smollm2")
    try:
        first = status(cfg)["smollm2"]["pid"]
        # a reboot, as far as the deck can tell: the whole process group is gone, desired state remains
        rec = json.loads((Path(os.environ["SERVEDECK_HOME"]) / "live" / "smollm2.json").read_text())
        os.killpg(rec["pgid"], signal.SIGKILL)
        wait_for(lambda: status(cfg).get("smollm2", {}).get("state") != "ready", 30, "the kill to be seen")
        out = sd(cfg, "restore").stdout
        assert "smollm2" in out
        row = status(cfg)["smollm2"]
        assert row["state"] == "ready" and row["pid"] != first

        # the watch loop relaunches a wanted model that died, and says so in notices
        kill_engine(cfg, "smollm2")
        w = subprocess.Popen([SERVEDECK, "--config", str(cfg), "watch", "--interval", "1s", "--quiet"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            notes = wait_for(lambda: [n for n in json.loads(sd(cfg, "notices", "--json").stdout)
                                      if n["kind"].startswith("relaunch")], 120, "a relaunch notice")
        finally:
            w.send_signal(signal.SIGTERM)
            w.wait(60)
        assert notes[0]["model"] == "smollm2"
        text = sd(cfg, "notices", "--model", "smollm2", "--since", "1h").stdout
        assert "smollm2" in text and "relaunch" in text
        assert sd(cfg, "notices", "--model", "nothing-here").stdout.strip() == "no notices"
    finally:
        sd(cfg, "stop", "--all", check=False)


@pytest.mark.engine
def test_soak_for_a_few_seconds(deck_config, tmp_path, monkeypatch):
    cfg = deck_config.path
    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results"))
    # a few seconds, sized for a shared 2-core box where one short answer can take seconds
    try:
        r = sd(cfg, "soak", "smollm2", "--duration", "15s", "--concurrency", "1", "--burst-every", "0",
               "--sample-every", "5s", "--window", "5s", "--max-tokens", "4", "--json", timeout=300)
        summary = json.loads(r.stdout)
        assert summary["status"] == "ok", summary.get("reason")
        assert summary["counts"]["ok"] >= 1, summary["counts"]
        folder = Path(summary["path"])
        assert json.loads((folder / "summary.json").read_text())["started_engine"] is True
        assert status(cfg)["smollm2"]["state"] == "ready"  # a soak leaves the engine it started running
        listed = json.loads(sd(cfg, "runs", "--json").stdout)
        assert any(x["kind"] == "soak" for x in listed)
        notes = json.loads(sd(cfg, "notices", "--json").stdout)
        assert any(n["kind"] == "soak" and n["model"] == "smollm2" for n in notes)
    finally:
        sd(cfg, "stop", "--all", check=False)
