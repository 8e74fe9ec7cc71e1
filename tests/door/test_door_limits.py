"""The door under hostile clients (issue 36, items 1-5): a client that pipelines and never reads, one
huge header, `Upgrade: h2c`, a body nested 100,000 deep, and the api key kept from every process the
door starts. One `servedeck serve` process for the module (its memory is what is measured, with
psutil), in front of real llama-servers, with a key from SERVEDECK_API_KEY as a user would set it.

The bounds were chosen before measuring, from what the door may hold by design (door/front.py's
limits; docs/door.md, "Limits"); each test says why its figure is what it is. The detailed figures
are `bench/door_limits.py`'s."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import httptools
import httpx
import psutil
import pytest

from doorkit import ServeProcess, door_config, stop_everything
from servedeck.testing.hostile import Bystander, huge_header, pipeline

KEY = "s3cret-limits-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
MODELS_REQ = b"GET /v1/models HTTP/1.1\r\nHost: door\r\nAuthorization: Bearer %s\r\n\r\n" % KEY.encode()
MODELS_REQ_NO_KEY = b"GET /v1/models HTTP/1.1\r\nHost: door\r\n\r\n"  # every answer a 401

# What one connection may make the door hold, by design: under WRITE_HIGH (1 MiB) of answers the client
# has not taken, MAX_QUEUED (8) requests and MAX_AHEAD_BODY (1 MiB) of their bodies read ahead, one
# read (256 KiB) not yet parsed. 16 MiB is that with room for what Python's allocator keeps of the
# answers made and freed meanwhile; before the bound the door grew ~40 bytes per byte sent (issue 36:
# 24 MiB sent, +995 MiB).
GROWTH_BOUND = 16 * 2**20
# Another client's GET /v1/models takes ~2 ms here, median, at load average 10-15 on 2 cores too. Its
# median stays under 0.1 s, a thirtieth of what issue 36 saw (3.2 s behind one pipelining client, 6.2 s
# behind one huge header), and none fails. Its worst is the shared box's, not the door's: a first bound
# of 1 s on it (chosen before measuring) saw 0.8 s at load average 13 and 2.6 s at 15, medians 2 ms;
# bench/door_limits.py reports it.
OTHER_MEDIAN_S = 0.1
# The door reads at most MAX_HEAD (64 KiB) + one FEED_SLICE (16 KiB) of a head before refusing it,
# microseconds on loopback; 2 s is that plus a scheduling delay on a loaded 2-core box (issue 36: a
# 128 MiB value took 30.6 s to be refused).
HEAD_REFUSED_S = 2.0


@pytest.fixture(scope="module")
def door(door_home, engines_ready, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limits-cfg")
    path = door_config(tmp, engines_ready)
    # a notice hook that records the environment the door gives it (a process the door starts)
    hook, hook_out = tmp / "hook.py", tmp / "hook-env.jsonl"
    hook.write_text("import json, os, sys\nopen(sys.argv[1], 'a').write(json.dumps(dict(os.environ)) + '\\n')\n")
    argv = json.dumps([sys.executable, str(hook), str(hook_out)])
    path.write_text(path.read_text().replace("[host]\n", f"[host]\non_notice = {argv}\n", 1))
    s = ServeProcess(door_home, path, env={"SERVEDECK_API_KEY": KEY})
    try:
        s.wait_up()
        s.url = f"http://127.0.0.1:{s.port}"
        s.ps = psutil.Process(s.proc.pid)
        s.hook_out = hook_out
        s.home = door_home
        s.proc_env = {k: v for k, v in os.environ.items() if k != "SERVEDECK_API_KEY"}
        s.proc_env.update(SERVEDECK_HOME=str(door_home), SERVEDECK_CONFIG=str(path))
        yield s
    finally:
        code, err = s.stop()
        stop_everything(door_home)
    assert "Traceback" not in err, err


def read_responses(sock: socket.socket, n: int, timeout_s: float = 120) -> list[tuple[int, bytes]]:
    """Read whole HTTP/1.1 responses from `sock` until there are `n` (or more, when more came in the
    same read): (status, body) each, in order."""
    got: list[tuple[int, bytes]] = []

    class P:
        body = b""

        def on_body(self, b: bytes) -> None:
            self.body += b

        def on_message_complete(self) -> None:
            got.append((parser.get_status_code(), self.body))
            self.body = b""

    parser = httptools.HttpResponseParser(P())
    sock.settimeout(timeout_s)
    while len(got) < n:
        data = sock.recv(65536)
        assert data, f"the door closed the connection after {len(got)} of {n} responses: {got}"
        parser.feed_data(data)
    return got


# --- 1. a client that pipelines and never reads -------------------------------------------------------
def assert_bystander_served(seen: dict) -> None:
    assert not seen["failed"], seen["failed"][:3]
    assert seen["times"], "another client got no answer at all"
    assert seen["median_s"] < OTHER_MEDIAN_S, \
        f"another client's /v1/models took {seen['median_s']:.3f} s (median; up to {seen['max_s']:.2f} s)"


@pytest.mark.parametrize("request_bytes", [MODELS_REQ, MODELS_REQ_NO_KEY], ids=["answers-200", "answers-401"])
def test_a_client_that_pipelines_and_never_reads_leaves_the_door_bounded(door, request_bytes):
    """8 MiB of pipelined GET /v1/models (about 190,000 requests), none of the answers read: the door
    stops reading from that client once its answers wait (back-pressure) and grows by less than
    GROWTH_BOUND, while another client is answered within OTHER_MEDIAN_S (median)."""
    other = Bystander(door.url, door.proc.pid, AUTH, every_s=0.2)
    p = pipeline(door.port, request_bytes, 8 * 2**20, 8)
    with p.sock as c:
        time.sleep(2)  # not reading; the door answers what it read, as far as it will
        seen = other.done()
        first = read_responses(c, 3)  # the connection still works: its answers are there, in order
    want = 200 if request_bytes is MODELS_REQ else 401
    assert [s for s, _ in first[:3]] == [want] * 3
    assert seen["grew"] < GROWTH_BOUND, f"the door grew {seen['grew'] / 2**20:.0f} MiB while one client sent " \
                                        f"{p.sent / 2**20:.1f} MiB of requests and read no answer"
    assert_bystander_served(seen)


# --- 2. one huge header value -------------------------------------------------------------------------
def test_a_huge_header_is_refused_at_the_limit_while_other_clients_are_answered(door):
    """Clients in turn, for 3 s and at least five of them, each send a 128 MiB header value: each gets
    431 within HEAD_REFUSED_S of its first byte, the door grows by less than GROWTH_BOUND, and another
    client's /v1/models is answered within OTHER_MEDIAN_S (median) throughout."""
    other = Bystander(door.url, door.proc.pid, AUTH, every_s=0.2)
    took: list[float] = []
    t_end = time.monotonic() + 3
    try:
        while len(took) < 5 or time.monotonic() < t_end:
            t, got = huge_header(door.port, 128)
            assert t is not None and got.startswith(b"HTTP/1.1 431 "), \
                f"a 128 MiB header value: {got[:120]!r} after {t} s (431 expected within {HEAD_REFUSED_S} s)"
            took.append(t)
            body = got.partition(b"\r\n\r\n")[2]
            assert not body.endswith(b"}") or "64 KiB" in json.loads(body)["error"]["message"]
    finally:
        seen = other.done()
    assert max(took) < HEAD_REFUSED_S, f"431 after {', '.join(f'{t:.3f}' for t in took)} s"
    assert seen["grew"] < GROWTH_BOUND, f"the door grew {seen['grew'] / 2**20:.0f} MiB"
    assert_bystander_served(seen)


# --- 3. Upgrade: h2c ----------------------------------------------------------------------------------
CHAT = {"model": "smollm2", "messages": [{"role": "user", "content": "Say hi"}], "max_tokens": 3, "temperature": 0}


def test_curl_http2_gets_one_http11_answer_per_request_on_a_kept_connection(door):
    """`curl --http2` asks to upgrade to h2c; the door answers in HTTP/1.1 (as uvicorn and nginx do):
    the chat reaches llama-server, and /metrics on the same connection is answered too."""
    cp = subprocess.run(
        ["curl", "-sv", "--http2", "-H", f"Authorization: Bearer {KEY}", "-H", "Content-Type: application/json",
         "-d", json.dumps(CHAT), "-w", "\n@@%{http_code}\n", f"{door.url}/v1/chat/completions",
         "--next", "--http2", "-H", f"Authorization: Bearer {KEY}", "-w", "\n@@%{http_code}\n", f"{door.url}/metrics"],
        capture_output=True, text=True, timeout=180)
    assert cp.returncode == 0, (cp.returncode, cp.stdout[-500:], cp.stderr[-1500:])
    assert "Upgrade: h2c" in cp.stderr  # curl did ask
    chat, _, rest = cp.stdout.partition("\n@@")
    code, _, metrics = rest.partition("\n")
    assert code == "200", chat
    assert json.loads(chat)["choices"][0]["message"]["role"] == "assistant"
    assert metrics.rstrip().endswith("@@200") and "servedeck_door_requests_total" in metrics
    assert "Re-using existing connection" in cp.stderr  # one connection, kept alive after the upgrade was ignored


def test_upgrade_requests_with_bodies_are_read_whole_and_pipelining_goes_on(door):
    """Three requests in one write: a chat with `Upgrade: h2c` and a Content-Length body, the same with a
    chunked body, then GET /v1/models: three answers, in order, nothing else."""
    body = json.dumps(CHAT).encode()
    up = (b"Connection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQCAAAAAAIAAAAA\r\n"
          b"Authorization: Bearer %s\r\nContent-Type: application/json\r\n" % KEY.encode())
    half = len(body) // 2
    chunked = b"%x\r\n%s\r\n%x\r\n%s\r\n0\r\n\r\n" % (half, body[:half], len(body) - half, body[half:])
    wire = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: door\r\n" + up + b"Content-Length: %d\r\n\r\n" % len(body)
            + body + b"POST /v1/chat/completions HTTP/1.1\r\nHost: door\r\n" + up
            + b"Transfer-Encoding: chunked\r\n\r\n" + chunked + MODELS_REQ)
    with socket.create_connection(("127.0.0.1", door.port)) as c:
        c.sendall(wire)
        got = read_responses(c, 3)
        c.settimeout(1)
        try:
            extra = c.recv(65536)
        except socket.timeout:
            extra = b""
    assert [s for s, _ in got] == [200, 200, 200], got
    for _, b in got[:2]:
        assert json.loads(b)["object"] == "chat.completion"
    assert json.loads(got[2][1])["object"] == "list"
    assert extra == b"", f"an answer nobody asked for: {extra[:200]!r}"


# --- 4. a body nested 100,000 deep ---------------------------------------------------------------------
def test_a_body_nested_100000_deep_gets_400_and_the_connection_goes_on(door):
    """The door's JSON parser refuses it (Python's, bounded by its recursion limit) with a 400 naming the
    nesting, not an empty reply; a body nested 200 deep (inside a field llama-server ignores) goes on to
    the engine, on the same connection."""
    deep = b'{"model": "smollm2", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    fine = json.dumps({**CHAT, "metadata_nested": json.loads("[" * 200 + "]" * 200)}).encode()

    def post(b: bytes) -> bytes:
        return (b"POST /v1/chat/completions HTTP/1.1\r\nHost: door\r\nAuthorization: Bearer %s\r\n"
                b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % (KEY.encode(), len(b)) + b)

    with socket.create_connection(("127.0.0.1", door.port)) as c:
        c.sendall(post(deep))
        [(status, body)] = read_responses(c, 1)  # one answer, and no other
        assert status == 400, body[:300]
        err = json.loads(body)["error"]
        assert "nested" in err["message"] and err["hint"], err
        c.sendall(post(fine))
        [(status, body)] = read_responses(c, 1)
    assert status == 200, body[:300]
    assert json.loads(body)["object"] == "chat.completion"


# --- 5. the key stays out of what the door starts -----------------------------------------------------
def test_the_door_key_reaches_no_engine_supervisor_or_hook(door):
    """The door was given its key in SERVEDECK_API_KEY; it starts smollm2 (a shim and its llama-server)
    and runs its notice hook: none of them has the key in its environment or its argv."""
    r = httpx.post(f"{door.url}/v1/chat/completions", json=CHAT, headers=AUTH, timeout=180)
    assert r.status_code == 200, r.text
    procs = door.ps.children(recursive=True)
    for f in (door.home / "live").glob("*.json"):  # and every engine recorded, wherever it was reparented
        from servedeck.supervisor.process import group_members

        procs += [psutil.Process(p) for p in group_members(json.loads(f.read_text())["pgid"])]
    names = []
    for p in {p.pid: p for p in procs}.values():
        try:
            env, argv = p.environ(), p.cmdline()
        except psutil.NoSuchProcess:
            continue
        names.append(" ".join(argv)[:80])
        assert "SERVEDECK_API_KEY" not in env, f"pid {p.pid} ({names[-1]}) has SERVEDECK_API_KEY"
        assert not any(KEY in v for v in env.values()), f"pid {p.pid} ({names[-1]}) has the key in its environment"
        assert not any(KEY in a for a in argv), f"pid {p.pid} ({names[-1]}) has the key in its argv"
    assert any("llama-server" in n for n in names) and any("shim" in n for n in names), names
    deadline = time.monotonic() + 20
    while not door.hook_out.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    hooked = [json.loads(line) for line in door.hook_out.read_text().splitlines()]
    assert hooked, "the notice hook never ran"
    for env in hooked:
        assert "SERVEDECK_API_KEY" not in env and not any(KEY in v for v in env.values())


def test_an_engine_started_from_a_shell_that_exports_the_key_does_not_get_it(door, tmp_path):
    """A user who exports SERVEDECK_API_KEY for `serve` runs `servedeck start` from the same shell: the
    engine and its shim (spawned by the deck, not the door) do not inherit the key either."""
    from servedeck.supervisor.process import group_members

    env = {**door.proc_env, "SERVEDECK_API_KEY": KEY}
    r = subprocess.run([sys.executable, "-m", "servedeck", "start", "gemma-side"], env=env, capture_output=True,
                       text=True, timeout=180)
    try:
        assert r.returncode == 0, r.stderr
        rec = json.loads((door.home / "live" / "gemma-side.json").read_text())
        procs = [psutil.Process(p) for p in group_members(rec["pgid"])]
        assert len(procs) >= 2, procs  # the shim and llama-server
        for p in procs:
            assert "SERVEDECK_API_KEY" not in p.environ(), " ".join(p.cmdline())[:120]
    finally:
        subprocess.run([sys.executable, "-m", "servedeck", "stop", "gemma-side"], env=env, capture_output=True,
                       timeout=120)


# --- the timeouts that bound how long a connection is held ---------------------------------------------
@pytest.fixture
def quick_door(monkeypatch, tmp_path):
    """A door in this process (no engine, no watch loop) whose head and stalled-reader timeouts are 1 s,
    checked every 0.2 s, instead of nginx's 60 s, so a test can pass them."""
    from servedeck.door import ServeOptions, front
    from servedeck.init import render_starter
    from servedeck.modelsfile import load

    from doorkit import DoorThread

    monkeypatch.setattr(front, "HEAD_TIMEOUT_S", 1.0)
    monkeypatch.setattr(front, "STALLED_READER_S", 1.0)
    monkeypatch.setattr(front, "SWEEP_S", 0.2)
    cfg = tmp_path / "models.toml"
    cfg.write_text(render_starter())
    d = DoorThread(load(cfg), ServeOptions(port=0, watch=False))
    yield d
    d.close()


def test_a_head_trickled_past_the_head_timeout_gets_408(quick_door):
    with socket.create_connection(("127.0.0.1", quick_door.port)) as c:
        c.sendall(b"GET /v1/models HTTP/1.1\r\nHost: door\r\nX-Slow: ")
        t0 = time.monotonic()
        got = b""
        c.settimeout(0.25)
        while time.monotonic() - t0 < 10 and not got.endswith(b"}"):
            try:
                c.sendall(b"a")  # a byte at a time: the connection is never idle long enough for keep-alive
                got += c.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                break
    assert got.startswith(b"HTTP/1.1 408 "), got[:200]
    assert b"did not arrive within 1 s" in got
    assert 1.0 <= time.monotonic() - t0 < 5


def test_a_client_that_takes_nothing_for_the_stalled_reader_time_is_cut(quick_door):
    """5,000 pipelined GET /v1/models (~6.5 MB of answers) on a socket that reads nothing: once the door's
    answers wait for it past STALLED_READER_S, the door drops the connection; the client then finds the
    connection ended before all its answers came."""
    n = 5000
    with socket.socket() as c:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        c.connect(("127.0.0.1", quick_door.port))
        c.sendall(b"GET /v1/models HTTP/1.1\r\nHost: door\r\n\r\n" * n)
        time.sleep(4)  # answers wait for a client that takes none: 1 s, then the sweep cuts it
        got, ended = 0, False
        c.settimeout(5)
        try:
            while True:
                data = c.recv(1 << 20)
                if not data:
                    ended = True
                    break
                got += data.count(b"HTTP/1.1 200 ")
        except ConnectionResetError:
            ended = True
        except socket.timeout:  # the connection lives on: the door kept it
            pass
    assert ended and got < n, f"{got} of {n} answers read, the connection {'ended' if ended else 'still open'}"
