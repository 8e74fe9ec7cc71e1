"""One request at a time to an OpenAI-compatible server: what gates, the ramp, the soak and the
reference outputs ask, on the load generator's own client (same pool, same httptools framing,
same RequestRecord), so there is one HTTP client path in servedeck, not one per feature.

    async with ApiClient("http://127.0.0.1:8000") as api:
        reply = await api.chat({"model": "m", "messages": [...], "max_tokens": 32})   # not streamed
        reply = await api.chat({..., "stream": True})       # streamed: the text is joined from the events
        reply.ok, reply.text, reply.reasoning, reply.usage, reply.finish_reason, reply.error
        reply.http_error                                    # "HTTP 503: <body>" for an error status, else None
        reply.headers["x-servedeck-waited"]                 # the response head (lower-case names)
        reply.record                                        # timings: t_send, t_first_token, chunk_t, t_end
        doc = (await api.post("/tokenize", {"content": "..."})).doc     # any JSON POST
        models = (await api.get("/v1/models")).doc

Nothing here raises for a failed request: connection refused, timeouts, HTTP errors and broken
streams come back as a Reply with `ok` False and the reason in `error` (the record's status and
error), as StreamingClient's records do. Times are perf_counter seconds (the record's t0 is 0).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from servedeck.loadgen.client import ClientConfig, StreamingClient
from servedeck.loadgen.records import RequestRecord

MAX_BODY = 64 * 1024 * 1024  # a non-streamed answer is kept whole (logprobs of a long answer are large)
_ids = itertools.count(1)


@dataclass
class Reply:
    """What one request brought back."""

    record: RequestRecord  # status "ok" | "error" | "cancelled", error, http_status and the timings
    text: str = ""  # the answer (message content, or a completion's text); joined from the events when streamed
    reasoning: str = ""  # reasoning_content / reasoning, kept apart from the answer
    usage: dict[str, Any] | None = None  # as the server wrote it
    timings: dict[str, Any] | None = None  # llama.cpp's
    finish_reason: str | None = None
    doc: Any = None  # the decoded JSON answer of a request that was not streamed (None: not JSON)
    body: str = ""  # the raw answer of a request that was not streamed
    chunks: int = 0  # streamed: content chunks (reasoning included)
    headers: dict[str, str] | None = None  # the response head's headers (lower-case names), when one came

    @property
    def ok(self) -> bool:
        return self.record.status == "ok"

    @property
    def error(self) -> str | None:
        return self.record.error

    @property
    def http_status(self) -> int | None:
        return self.record.http_status

    @property
    def http_error(self) -> str | None:
        """"HTTP 503: <the body's start>" when the server answered with an error status, else None."""
        s = self.record.http_status
        return None if s is None or s == 200 else f"HTTP {s}: {self.body[:300]}"


class ApiClient:
    """Lifecycle as StreamingClient's: open → closed (`aclose`, or leave the `async with`)."""

    def __init__(self, base_url: str, api_key: str | None = None, headers: Mapping[str, str] | None = None,
                 connect_timeout_s: float = 10.0) -> None:
        self._client = StreamingClient(ClientConfig(base_url, model="", api_key=api_key, headers=dict(headers or {}),
                                                    connect_timeout_s=connect_timeout_s, request_timeout_s=None))
        self.base_url = base_url.rstrip("/")

    async def __aenter__(self) -> ApiClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()

    def in_flight(self) -> list[tuple[str, float, int, Any]]:
        """(request id, seconds since its last byte or its send, content chunks so far, connection):
        what a stall watch reads while a streamed request runs."""
        return self._client.in_flight()

    async def chat(self, body: dict[str, Any], timeout_s: float | None = None) -> Reply:
        """POST /v1/chat/completions; streamed when body["stream"] is true."""
        return await self.post("/v1/chat/completions", body, timeout_s)

    async def completions(self, body: dict[str, Any], timeout_s: float | None = None) -> Reply:
        """POST /v1/completions; streamed when body["stream"] is true."""
        return await self.post("/v1/completions", body, timeout_s)

    async def post(self, path: str, body: dict[str, Any], timeout_s: float | None = None) -> Reply:
        """POST a JSON body to `path` (below the base URL); an event stream when body["stream"] is true."""
        payload = json.dumps(body, ensure_ascii=False).encode()
        return await self._exchange("POST", path, payload, stream=bool(body.get("stream")), timeout_s=timeout_s)

    async def get(self, path: str, timeout_s: float | None = None) -> Reply:
        return await self._exchange("GET", path, None, stream=False, timeout_s=timeout_s)

    async def _exchange(self, method: str, path: str, payload: bytes | None, stream: bool,
                        timeout_s: float | None) -> Reply:
        c = self._client
        rid = f"api-{next(_ids)}"
        head = c.request_head(method, c.root + path, "text/event-stream" if stream else "application/json")
        length = f"\r\nContent-Length: {len(payload)}" if payload is not None else ""
        data = f"{head}\r\nX-Request-Id: {rid}{length}\r\n\r\n".encode() + (payload or b"")
        record = RequestRecord(id=rid, kind="measured", t_target=0.0)
        response = await c.exchange(data, record, 0.0, sse=stream, keep_text=stream,
                                    max_body=MAX_BODY, timeout_s=timeout_s)
        reply = Reply(record=record)
        if response is None:
            return reply
        reply.headers = dict(response.headers)
        if stream:
            f = response.facts()
            reply.text, reply.reasoning, reply.usage = f.text, f.reasoning, f.usage
            reply.timings, reply.finish_reason, reply.chunks = f.timings, f.finish_reason, len(f.chunk_t)
            return reply
        reply.body = response.body_text
        try:
            reply.doc = json.loads(reply.body) if reply.body else None
        except ValueError:
            reply.doc = None
        if record.status == "ok" and isinstance(reply.doc, dict):
            _take_answer(reply, reply.doc)
        return reply


def _take_answer(reply: Reply, doc: dict[str, Any]) -> None:
    """The text, usage and finish of a non-streamed chat or completion answer (other answers: untouched)."""
    if isinstance(doc.get("usage"), dict):
        reply.usage = doc["usage"]
        for k, attr in (("prompt_tokens", "prompt_tokens"), ("completion_tokens", "output_tokens")):
            if isinstance(doc["usage"].get(k), int):
                setattr(reply.record, attr, doc["usage"][k])
    if isinstance(doc.get("timings"), dict):
        reply.timings = doc["timings"]
        reply.record.timings = doc["timings"]
    choices = doc.get("choices")
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        return
    c = choices[0]
    reply.finish_reason = reply.record.finish_reason = c.get("finish_reason")
    msg = c.get("message")
    if isinstance(msg, dict):
        reply.text = msg.get("content") or ""
        reply.reasoning = msg.get("reasoning_content") or msg.get("reasoning") or ""
    elif isinstance(c.get("text"), str):
        reply.text = c["text"]
