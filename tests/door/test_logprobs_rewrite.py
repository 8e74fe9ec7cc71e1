"""door/logprobs.py on bodies as llama-server 11434 writes them (captured from it on 2026-12-03), cut
into every possible pair of reads: the completions API's fields come out the same however the bytes
arrive. The real engine through the door: tests/door/test_door_clients.py."""

from __future__ import annotations

import json

from servedeck.door.logprobs import CompletionLogprobs


def item(tid: int, tok: str, lp: float, alt: tuple[str, float]) -> dict:
    b = list(tok.encode())
    return {"id": tid, "token": tok, "bytes": b, "logprob": lp,
            "top_logprobs": [{"id": tid, "token": tok, "bytes": b, "logprob": lp},
                             {"id": 1, "token": alt[0], "bytes": list(alt[0].encode()), "logprob": alt[1]}]}


WHOLE = json.dumps({"choices": [{"text": " Paris.", "index": 0, "finish_reason": "length", "logprobs": {"content": [
    item(7042, " Paris", -0.248, (" the", -2.78)), item(30, ".", -0.399, (",", -1.58))]}}],
    "object": "text_completion", "usage": {"completion_tokens": 2}}).encode()
EVENTS = b"".join(b"data: " + json.dumps({"choices": [{"text": t, "index": 0, "finish_reason": None, "logprobs": {
    "content": [item(i, t, lp, ("x", -5.0))]}}], "object": "text_completion"}).encode() + b"\n\n"
    for i, t, lp in ((7042, " Paris", -0.25), (30, ".", -0.4), (198, "\n", -1.06))) \
    + b'data: {"choices":[{"text":"","index":0,"logprobs":null,"finish_reason":"length"}]}\n\ndata: [DONE]\n\n'


def run(body: bytes, cut: int) -> bytes:
    rw = CompletionLogprobs()
    return rw.feed(body[:cut]) + rw.feed(body[cut:]) + rw.end()


def test_a_whole_body_gets_tokens_logprobs_top_and_offsets_however_it_is_split():
    for cut in range(len(WHOLE) + 1):
        lp = json.loads(run(WHOLE, cut))["choices"][0]["logprobs"]
        assert lp["tokens"] == [" Paris", "."] and lp["token_logprobs"] == [-0.248, -0.399]
        assert lp["top_logprobs"] == [{" Paris": -0.248, " the": -2.78}, {".": -0.399, ",": -1.58}]
        assert lp["text_offset"] == [0, 6] and len(lp["content"]) == 2  # llama-server's own field stays


def test_a_stream_is_rewritten_event_by_event_with_offsets_carried_across_events():
    for cut in range(len(EVENTS) + 1):
        out = run(EVENTS, cut)
        events = [e for e in out.split(b"\n\n") if e]
        assert events[-1] == b"data: [DONE]" and out.endswith(b"\n\n")
        docs = [json.loads(e[6:]) for e in events[:-1]]
        lps = [d["choices"][0]["logprobs"] for d in docs]
        assert [lp["tokens"] for lp in lps[:3]] == [[" Paris"], ["."], ["\n"]] and lps[3] is None
        assert [lp["text_offset"] for lp in lps[:3]] == [[0], [6], [7]]


def test_what_is_not_chat_shaped_passes_unchanged():
    err = b'{"error":{"code":500,"message":"boom"}}'
    assert json.loads(run(err, 5)) == json.loads(err)
    assert run(b"not json at all", 3) == b"not json at all"
