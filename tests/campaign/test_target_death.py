"""A run notices its engine's death from a failed request (workloads/points.py's _Watch asks Target.death).
The engine can be gone while its shim still lives, for the moment the shim takes to reap it and write
exit.json: a request failing then must still be told a death, not "requests failed" (CI once saw a SIGKILLed
llama-server's bench end as a run with failed requests and exit 0). Real processes stand for the shim and the
engine; no engine is needed to decide this."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import psutil

from servedeck.deck.records import LiveRecord
from servedeck.supervisor import ready as R
from servedeck.workloads.target import Target


def _target(tmp_path, shim: subprocess.Popen, engine_pid: int) -> Target:
    rec = LiveRecord(model="m", engine="llamacpp", build="b", slot="main", port=1, launch_dir=str(tmp_path),
                     pid=shim.pid, pgid=shim.pid, create_time=psutil.Process(shim.pid).create_time(),
                     owner_pid=0, engine_pid=engine_pid)
    return Target(name="m", cfg=None, record=rec, launched=False)  # type: ignore[arg-type]


def test_an_engine_gone_while_its_shim_lives_is_a_death_said_as_the_shim_records_it(tmp_path):
    shim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    engine = subprocess.Popen([sys.executable, "-c", "pass"])
    engine.wait()
    try:
        writer = threading.Timer(0.3, lambda: (tmp_path / "exit.json").write_text(
            json.dumps({"returncode": -9, "signal": "SIGKILL"})))
        writer.start()
        why = _target(tmp_path, shim, engine.pid).death()
        writer.join()
        assert why is not None and "died" in why and "SIGKILL" in why, why
    finally:
        shim.kill()
        shim.wait()


def test_a_live_engine_under_a_live_shim_is_no_death(tmp_path):
    shim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        assert _target(tmp_path, shim, engine.pid).death() is None
    finally:
        for p in (shim, engine):
            p.kill()
            p.wait()


def test_an_engine_gone_and_no_exit_record_says_its_pid_is_gone(tmp_path, monkeypatch):
    shim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    engine = subprocess.Popen([sys.executable, "-c", "pass"])
    engine.wait()
    try:
        t = _target(tmp_path, shim, engine.pid)
        monkeypatch.setattr(R, "wait_exit", lambda launch_dir, timeout_s: None)  # no 5 s wait in a test
        why = t.death()
        assert why == f"the llamacpp server died: its process (pid {engine.pid}) is gone", why
    finally:
        shim.kill()
        shim.wait()
