"""Issue 36 item 7: a full $SERVEDECK_HOME. `start` with 40 KB free launched llama-server, crashed writing
boot.json and left it running; `start` and `stop --all` printed tracebacks until space was freed, so
that engine could not be stopped; the door's watch loop failed to write its lock file and the door
exited. Now a full disk is an error naming the path and the free space, `stop` always stops (nothing it
writes is needed first), and the door keeps serving what runs, saying the state cannot be written.

$SERVEDECK_HOME is a 96 MiB tmpfs of the test's own (tests/fulldisk.py), filled with one file. Real
llama-server, through the real CLI."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from servedeck import paths
from servedeck.supervisor.process import find_shim, group_members, port_holder, stop_group

sys.path.insert(0, str(Path(__file__).parent.parent))
from fulldisk import small_disk  # noqa: E402
from ports import free_port  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent.parent / "watch"))
from watchkit import kinds, wait_for  # noqa: E402

SERVEDECK = str(Path(sys.executable).with_name("servedeck"))

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]


def sd(cfg: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    r = subprocess.run([SERVEDECK, "--config", str(cfg), *args], capture_output=True, text=True, timeout=timeout)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def _stop_what_runs(home: Path) -> None:
    """Before the tmpfs goes: stop every engine whose launch folder is on it, by its shim's group."""
    for d in (home / "launches").glob("*/*") if (home / "launches").exists() else ():
        shim = find_shim(d)
        if shim is not None:
            stop_group(shim.pgid, 10, leader_create_time=shim.create_time)


@pytest.fixture
def full_home(servedeck_home):
    with small_disk(servedeck_home, mib=96, before_unmount=lambda: _stop_what_runs(servedeck_home)) as disk:
        yield disk


def _evidence() -> str:
    """What a failure needs to be read: the launches' exit records and the journal's tail."""
    out = [f"{d}: {(d / 'exit.json').read_text() if (d / 'exit.json').exists() else 'no exit.json'}"
           for d in paths.launches_dir().glob("*/*")] if paths.launches_dir().exists() else []
    journal = paths.journal_file()
    return "\n".join(out + ([journal.read_text()[-2000:]] if journal.exists() else []))


def _nothing_serves(cfg_path: Path, port: int) -> None:
    assert port_holder(port) is None, port_holder(port)
    assert not any(find_shim(d) for d in paths.launches_dir().glob("*/*")) if paths.launches_dir().exists() else True


def test_start_with_40kb_free_is_refused_naming_the_path_and_the_free_space(deck_config, full_home):
    full_home.fill(leave=40_000)
    r = sd(deck_config.path, "start", "smollm2")
    assert r.returncode == 3, (r.stdout, r.stderr)
    assert "error:" in r.stderr and "hint:" in r.stderr, r.stderr
    assert str(paths.home()) in r.stderr and "KiB free" in r.stderr and "min_free_mib" in r.stderr, r.stderr
    _nothing_serves(deck_config.path, deck_config.models["smollm2"].port)


def test_a_disk_that_fills_during_the_start_leaves_no_engine_running(deck_config, full_home):
    """Room enough to begin; the disk fills once the engine is spawned (its engine.json is written)."""
    filled = threading.Event()

    def fill_when_spawned() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if list(paths.launches_dir().glob("smollm2/*/engine.json")):
                full_home.fill()
                filled.set()
                return
            time.sleep(0.01)

    t = threading.Thread(target=fill_when_spawned, daemon=True)
    t.start()
    r = sd(deck_config.path, "start", "smollm2")
    t.join(5)
    assert filled.is_set()
    assert r.returncode != 0, (r.stdout, r.stderr)
    assert "error:" in r.stderr and "No space left on device" in r.stderr, r.stderr
    _nothing_serves(deck_config.path, deck_config.models["smollm2"].port)
    full_home.free_space()
    st = sd(deck_config.path, "status", "--json")
    assert st.returncode == 0 and [x for x in json.loads(st.stdout) if x["state"] in ("ready", "starting")] == []


def test_stop_all_stops_the_engine_on_a_full_disk(deck_config, full_home):
    r = sd(deck_config.path, "start", "smollm2")
    assert r.returncode == 0, r.stderr
    rec = json.loads((paths.live_dir() / "smollm2.json").read_text())
    full_home.fill()
    st = sd(deck_config.path, "status", "--json")  # a query on a full disk: still answers
    assert st.returncode == 0 and [x["state"] for x in json.loads(st.stdout)] == ["ready"], st.stderr
    again = sd(deck_config.path, "start", "smollm2")  # already running: said, no traceback
    assert again.returncode == 0 and "already running" in again.stdout, (again.stderr, _evidence())
    stop = sd(deck_config.path, "stop", "--all")
    assert stop.returncode == 0, (stop.stdout, stop.stderr)
    assert "smollm2: stopped" in stop.stdout, stop.stdout
    assert "No space left on device" in stop.stderr and "room servedeck keeps" in stop.stderr, stop.stderr
    assert not group_members(rec["pgid"]) and port_holder(rec["port"]) is None
    assert not (paths.live_dir() / "smollm2.json").exists()
    # recorded in the reserve: no longer wanted, so nothing starts it again once there is room
    full_home.free_space()
    assert json.loads(paths.desired_file().read_text())["models"] == {}
    st = sd(deck_config.path, "status", "--json")
    assert st.returncode == 0 and json.loads(st.stdout) == [], st.stdout
    hist = json.loads(sd(deck_config.path, "history", "smollm2", "--json").stdout)
    assert hist[-1]["event"] == "stop" and hist[-1]["outcome"] == "stopped"


def test_the_door_keeps_serving_what_runs_and_says_the_state_cannot_be_written(deck_config, full_home, tmp_path):
    port = free_port()
    err = open(tmp_path / "door.err", "w+")
    door = subprocess.Popen([SERVEDECK, "--config", str(deck_config.path), "serve", "--port", str(port),
                             "--watch-interval", "0.5s"], stdout=subprocess.DEVNULL, stderr=err,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        ask = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 4}
        first = httpx.post(url + "/v1/chat/completions", json=ask, timeout=300)  # starts it on demand
        assert first.status_code == 200, first.text
        full_home.fill()
        # a watch tick (each takes the deck lock and saves watch.json) has met the full disk and said so
        wait_for(lambda: "the state cannot be written" in (tmp_path / "door.err").read_text() or door.poll() is not None,
                 60, what="the door's watch loop to say the state cannot be written")
        assert door.poll() is None, (tmp_path / "door.err").read_text()
        again = httpx.post(url + "/v1/chat/completions", json=ask, timeout=120)
        assert again.status_code == 200, again.text
        said = (tmp_path / "door.err").read_text()
        assert "the state cannot be written" in said and "No space left on device" in said, said[-3000:]
        assert "Traceback" not in said, said[-3000:]
        stop = sd(deck_config.path, "stop", "--all")
        assert stop.returncode == 0 and "smollm2: stopped" in stop.stdout, (stop.stdout, stop.stderr)
        full_home.free_space()
        # the loop ticked on through the full disk and says it can write again
        wait_for(lambda: door.poll() is not None or "recovered" in kinds(), 60, what="the watch loop's 'recovered' notice")
        assert door.poll() is None, (tmp_path / "door.err").read_text()
    finally:
        if door.poll() is None:
            os.killpg(door.pid, signal.SIGTERM)
            try:
                door.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(door.pid, signal.SIGKILL)
                door.wait(10)
        err.close()
