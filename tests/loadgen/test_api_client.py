"""ApiClient: one request at a time on the load generator's client, text and usage back."""

from __future__ import annotations

import asyncio

from servedeck.loadgen.api import ApiClient, Reply
from ports import free_port  # below the kernel's ephemeral range: tests/ports.py says why


def ask(url: str, path: str, body: dict | None) -> Reply:
    async def go() -> Reply:
        async with ApiClient(url) as api:
            return await (api.get(path) if body is None else api.post(path, body))

    return asyncio.run(go())


def test_a_streamed_chat_comes_back_as_its_text_and_usage(instrument):
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 5, "stream": True,
            "stream_options": {"include_usage": True}}
    r = ask(instrument.url, "/v1/chat/completions", body)
    assert r.ok, r.error
    assert r.text == " t0 t1 t2 t3 t4"
    assert r.usage is not None and r.usage["completion_tokens"] == 5
    assert r.finish_reason == "length" and r.chunks == 5
    assert r.record.t_send is not None and r.record.t_first_token is not None


def test_a_streamed_completion_joins_its_text(instrument):
    body = {"model": "m", "prompt": "hi", "max_tokens": 3, "stream": True}
    r = ask(instrument.url, "/v1/completions", body)
    assert r.ok and r.text == " t0 t1 t2"


def test_an_http_error_is_a_reply_with_its_json_and_status(instrument):
    # the instrument answers a request that is not streamed with a 400 and a JSON error
    r = ask(instrument.url, "/v1/chat/completions", {"model": "m", "messages": [], "max_tokens": 3})
    assert not r.ok and r.http_status == 400
    assert r.http_error == 'HTTP 400: {"error":{"message":"the instrument only streams"}}'
    assert r.doc == {"error": {"message": "the instrument only streams"}}
    assert r.error is not None and r.error.startswith("HTTP 400")


def test_get_returns_the_decoded_body(instrument):
    r = ask(instrument.url, "/health", None)
    assert r.ok and r.doc == {"status": "ok"}


def test_a_refused_connection_is_a_reply_not_an_exception():
    r = ask(f"http://127.0.0.1:{free_port()}", "/health", None)
    assert not r.ok and "connect failed" in (r.error or "")


def test_a_reply_keeps_its_response_headers(instrument):
    """What the door says in its head (x-servedeck-waited) is read through the same client
    (bench/sleep_switch.py): the reply keeps the headers, lower-case."""
    r = ask(instrument.url, "/health", None)
    assert r.headers is not None and r.headers.get("content-type", "").startswith("application/json")
