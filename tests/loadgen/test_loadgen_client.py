"""The client's edges: failures become records, streams are parsed the way servers send them."""

from __future__ import annotations

import asyncio
import json

from servedeck.loadgen import ClientConfig, RequestRecord, RequestSpec, StreamingClient
from servedeck.loadgen.response import Response
from servedeck.loadgen.sse import EventStream, StreamFacts
from ports import free_port  # below the kernel's ephemeral range: tests/ports.py says why


def send_one(url: str, prompt: str = "hello", max_tokens: int = 5, **cfg) -> RequestRecord:
    async def go() -> RequestRecord:
        rec = RequestRecord(id="r1", kind="measured", t_target=0.0)
        async with StreamingClient(ClientConfig(url, model="m", **cfg)) as c:
            await c.send(RequestSpec(id="r1", prompt=prompt, max_tokens=max_tokens), rec, 0.0)
        return rec

    return asyncio.run(go())


def test_connection_refused_is_an_error_record_not_an_exception():
    rec = send_one(f"http://127.0.0.1:{free_port()}")
    assert rec.status == "error"
    assert "connect failed" in (rec.error or "")
    assert rec.t_end is not None and rec.t_send is None


def test_http_error_status_is_recorded(instrument):
    rec = send_one(instrument.url, prompt="please [fail:500]")
    assert rec.status == "error" and rec.http_status == 500
    assert "asked to fail" in (rec.error or "")


def test_stream_cut_midway_is_an_error_with_the_chunks_seen(instrument):
    rec = send_one(instrument.url, prompt="[fail:drop]", max_tokens=10)
    assert rec.status == "error"
    assert rec.streamed_tokens == 2  # what arrived before the cut is kept


def test_request_timeout_is_an_error_record(instrument):
    rec = send_one(instrument.url, max_tokens=100, request_timeout_s=0.2)
    assert rec.status == "error" and "timeout" in (rec.error or "")


def test_completions_api_and_usage(instrument):
    rec = send_one(instrument.url, api="completions", max_tokens=7)
    assert rec.status == "ok"
    assert rec.streamed_tokens == 7 and rec.output_tokens == 7
    assert rec.prompt_tokens is not None and rec.cached_tokens == 0
    assert rec.finish_reason == "length"


def test_realistic_instrument_events_parse_like_a_servers(instrument_factory):
    """--realistic builds every event with json.dumps when due (as vLLM/llama.cpp do): the same
    record comes out, on both APIs, and the instrument says which loop it served on."""
    inst = instrument_factory("--ttft-ms", "5", "--itl-ms", "2", "--tokens", "9", "--realistic")
    for api in ("chat", "completions"):
        rec = send_one(inst.url, api=api, max_tokens=9)
        assert rec.status == "ok", rec.error
        assert rec.streamed_tokens == 9 and rec.output_tokens == 9 and rec.finish_reason == "length"
        assert rec.prompt_tokens is not None and rec.cached_tokens == 0
    assert inst.loop in ("uvloop", "asyncio")
    assert all(len(r["chunk_t"]) == 9 for r in inst.records().values())


def test_multi_token_chunks_counted_from_continuous_usage(instrument_factory):
    inst = instrument_factory("--ttft-ms", "5", "--itl-ms", "2", "--tokens-per-chunk", "3")
    rec = send_one(inst.url, max_tokens=10, continuous_usage_stats=True)
    assert rec.status == "ok"
    assert rec.chunk_n == [3, 3, 3, 1] and rec.chunk_n_from_server
    assert rec.streamed_tokens == rec.output_tokens == 10
    # Without per-chunk counts the client sees 4 chunks and the server says 10 tokens.
    rec = send_one(inst.url, max_tokens=10)
    assert rec.chunk_n == [1, 1, 1, 1] and not rec.chunk_n_from_server
    assert rec.output_tokens == 10


def test_pool_reuses_connections_and_survives_a_server_side_close(instrument):
    async def go() -> list[RequestRecord]:
        recs = []
        async with StreamingClient(ClientConfig(instrument.url, model="m")) as c:
            for i in range(3):
                rec = RequestRecord(id=f"p{i}", kind="measured", t_target=0.0)
                await c.send(RequestSpec(id=f"p{i}", prompt="x", max_tokens=2), rec, 0.0)
                recs.append(rec)
                if i == 1:  # the server's keep-alive ran out while the connection sat idle
                    for conn in c._idle:
                        conn.transport.close()
                    await asyncio.sleep(0.05)
            assert len(c._idle) == 1
        return recs

    assert [r.status for r in asyncio.run(go())] == ["ok", "ok", "ok"]


# ---- parsing, without a network -----------------------------------------------------------

def _http(events: list[bytes], sep: bytes = b"\n\n") -> bytes:
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    body = b"".join(b"%x\r\n%s\r\n" % (len(e + sep), e + sep) for e in events)
    return head + body + b"0\r\n\r\n"


LLAMA_CPP = [  # as llama-server sent them (trimmed), including its null-content role chunk
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"role":"assistant","content":null}}],"object":"chat.completion.chunk"}',
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":"Your"}}],"object":"chat.completion.chunk"}',
    b'data: {"choices":[{"finish_reason":null,"index":0,"delta":{"content":" friendly"}}],"object":"chat.completion.chunk"}',
    b'data: {"choices":[{"finish_reason":"length","index":0,"delta":{}}],"object":"chat.completion.chunk"}',
    b'data: {"choices":[],"usage":{"completion_tokens":2,"prompt_tokens":32,"total_tokens":34,'
    b'"prompt_tokens_details":{"cached_tokens":24}},"timings":{"cache_n":24,"prompt_n":8,"prompt_ms":202.0,'
    b'"predicted_n":2,"predicted_ms":75.5}}',
    b"data: [DONE]",
]


def _feed_in_pieces(raw: bytes, size: int, **kw) -> Response:
    p = Response(**kw)
    for k, i in enumerate(range(0, len(raw), size)):
        p.feed(float(k), raw[i : i + size])
    assert p.done
    return p


def _facts(p: Response) -> StreamFacts:
    assert p.events is not None
    return p.events.facts()


def _events(p: Response) -> EventStream:
    assert p.events is not None
    return p.events


def test_llama_cpp_stream_parsed_at_any_read_boundary():
    raw = _http(LLAMA_CPP)
    for size in (1, 7, 64, len(raw)):
        f = _facts(_feed_in_pieces(raw, size))
        assert sum(f.chunk_n) == 2 and len(f.chunk_t) == 2
        assert (f.prompt_tokens, f.output_tokens, f.cached_tokens) == (32, 2, 24)
        assert f.timings is not None and f.timings["prompt_n"] == 8
        assert f.finish_reason == "length" and f.error is None


def test_empty_content_first_chunk_and_crlf_events():
    events = [
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}',
        b'data: {"choices":[{"delta":{"reasoning_content":"hmm"}}]}',
        b'data: {"choices":[{"delta":{"content": "spaced"}}]}',  # spaces after the colon: fast path too
        b"data: [DONE]",
    ]
    p = _feed_in_pieces(_http(events, sep=b"\r\n\r\n"), 5)
    f = _facts(p)
    assert f.chunk_n == [1, 1]
    assert f.chunk_t[0] > 0  # the role chunk's read is not the first token
    assert _events(p).saw_done_marker


def test_json_with_spaces_takes_the_fast_path_and_keeps_the_finish():
    """Python's json.dumps writes `"content": " t"`: such a chunk is counted where it arrives (no
    JSON decoding after the response), while a finish reason or usage still gets decoded."""
    events = [
        b'data: {"id": "x", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": null}]}',
        *(b'data: {"id": "x", "choices": [{"index": 0, "delta": {"content": " t%d"}, "logprobs": null, '
          b'"finish_reason": null}]}' % i for i in range(3)),
        b'data: {"id": "x", "choices": [{"index": 0, "delta": {"content": " end"}, "finish_reason": "length"}]}',
        b'data: {"id": "x", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}}',
        b"data: [DONE]",
    ]
    p = _feed_in_pieces(_http(events), 7)
    assert len(_events(p)._raw) == 2  # only the finishing chunk and the usage event are kept for decoding
    f = _facts(p)
    assert f.chunk_n == [1, 1, 1, 1] and f.finish_reason == "length" and f.output_tokens == 4


def test_continuous_usage_counts_are_read_without_json_decoding():
    """vLLM's continuous usage stats put a running count on every chunk; the counts come from two
    regex reads, and a chunk that carried 3 tokens (spec decode) still counts 3."""
    def chunk(text, completion, fin=b"null"):
        return (b'data: {"choices":[{"index":0,"delta":{"content":"%s"},"finish_reason":%s}],'
                b'"usage":{"prompt_tokens":7,"total_tokens":%d,"completion_tokens":%d}}' % (text, fin, 7 + completion, completion))
    events = [chunk(b"a", 1), chunk(b"bcd", 4), chunk(b"e", 5), chunk(b"f", 6, b'"length"'),
              b'data: {"choices":[],"usage":{"prompt_tokens":7,"completion_tokens":6}}', b"data: [DONE]"]
    p = _feed_in_pieces(_http(events), 1000)
    assert len(_events(p)._raw) == 2  # the finishing chunk and the usage event
    f = _facts(p)
    assert f.chunk_n == [1, 3, 1, 1] and f.chunk_n_from_server
    assert (f.prompt_tokens, f.output_tokens, f.finish_reason) == (7, 6, "length")


def test_error_event_inside_a_200_stream():
    events = [b'data: {"choices":[{"delta":{"content":"a"}}]}', b'data: {"error":{"message":"out of memory"}}']
    f = _facts(_feed_in_pieces(_http(events), 1000))
    assert f.error == "out of memory"


def test_content_length_error_body():
    body = json.dumps({"error": {"message": "model not found"}}).encode()
    raw = b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body
    p = _feed_in_pieces(raw, 3)
    assert p.status == 404 and "model not found" in p.body_text


def test_interim_100_continue_is_not_the_answer():
    """httptools frames the response: a 100 Continue before the real head is skipped, not taken as
    the status (the hand-written parser before issue 21 took it as the whole response)."""
    raw = b"HTTP/1.1 100 Continue\r\n\r\n" + _http(LLAMA_CPP)
    p = _feed_in_pieces(raw, 9)
    assert p.status == 200


def test_a_repeated_header_keeps_every_value():
    raw = (b"HTTP/1.1 200 OK\r\nVary: Accept\r\nVary: Origin\r\nContent-Type: text/event-stream\r\n"
           b"Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
    assert _feed_in_pieces(raw, 4).headers["vary"] == "Accept, Origin"


def test_bytes_that_are_not_http_raise_protocol_error():
    import pytest

    from servedeck.loadgen.response import ProtocolError

    with pytest.raises(ProtocolError):
        Response().feed(0.0, b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n")


def test_text_kept_on_request_content_and_reasoning_apart():
    events = [
        b'data: {"choices":[{"delta":{"role":"assistant","content":""}}]}',
        b'data: {"choices":[{"delta":{"reasoning_content":"hmm "}}]}',
        b'data: {"choices":[{"delta":{"content":"Your"}}]}',
        b'data: {"choices":[{"delta":{"content":" friend"},"finish_reason":"stop"}]}',
        b"data: [DONE]",
    ]
    f = _facts(_feed_in_pieces(_http(events), 11, keep_text=True))
    assert (f.text, f.reasoning) == ("Your friend", "hmm ")
    assert f.chunk_n == [1, 1, 1] and f.finish_reason == "stop"
    # without keep_text the counts are the same and no text is decoded
    f = _facts(_feed_in_pieces(_http(events), 11))
    assert f.chunk_n == [1, 1, 1] and f.text == ""


def test_body_until_close_ends_at_eof():
    p = Response()
    p.feed(0.0, b"HTTP/1.1 500 Oops\r\nContent-Type: text/plain\r\n\r\nbroken")
    assert not p.done and p.eof(1.0)
    assert p.status == 500 and p.body_text == "broken" and not p.keep_alive
