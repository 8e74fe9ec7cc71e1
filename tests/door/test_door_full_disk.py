"""Issue 48 item 3 on real llama-server engines: a switch the deck would refuse is refused before the
holder is stopped. Before the fix, on a state disk below min_free_mib, a request for gemma stopped the
running smollm2 first and then refused to start gemma (503, "1016 KiB free"); smollm2 got 503 after that,
and nothing ran until space was freed. Now gemma's request gets 503 saying why, smollm2 keeps running
and answering, and once there is room the switch goes through.

$SERVEDECK_HOME is a 96 MiB tmpfs of the module's own (tests/fulldisk.py), filled with one file."""

from __future__ import annotations

import sys
from pathlib import Path

import httpx
import pytest

from doorkit import DoorThread, door_config, stop_everything
from servedeck.door import ServeOptions
from servedeck.modelsfile import load

sys.path.insert(0, str(Path(__file__).parent.parent))
from fulldisk import small_disk  # noqa: E402

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

CHAT = [{"role": "user", "content": "Say hello."}]
DISK: list = []  # the module's small disk


@pytest.fixture(scope="module")
def door_home(tmp_path_factory):
    """The module's home on a small disk of its own (overrides tests/door/conftest.py's)."""
    from doorkit import SESSION, TEST_MARK

    home = tmp_path_factory.mktemp("door-full") / "home"
    mp = pytest.MonkeyPatch()
    mp.setenv("SERVEDECK_HOME", str(home))
    mp.setenv(TEST_MARK, SESSION)
    mp.delenv("SERVEDECK_CONFIG", raising=False)
    with small_disk(home, mib=96, before_unmount=lambda: stop_everything(home)) as disk:
        DISK.append(disk)
        yield home
    mp.undo()


@pytest.fixture(scope="module")
def door(door_home, engines_ready, tmp_path_factory):
    cfg = load(door_config(tmp_path_factory.mktemp("door-cfg"), engines_ready))
    d = DoorThread(cfg, ServeOptions(port=0, watch_interval_s=1.0))
    d.client = httpx.Client(base_url=d.url, timeout=600)  # a boot on a loaded 2-core box took over 180 s
    yield d
    d.client.close()
    d.close()
    stop_everything(door_home)


def chat(door, model: str) -> httpx.Response:
    return door.client.post("/v1/chat/completions", json={"model": model, "messages": CHAT, "max_tokens": 2})


def state(door, model: str) -> str:
    return next(m["state"] for m in door.client.get("/door/status").json()["models"] if m["model"] == model)


def test_a_switch_refused_for_disk_space_leaves_the_holder_running(door):
    assert chat(door, "smol").status_code == 200  # smollm2 holds slot main
    DISK[0].fill(leave=1_000_000)  # under min_free_mib (64 MiB)
    try:
        r = chat(door, "gemma")
        print(r.status_code, r.text)
        assert r.status_code == 503 and "Retry-After" in r.headers, r.text
        assert state(door, "smollm2") == "ready"  # before the fix: stopped, by the switch that was then refused
        msg = r.json()["error"]["message"]
        assert "min_free_mib" in msg and "smollm2 left running" in msg, msg
        r = chat(door, "smol")  # the holder still answers
        assert r.status_code == 200, r.text
    finally:
        DISK[0].free_space()


def test_with_room_again_the_switch_goes_through(door):
    import time

    deadline = time.monotonic() + 30  # gemma's refusal stands for REFUSED_RETRY_S (10 s)
    while (r := chat(door, "gemma")).status_code == 503 and time.monotonic() < deadline:
        time.sleep(1)
    assert r.status_code == 200, r.text
    assert state(door, "smollm2") == "stopped"
