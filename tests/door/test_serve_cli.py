"""`servedeck serve` as a user runs it (a process of its own): api keys, the management endpoints on a
non-loopback bind, and one loop per state dir. No engine is started here."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from servedeck.init import render_starter
from doorkit import ServeProcess
from ports import free_port  # below the kernel's ephemeral range: tests/ports.py says why

KEY = "s3cret-door-key"


@pytest.fixture
def config(tmp_path) -> Path:
    p = tmp_path / "models.toml"
    p.write_text(render_starter())
    return p


def test_api_key_is_required_on_every_request(door_home, config):
    s = ServeProcess(door_home, config, env={"SERVEDECK_API_KEY": KEY})
    try:
        s.wait_up()
        url = f"http://127.0.0.1:{s.port}"
        for path in ("/v1/models", "/metrics", "/", "/door/status"):
            r = httpx.get(url + path)
            assert r.status_code == 401 and r.headers["WWW-Authenticate"] == "Bearer", path
            assert httpx.get(url + path, headers={"Authorization": "Bearer wrong-key-123"}).status_code == 401
            assert httpx.get(url + path, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200, path
        assert httpx.get(url + "/v1/models", headers={"x-api-key": KEY}).status_code == 200
        assert httpx.get(url + "/v1/models", params={"key": KEY}).status_code == 401  # query keys: the page only
        assert httpx.get(url + "/", params={"key": KEY}).status_code == 200
        r = httpx.post(url + "/v1/chat/completions", json={"model": "smollm2", "messages": []})
        assert r.status_code == 401 and "api key" in r.json()["error"]["message"]
        # one watch loop per state dir: a second door on the same home refuses, naming the holder
        second = subprocess.run([sys.executable, "-m", "servedeck", "serve", "--port", str(free_port())],
                                env=dict(os.environ, SERVEDECK_HOME=str(door_home), SERVEDECK_CONFIG=str(config)),
                                capture_output=True, text=True, timeout=60)
        assert second.returncode != 0 and "already watches" in second.stderr and "Traceback" not in second.stderr
    finally:
        code, err = s.stop()
    assert "Traceback" not in err, err


def test_no_watch_runs_the_door_alone_beside_another_watch_loop(door_home, config):
    """--no-watch: a door without the watch loop (relaunches, liveness probes), so it starts where another
    loop already watches the state dir, and serves."""
    s = ServeProcess(door_home, config)
    alone = ServeProcess(door_home, config, "--no-watch")
    try:
        s.wait_up()
        alone.wait_up()
        models = httpx.get(f"http://127.0.0.1:{alone.port}/v1/models").json()["data"]
        assert "smollm2" in {m["id"] for m in models}
    finally:
        alone_code, alone_err = alone.stop()
        code, err = s.stop()
    assert "Traceback" not in alone_err and "already watches" not in alone_err, alone_err
    assert "Traceback" not in err, err


def non_loopback_ip() -> str | None:
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outbound interface
            ip = s.getsockname()[0]
    except OSError:
        return None
    return None if ip.startswith("127.") else ip


def test_management_endpoints_stay_closed_to_the_network_without_a_key(tmp_path, config):
    ip = non_loopback_ip()
    if ip is None:
        pytest.skip("this machine has no non-loopback address to test from")
    home = tmp_path / "home2"
    home.mkdir()
    s = ServeProcess(home, config, "--host", "0.0.0.0")
    try:
        s.wait_up(ip)
        assert httpx.get(f"http://{ip}:{s.port}/v1/models").status_code == 200
        for path in ("/metrics", "/", "/events", "/door/status"):
            r = httpx.get(f"http://{ip}:{s.port}{path}")
            assert r.status_code == 403 and "management endpoint" in r.json()["error"]["message"], path
        assert httpx.get(f"http://127.0.0.1:{s.port}/metrics").status_code == 200
    finally:
        code, err = s.stop()
    assert "without an api key" in err


def test_a_client_that_stops_reading_pauses_the_engine_and_the_door_does_not_grow(tmp_path, config):
    """The door never holds a response in memory: a client that stops reading pauses the engine's
    socket (1 MiB unsent to the client at most), while the engine writes as fast as it can."""
    import json

    import psutil

    from servedeck.testing.instrument_process import InstrumentProcess

    home = tmp_path / "home3"
    home.mkdir()
    fast = InstrumentProcess("--ttft-ms", "0", "--itl-ms", "0", "--tokens", "10", "--tokens-per-chunk", "50")
    s = ServeProcess(home, config, "--upstream", f"fast={fast.url}")
    try:
        s.wait_up()
        door = psutil.Process(s.proc.pid)
        body = json.dumps({"model": "fast", "prompt": "x", "max_tokens": 50_000_000, "stream": True}).encode()
        with socket.socket() as c:
            c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            c.connect(("127.0.0.1", s.port))
            c.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: door\r\nX-Request-Id: slow-reader\r\n"
                      b"Content-Length: %d\r\n\r\n" % len(body) + body)
            first = b""
            while first.count(b"data: ") < 8:  # the head may come alone: read a few events for their size
                got = c.recv(65536)
                assert got, first[:300]
                first += got
            assert first.startswith(b"HTTP/1.1 200 "), first[:200]
            rss0 = door.memory_info().rss
            time.sleep(4)  # not reading
            rss1 = door.memory_info().rss
            chunks = len(fast.records()["slow-reader"]["chunk_t"])
        per_event = len(first.partition(b"\r\n\r\n")[2]) / max(1, first.count(b"data: "))
        sent_mb = chunks * per_event / 1e6  # what the instrument wrote (it does not wait for its reader)
        assert sent_mb > 32, f"the engine side wrote only ~{sent_mb:.0f} MB: nothing to hold back"
        assert rss1 - rss0 < 16e6, f"the door grew {(rss1 - rss0) / 1e6:.0f} MB while the engine wrote ~{sent_mb:.0f} MB"
    finally:
        code, err = s.stop()
        fast.stop()
    assert "Traceback" not in err, err


def serve_in_thread(cfg, opts, on_ready) -> tuple[threading.Event, threading.Thread, list[BaseException]]:
    """`serve()` in a thread of this test's process (as tests/door/doorkit.py's DoorThread does)."""
    from servedeck.door.serve import serve

    stop, errors = threading.Event(), []

    def run() -> None:
        try:
            serve(cfg, opts, on_ready=on_ready, stop=stop)
        except BaseException as e:
            errors.append(e)

    t = threading.Thread(target=run, name="door", daemon=True)
    t.start()
    return stop, t, errors


def test_the_door_runs_on_the_event_loop_servedeck_loop_names(config, monkeypatch):
    from servedeck.door import ServeOptions
    from servedeck.loadgen.loop import current
    from servedeck.modelsfile import load

    monkeypatch.setenv("SERVEDECK_LOOP", "asyncio")  # uvloop is installed here: the door would pick it
    seen: list[str] = []
    up = threading.Event()
    stop, t, errors = serve_in_thread(load(config), ServeOptions(port=0, watch=False),
                                      lambda port: (seen.append(current()), up.set()))
    try:
        assert up.wait(60), errors
    finally:
        stop.set()
        t.join(60)
    assert seen == ["asyncio"]


def test_a_bad_servedeck_loop_is_refused_naming_it(door_home, config):
    env = dict(os.environ, SERVEDECK_HOME=str(door_home), SERVEDECK_CONFIG=str(config), SERVEDECK_LOOP="uv-loop")
    try:
        r = subprocess.run([sys.executable, "-m", "servedeck", "serve", "--port", str(free_port())], env=env,
                           capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        raise AssertionError("serve ran on with SERVEDECK_LOOP=uv-loop instead of refusing it") from None
    assert r.returncode == 2, r.stderr  # a user's mistake: UsageError
    assert "SERVEDECK_LOOP='uv-loop'" in r.stderr
    assert "Traceback" not in r.stderr


def servedeck_watch(home: Path, config: Path) -> int | str:
    """`servedeck watch` run in a process of its own on `home`: its exit code, or "ran" when it took
    the state dir and was still watching 30 s later (then it is stopped)."""
    p = subprocess.Popen([sys.executable, "-m", "servedeck", "watch", "--quiet"], stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, start_new_session=True,
                         env=dict(os.environ, SERVEDECK_HOME=str(home), SERVEDECK_CONFIG=str(config)))
    try:
        return p.wait(30)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(30)
        return "ran"


def test_while_serve_runs_servedeck_watch_in_another_process_is_refused(tmp_path, config):
    home = tmp_path / "home4"
    home.mkdir()
    s = ServeProcess(home, config)
    try:
        s.wait_up()
        assert servedeck_watch(home, config) == 4  # BusyError: one loop per state dir
    finally:
        s.stop()


def test_serve_holds_the_watch_lock_from_its_check_until_its_loop_runs(door_home, config, monkeypatch):
    """No window: another `servedeck watch` tried between serve's check and its loop's start (here:
    while serve builds its door, before the loop's thread starts) is refused too."""
    import importlib

    from servedeck.door import ServeOptions
    from servedeck.modelsfile import load

    door_serve = importlib.import_module("servedeck.door.serve")  # the module: servedeck.door.serve is also a function
    tried: list[int | str] = []
    real_build_door = door_serve.build_door

    def build_door_after_a_rival(*args, **kw):
        tried.append(servedeck_watch(door_home, config))
        return real_build_door(*args, **kw)

    monkeypatch.setattr(door_serve, "build_door", build_door_after_a_rival)
    up = threading.Event()
    stop, t, errors = serve_in_thread(load(config), ServeOptions(port=0, watch_interval_s=0.2),
                                      lambda port: up.set())
    try:
        assert up.wait(90), errors
    finally:
        stop.set()
        t.join(60)
    assert tried == [4]


def test_api_key_file_gives_the_key_and_it_stays_out_of_ps(tmp_path, config):
    import psutil

    home = tmp_path / "home5"
    home.mkdir()
    key_file = tmp_path / "door.key"
    key_file.write_text(f"{KEY}\n")
    key_file.chmod(0o600)
    s = ServeProcess(home, config, "--api-key-file", str(key_file))
    try:
        s.wait_up()
        url = f"http://127.0.0.1:{s.port}/v1/models"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        argv = psutil.Process(s.proc.pid).cmdline()
        assert str(key_file) in argv and not any(KEY in a for a in argv), argv
    finally:
        code, err = s.stop()
    assert "Traceback" not in err and "visible" not in err, err


@pytest.mark.parametrize("case", ["missing", "a-directory", "empty", "not-utf8"])
def test_an_api_key_file_that_cannot_give_a_key_is_refused_naming_it(tmp_path, config, case):
    path = tmp_path / f"key-{case}"
    if case == "a-directory":
        path.mkdir()
    elif case == "empty":
        path.write_text("\n  \n")
    elif case == "not-utf8":
        path.write_bytes(b"\xff\xfe key")
    env = dict(os.environ, SERVEDECK_HOME=str(tmp_path), SERVEDECK_CONFIG=str(config))
    env.pop("SERVEDECK_API_KEY", None)
    r = subprocess.run([sys.executable, "-m", "servedeck", "serve", "--port", str(free_port()),
                        "--api-key-file", str(path)], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)  # a user's mistake: UsageError
    assert str(path) in r.stderr and "Traceback" not in r.stderr, r.stderr
    assert {"missing": "no such file", "a-directory": "is a directory", "empty": "no key",
            "not-utf8": "UTF-8"}[case] in r.stderr, r.stderr


def test_api_key_on_the_command_line_warns_that_ps_shows_it(tmp_path, config):
    home = tmp_path / "home6"
    home.mkdir()
    s = ServeProcess(home, config, "--api-key", KEY)
    try:
        s.wait_up()
    finally:
        code, err = s.stop()
    assert "--api-key-file" in err and "ps" in err, err


def test_body_budget_mib_overrides_the_models_toml_key(tmp_path, config):
    """--body-budget-mib takes the place of [host] body_budget_mib (issue 48 item 4); /door/status says
    which budget the door holds to and where it came from."""
    config.write_text(config.read_text().replace("[host]\n", "[host]\nbody_budget_mib = 64\n", 1))
    home = tmp_path / "home-budget"
    home.mkdir()
    for args, want, said in (((), 64, "[host] body_budget_mib"), (("--body-budget-mib", "16"), 16, "--body-budget-mib")):
        s = ServeProcess(home, config, *args)
        try:
            s.wait_up()
            got = httpx.get(f"http://127.0.0.1:{s.port}/door/status", timeout=30).json()["bodies"]
        finally:
            code, err = s.stop()
        assert got["budget_mib"] == want and got["from"] == said and got["held_mib"] == 0, (args, got)
        assert "Traceback" not in err, err


@pytest.mark.parametrize("value", ["0", "-5", "nan", "inf", "lots", "1e400"])
def test_a_bad_body_budget_is_refused_naming_the_flag_value_and_what_is_expected(tmp_path, config, value):
    env = dict(os.environ, SERVEDECK_HOME=str(tmp_path), SERVEDECK_CONFIG=str(config))
    env.pop("SERVEDECK_API_KEY", None)
    r = subprocess.run([sys.executable, "-m", "servedeck", "serve", "--port", str(free_port()),
                        f"--body-budget-mib={value}"], env=env, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.returncode, r.stderr)  # a user's mistake, said before the door listens
    err = " ".join(r.stderr.split())  # rich and click wrap long lines
    assert "--body-budget-mib" in err and value in err and "Traceback" not in err, err
    assert "expected a number of MiB greater than 0" in err, err
