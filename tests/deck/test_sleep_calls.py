"""What servedeck sends to put a vLLM server to sleep and wake it, checked against a recording
instrument: a small HTTP server written here that records each request and answers as told. It is a
measuring instrument, not vLLM: it proves the method, path, query and body servedeck sends, in order,
and how servedeck reads a failed or slow answer. Whether vLLM then sleeps is measured on the GPU
(bench/sleep_switch.py)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

import pytest

from servedeck.deck.records import LiveRecord
from servedeck.deck.sleep import SleepFailed, asleep_now, send
from servedeck.engines import get_engine

from ports import free_port


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, str, list, object]] = []
        self.status: dict[str, int] = {}  # path → status to answer (default 200)
        self.delay_s: dict[str, float] = {}
        self.body: dict[str, bytes] = {}
        rec = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self) -> None:
                u = urlsplit(self.path)
                n = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(n) if n else b""
                rec.seen.append((self.command, u.path, parse_qsl(u.query), json.loads(raw) if raw else None))
                time.sleep(rec.delay_s.get(u.path, 0.0))
                body = rec.body.get(u.path, b"")
                try:
                    self.send_response(rec.status.get(u.path, 200))
                    self.send_header("content-length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (the timeout test): nothing to answer

            do_GET = do_POST = _answer

            def log_message(self, *a) -> None:
                pass

        port = free_port()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.url = f"http://127.0.0.1:{port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def inst():
    r = Recorder()
    yield r
    r.close()


def record_at(url: str) -> LiveRecord:
    return LiveRecord(model="m", engine="vllm", build="b", slot="main", port=int(url.rsplit(":", 1)[1]),
                      launch_dir="/nonexistent", pid=None, pgid=None, create_time=None, owner_pid=0, base_url=url)


def test_level_1_sleep_and_wake_send_what_vllm_0_26_serves(inst):
    v = get_engine("vllm")
    rec = record_at(inst.url)
    send(rec, v.sleep_calls(1), 5)
    send(rec, v.wake_calls(1), 5)
    assert inst.seen == [("POST", "/sleep", [("level", "1"), ("mode", "wait")], None), ("POST", "/wake_up", [], None)]


def test_level_2_wake_reloads_the_weights_then_the_kv_cache_then_resets_the_prefix_cache(inst):
    done = send(record_at(inst.url), get_engine("vllm").wake_calls(2), 5)
    assert inst.seen == [("POST", "/wake_up", [("tags", "weights")], None),
                         ("POST", "/collective_rpc", [], {"method": "reload_weights"}),
                         ("POST", "/wake_up", [("tags", "kv_cache")], None),
                         ("POST", "/reset_prefix_cache", [], None)]
    assert [d["call"] for d in done] == ["POST /wake_up?tags=weights", "POST /collective_rpc",
                                         "POST /wake_up?tags=kv_cache", "POST /reset_prefix_cache"]


def test_a_failed_call_stops_the_sequence_and_is_named(inst):
    inst.status["/collective_rpc"] = 500
    inst.body["/collective_rpc"] = b'{"error": "Model reloading with `dummy` format"}'
    with pytest.raises(SleepFailed) as e:
        send(record_at(inst.url), get_engine("vllm").wake_calls(2), 5)
    assert "POST /collective_rpc answered HTTP 500" in str(e.value) and "dummy" in str(e.value)
    assert [s[1] for s in inst.seen] == ["/wake_up", "/collective_rpc"]  # nothing after the failure


def test_a_call_that_outlasts_its_timeout_fails_and_says_how_long_it_waited(inst):
    inst.delay_s["/wake_up"] = 2.0
    with pytest.raises(SleepFailed) as e:
        send(record_at(inst.url), get_engine("vllm").wake_calls(1), 0.5)
    assert "POST /wake_up failed after 0." in str(e.value) and "Timeout" in str(e.value)


def test_the_engine_is_asked_whether_it_sleeps(inst):
    rec = record_at(inst.url)
    inst.body["/is_sleeping"] = b'{"is_sleeping": true}'
    assert asleep_now(rec) is True
    inst.body["/is_sleeping"] = b'{"is_sleeping": false}'
    assert asleep_now(rec) is False
    inst.status["/is_sleeping"] = 404  # VLLM_SERVER_DEV_MODE unset: no such route
    assert asleep_now(rec) is None
    assert inst.seen[0][:2] == ("GET", "/is_sleeping")
