"""The measuring instrument: an HTTP server that streams OpenAI-style SSE at known times.

Not an engine stand-in: a ruler. For each request it records when the request was fully
received and when each chunk was written (perf_counter, CLOCK_MONOTONIC, so comparable with a
client in another process on the same machine), and serves those records at GET /records.
Chunk j is due at t_received + ttft + j·tokens_per_chunk·itl: absolute deadlines, so a late
wake-up delays one chunk and never the ones after it. Each chunk is its own write on a socket
with TCP_NODELAY (asyncio sets it), so it leaves at once instead of waiting to be coalesced. The records hold the actual write times,
so what a client measured can be checked against what was really sent.

Two modes. "cheap" (the default) serialises each request's JSON once and splices the token text
into bytes per chunk: it leaves the client as much CPU as possible. "realistic" (--realistic) costs
what a real server costs per chunk: every event is a dict built and `json.dumps`ed when it is due
(id, object, created, model, choices[delta|text, logprobs, finish_reason]; the usage event last when
stream_options.include_usage), the way vLLM's and llama.cpp's OpenAI front ends build theirs. A client
judged only against the cheap mode gets more CPU than it will have against an engine.

Run it in its own process (the client's event loop must not share it), on uvloop when installed:
    python -m servedeck.testing.instrument --port 8123 --ttft-ms 50 --itl-ms 20 --tokens 100 [--realistic]
It prints "INSTRUMENT READY port=<port>" once listening. Endpoints:
    POST /v1/chat/completions, /v1/completions   stream; max_tokens (if given) sets the length
    GET /records   {"config": ..., "records": [...]}     DELETE /records   forget them
    GET /health
A prompt containing "[fail:500]" gets an HTTP 500; "[fail:drop]" is cut after two chunks.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from time import perf_counter, time
from typing import Any

from servedeck.loadgen.loop import current as current_loop, run as run_loop


@dataclass(frozen=True)
class InstrumentConfig:
    ttft_ms: float = 50.0
    itl_ms: float = 20.0
    tokens: int = 100  # output length when the request gives no max_tokens
    tokens_per_chunk: int = 1  # >1 imitates speculative decoding: several tokens per chunk
    role_chunk: bool = True  # send a role-only, empty-content chunk at once (as vLLM does)
    realistic: bool = False  # build and json.dumps every event when it is due, as real servers do
    json_spaces: bool = False  # realistic mode: json.dumps' default ", " / ": " separators (else compact)

    def __post_init__(self) -> None:
        if self.ttft_ms < 0 or self.itl_ms < 0 or self.tokens < 1 or self.tokens_per_chunk < 1:
            raise ValueError("ttft_ms/itl_ms must be >= 0, tokens and tokens_per_chunk >= 1")


@dataclass
class SentRecord:
    """What the instrument did for one request (absolute perf_counter seconds)."""

    id: str
    path: str
    t_received: float
    chunk_t: list[float] = field(default_factory=list)  # write time of each content chunk
    chunk_n: list[int] = field(default_factory=list)  # tokens in each content chunk
    t_role: float | None = None  # write time of the role-only chunk
    t_done: float | None = None  # write time of the final bytes
    aborted: bool = False  # the client went away first


_RESPONSE_HEAD = (
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
    b"Transfer-Encoding: chunked\r\n\r\n"
)


def _chunk(payload: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(payload), payload)


def _event(obj: dict[str, Any]) -> bytes:
    return _chunk(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


def _plain(status: str, body: bytes, ctype: str = "application/json") -> bytes:
    return (
        f"HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
        + body
    )


class _Stream:
    """One streamed response, driven by loop timers at absolute deadlines. Chunk bytes are
    built when due from a per-request template, so accepting a request stays cheap."""

    __slots__ = ("proto", "rec", "make", "n_chunks", "tail", "k", "start", "step", "handle", "fail_drop")

    def __init__(self, proto: _Conn, rec: SentRecord, make: Callable[[int], tuple[bytes, int]],
                 n_chunks: int, tail: Callable[[], bytes], start: float, step: float, fail_drop: bool) -> None:
        self.proto, self.rec, self.make, self.n_chunks, self.tail = proto, rec, make, n_chunks, tail
        self.k = 0
        self.start = start  # perf_counter deadline of chunk 0
        self.step = step
        self.handle: asyncio.TimerHandle | None = None
        self.fail_drop = fail_drop

    def schedule(self) -> None:
        deadline = self.start + self.k * self.step
        self.handle = self.proto.loop.call_at(deadline + self.proto.clock_offset, self.fire)

    def fire(self) -> None:
        tr = self.proto.transport
        if tr is None or tr.is_closing():
            return
        data, n = self.make(self.k)
        last = self.k == self.n_chunks - 1
        if last:
            data += self.tail()
        t = perf_counter()
        tr.write(data)
        self.rec.chunk_t.append(t)
        self.rec.chunk_n.append(n)
        self.k += 1
        if last:
            self.rec.t_done = t
            self.proto.stream_done()
        elif self.fail_drop and self.k == 2:
            self.rec.aborted = True
            tr.abort()
        else:
            self.schedule()


def _chunk_maker(base: dict[str, Any], chat: bool, per: int, n_tokens: int, prompt_tokens: int,
                 continuous_usage: bool) -> Callable[[int], tuple[bytes, int]]:
    """chunk index -> (framed SSE bytes, tokens in it); JSON is serialised once, here."""
    marker = "\x00TEXT\x00"
    choice: dict[str, Any] = {"index": 0}
    if chat:
        choice["delta"] = {"content": marker}
    else:
        choice["text"] = marker
    choice["finish_reason"] = None  # after the text, so the last chunk's can be swapped in
    ev: dict[str, Any] = dict(base, choices=[choice])
    if continuous_usage:
        ev["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": 0}
    tmpl = json.dumps(ev, separators=(",", ":"))
    head, _, rest = tmpl.partition(json.dumps(marker)[1:-1])
    head_b, rest_b = b"data: " + head.encode(), rest.encode()
    last_rest = rest_b.replace(b'"finish_reason":null', b'"finish_reason":"length"')

    def make(k: int) -> tuple[bytes, int]:
        first = k * per
        n = min(per, n_tokens - first)
        text = "".join([f" t{first + j}" for j in range(n)]).encode()
        tail = last_rest if first + n == n_tokens else rest_b
        if continuous_usage:
            tail = tail.replace(b'"completion_tokens":0', b'"completion_tokens":%d' % (first + n))
        return _chunk(head_b + text + tail + b"\n\n"), n

    return make


def _realistic_maker(base: dict[str, Any], chat: bool, per: int, n_tokens: int, prompt_tokens: int,
                     continuous_usage: bool, spaces: bool = False) -> Callable[[int], tuple[bytes, int]]:
    """chunk index -> (framed SSE bytes, tokens in it); a fresh dict and json.dumps per event.
    Compact separators by default: vLLM (pydantic's model_dump_json) and llama.cpp (nlohmann's
    dump()) write no spaces; `spaces` gives json.dumps' defaults, as a Python server that keeps them."""
    rid, kind, created, model = base["id"], base["object"], base["created"], base["model"]
    seps = (", ", ": ") if spaces else (",", ":")

    def make(k: int) -> tuple[bytes, int]:
        first = k * per
        n = min(per, n_tokens - first)
        text = "".join([f" t{first + j}" for j in range(n)])
        finish = "length" if first + n == n_tokens else None
        if chat:
            choice = {"index": 0, "delta": {"content": text}, "logprobs": None, "finish_reason": finish}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        ev: dict[str, Any] = {"id": rid, "object": kind, "created": created, "model": model, "choices": [choice]}
        if continuous_usage:
            ev["usage"] = {"prompt_tokens": prompt_tokens, "completion_tokens": first + n,
                           "total_tokens": prompt_tokens + first + n}
        return _chunk(b"data: " + json.dumps(ev, ensure_ascii=False, separators=seps).encode() + b"\n\n"), n

    return make


class _Conn(asyncio.Protocol):
    """A client connection; requests are answered one after another (keep-alive)."""

    def __init__(self, server: Instrument) -> None:
        self.server = server
        self.loop = asyncio.get_running_loop()
        self.clock_offset = server.clock_offset
        self.transport: asyncio.Transport | None = None
        self.buf = b""
        self.stream: _Stream | None = None
        self.queue: list[tuple[float, bytes, bytes]] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport  # type: ignore[assignment]

    def data_received(self, data: bytes) -> None:
        t = perf_counter()
        self.buf += data
        while True:
            i = self.buf.find(b"\r\n\r\n")
            if i < 0:
                return
            head = self.buf[:i]
            length = 0
            for line in head.split(b"\r\n")[1:]:
                if line[:15].lower() == b"content-length:":
                    length = int(line[15:].strip())
            if len(self.buf) < i + 4 + length:
                return
            body = self.buf[i + 4 : i + 4 + length]
            self.buf = self.buf[i + 4 + length :]
            self.queue.append((t, head, body))
            if self.stream is None:
                self.next_request()

    def connection_lost(self, exc: Exception | None) -> None:
        s = self.stream
        if s is not None:
            s.rec.aborted = s.rec.t_done is None
            if s.handle is not None:
                s.handle.cancel()
        self.stream = None
        self.transport = None

    def stream_done(self) -> None:
        self.stream = None
        if self.queue:
            self.next_request()

    def next_request(self) -> None:
        t, head, body = self.queue.pop(0)
        tr = self.transport
        if tr is None:
            return
        first = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        method, target = (first + ["", ""])[:2]
        path = target.split("?", 1)[0]  # routed on the path; the records keep the whole target
        headers = {}
        for line in head.split(b"\r\n")[1:]:
            name, _, value = line.decode("latin-1").partition(":")
            headers[name.strip().lower()] = value.strip()
        srv = self.server
        if method == "GET" and path == "/health":
            tr.write(_plain("200 OK", b'{"status":"ok"}'))
        elif path == "/records" and method == "GET":
            payload = {"config": asdict(srv.config), "loop": srv.loop, "records": srv.records()}
            tr.write(_plain("200 OK", json.dumps(payload).encode()))
        elif path == "/records" and method == "DELETE":
            srv.clear()
            tr.write(_plain("200 OK", b"{}"))
        elif method == "POST" and path in ("/v1/chat/completions", "/v1/completions"):
            self.start_stream(t, target, headers, body)
            return
        else:
            tr.write(_plain("404 Not Found", b'{"error":{"message":"not found"}}'))
        if self.queue:
            self.next_request()

    def start_stream(self, t: float, path: str, headers: dict[str, str], body: bytes) -> None:
        tr = self.transport
        assert tr is not None
        srv, cfg = self.server, self.server.config
        try:
            req = json.loads(body)
        except ValueError:
            tr.write(_plain("400 Bad Request", b'{"error":{"message":"body is not JSON"}}'))
            return self.stream_done()
        chat = path.split("?", 1)[0].endswith("/chat/completions")
        prompt = json.dumps(req.get("messages")) if chat else str(req.get("prompt", ""))
        rid = headers.get("x-request-id") or f"req-{len(srv._records)}"
        if not req.get("stream"):
            tr.write(_plain("400 Bad Request", b'{"error":{"message":"the instrument only streams"}}'))
            return self.stream_done()
        if "[fail:500]" in prompt:
            tr.write(_plain("500 Internal Server Error", b'{"error":{"message":"instrument: asked to fail"}}'))
            return self.stream_done()
        n_tokens = int(req.get("max_tokens") or cfg.tokens)
        opts = req.get("stream_options") or {}
        rec = SentRecord(id=rid, path=path, t_received=t)
        srv._records.append(rec)
        kind = "chat.completion.chunk" if chat else "text_completion"
        base = {"id": f"cmpl-{rid}", "object": kind, "created": int(time()) if cfg.realistic else 0,
                "model": req.get("model", "instrument")}
        per = cfg.tokens_per_chunk
        prompt_tokens = max(1, len(prompt) // 4)
        n_chunks = -(-n_tokens // per)
        cont = bool(opts.get("continuous_usage_stats"))
        make = _realistic_maker(base, chat, per, n_tokens, prompt_tokens, cont, cfg.json_spaces) if cfg.realistic \
            else _chunk_maker(base, chat, per, n_tokens, prompt_tokens, cont)
        include_usage = bool(opts.get("include_usage"))

        def tail() -> bytes:
            out = b""
            if include_usage:
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n_tokens,
                         "total_tokens": prompt_tokens + n_tokens,
                         "prompt_tokens_details": {"cached_tokens": 0}}
                out += _event(dict(base, choices=[], usage=usage))
            return out + _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"

        if not cfg.realistic:  # built now, once: the cheap mode spends nothing when it is due
            tail_bytes = tail()
            tail = lambda: tail_bytes  # noqa: E731
        head = _RESPONSE_HEAD
        if chat and cfg.role_chunk:
            head += _event(dict(base, choices=[{"index": 0, "delta": {"role": "assistant", "content": ""},
                                                "finish_reason": None}]))
        tr.write(head)
        rec.t_role = perf_counter() if chat and cfg.role_chunk else None
        s = _Stream(self, rec, make, n_chunks, tail, t + cfg.ttft_ms / 1000, per * cfg.itl_ms / 1000,
                    fail_drop="[fail:drop]" in prompt)
        self.stream = s
        s.schedule()


class Instrument:
    """In-process handle. Lifecycle: created → serving (`start`) → closed (`close`)."""

    def __init__(self, config: InstrumentConfig | None = None) -> None:
        self.config = config or InstrumentConfig()
        self._records: list[SentRecord] = []
        self._server: asyncio.AbstractServer | None = None
        self.clock_offset = 0.0
        self.port: int | None = None
        self.loop = ""  # the event loop it serves on, once started

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        if self._server is not None:
            raise RuntimeError("instrument already started")
        loop = asyncio.get_running_loop()
        # loop.call_at runs on loop.time(); deadlines are computed on perf_counter.
        self.clock_offset = loop.time() - perf_counter()
        self.loop = current_loop()
        self._server = await loop.create_server(lambda: _Conn(self), host, port, backlog=4096)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    def records(self) -> list[dict[str, Any]]:
        return [asdict(r) for r in self._records]

    def clear(self) -> None:
        self._records = []

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m servedeck.testing.instrument", description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port (printed on the READY line)")
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--tokens-per-chunk", type=int, default=1)
    ap.add_argument("--no-role-chunk", action="store_true")
    ap.add_argument("--realistic", action="store_true",
                    help="build and json.dumps every event when it is due, as real servers do")
    ap.add_argument("--json-spaces", action="store_true",
                    help="with --realistic: json.dumps' default separators (a space after ':' and ',')")
    ap.add_argument("--loop", choices=["auto", "uvloop", "asyncio"], default="auto",
                    help="auto: uvloop when installed")
    a = ap.parse_args(argv)
    cfg = InstrumentConfig(a.ttft_ms, a.itl_ms, a.tokens, a.tokens_per_chunk, not a.no_role_chunk, a.realistic,
                           a.json_spaces)

    async def serve() -> None:
        inst = Instrument(cfg)
        port = await inst.start(a.host, a.port)
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        print(f"INSTRUMENT READY port={port} loop={inst.loop}", flush=True)
        await stop.wait()
        await inst.close()

    run_loop(serve(), None if a.loop == "auto" else a.loop)
    sys.exit(0)


if __name__ == "__main__":
    main()
