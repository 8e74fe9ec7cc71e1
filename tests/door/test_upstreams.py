"""The proxy itself, in front of servedeck's timing instrument given as an outside upstream (--upstream):
bytes pass through unchanged, a broken upstream stream is not turned into a clean end, and replicas get
requests by fewest outstanding. The instrument is a ruler, not an engine: the engine behaviour is tested
in test_door.py."""

from __future__ import annotations

import concurrent.futures as cf

import httpx
import psutil
import pytest

from doorkit import DoorThread
from servedeck.door import ServeOptions
from servedeck.testing.instrument_process import InstrumentProcess
from ports import free_port


@pytest.fixture(scope="module")
def instruments(door_home):
    a = InstrumentProcess("--ttft-ms", "20", "--itl-ms", "5", "--tokens", "20")
    b = InstrumentProcess("--ttft-ms", "20", "--itl-ms", "5", "--tokens", "20")
    yield a, b
    a.stop()
    b.stop()


@pytest.fixture(scope="module")
def outside_door(instruments):
    a, b = instruments
    d = DoorThread(None, ServeOptions(port=0, watch=False,
                                      external={"ruler": [a.url], "pair": [a.url, b.url],
                                                "nobody": [f"http://127.0.0.1:{free_port()}"]}))
    yield d
    d.close()


def body(rid_prompt: str = "hello", **kw) -> dict:
    return {"model": "ruler", "prompt": rid_prompt, "max_tokens": 12, "stream": True, **kw}


def test_stream_bytes_pass_through_unchanged(outside_door, instruments):
    a, _ = instruments
    h = {"x-request-id": "same-id"}
    direct = httpx.post(a.url + "/v1/completions", json=body(), headers=h).content
    via = httpx.post(outside_door.url + "/v1/completions", json=body(), headers=h)
    assert via.status_code == 200 and via.headers["content-type"].startswith("text/event-stream")
    assert via.content == direct and direct.count(b"data: ") == 13  # 12 tokens and [DONE]


def test_an_upstream_that_breaks_mid_stream_is_not_a_clean_end(outside_door):
    with pytest.raises(httpx.RemoteProtocolError):
        httpx.post(outside_door.url + "/v1/completions", json=body("[fail:drop]"))
    r = httpx.post(outside_door.url + "/v1/completions", json=body("[fail:500]"))
    assert r.status_code == 500  # the engine's own error status and body, passed through
    assert b"asked to fail" in r.content


def test_replicas_share_requests_by_fewest_outstanding(outside_door, instruments):
    a, b = instruments
    a.clear()
    b.clear()
    with cf.ThreadPoolExecutor(6) as pool:
        rs = list(pool.map(lambda i: httpx.post(outside_door.url + "/v1/completions",
                                                json=dict(body(f"p{i}"), model="pair"), timeout=30), range(6)))
    assert [r.status_code for r in rs] == [200] * 6
    assert len(a.records()) == 3 and len(b.records()) == 3


def _door_connections_to(port: int) -> int:
    """Established connections from this process (the door runs in a thread of it) to `port`."""
    return sum(1 for c in psutil.Process().net_connections("tcp")
               if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def test_one_engine_connection_carries_request_after_request(outside_door, instruments):
    a, _ = instruments
    port = int(a.url.rsplit(":", 1)[1])
    with httpx.Client() as c:
        assert c.post(outside_door.url + "/v1/completions", json=body("k")).status_code == 200
        before = _door_connections_to(port)  # the door's pool (earlier tests may have left a few idle)
        for i in range(5):
            assert c.post(outside_door.url + "/v1/completions", json=body(f"k{i}")).status_code == 200
    assert before >= 1 and _door_connections_to(port) == before  # kept alive and reused: no connect per request


def test_a_whole_body_response_passes_through_with_its_length(outside_door, instruments):
    a, _ = instruments
    direct = httpx.post(a.url + "/v1/completions", json=body(stream=False))
    via = httpx.post(outside_door.url + "/v1/completions", json=body(stream=False))
    assert via.status_code == direct.status_code == 400  # the instrument only streams: its error, unchanged
    assert via.content == direct.content and via.headers["content-length"] == str(len(direct.content))


def test_an_upstream_nobody_listens_on_is_a_502_naming_it(outside_door):
    r = httpx.post(outside_door.url + "/v1/completions", json=dict(body(), model="nobody"))
    assert r.status_code == 502
    err = r.json()["error"]
    assert "nobody" in err["message"] and "cannot connect" in err["message"]


def test_recent_requests_carry_the_engines_token_count_and_ttft(outside_door):
    r = httpx.post(outside_door.url + "/v1/completions",
                   json=body("counted", stream_options={"include_usage": True}))
    assert r.status_code == 200 and b'"completion_tokens":12' in r.content.replace(b" ", b"")
    last = httpx.get(outside_door.url + "/door/status").json()["recent"][0]
    assert last["model"] == "ruler" and last["status"] == 200 and last["tokens"] == 12
    assert last["ttft_ms"] >= 20  # the instrument's first token comes after 20 ms


def test_a_non_ascii_header_and_an_encoded_query_pass_through(outside_door, instruments):
    a, _ = instruments
    r = httpx.post(outside_door.url + "/v1/completions?note=a%20b", json=body(),
                   headers={"x-note": "café ☕".encode(), "x-request-id": "raw-target"})
    assert r.status_code == 200 and b"[DONE]" in r.content
    assert a.records()["raw-target"]["path"] == "/v1/completions?note=a%20b"  # the target as the client sent it
