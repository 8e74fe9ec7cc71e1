"""llama-server's completion logprobs in the completions API's own shape, rewritten at the door.

llama-server (11434) answers `POST /v1/completions` with `logprobs: N` in the chat API's shape,
`logprobs.content[]` ({id, token, bytes, logprob, top_logprobs[]}), where the completions API has
`tokens`, `token_logprobs`, `top_logprobs` (one {token: logprob} per token) and `text_offset`: the
openai SDK's `logprobs.tokens` is None, and lm-eval's and other harnesses' completion clients read
nothing. The rewrite is exact: the same tokens and numbers, moved; `text_offset` counts characters
from the start of the completion (vLLM's way without echo), carried across a stream's events per
choice. `content` stays beside them, for a client written against llama-server.

Only for a request the router marks (door/routing.py: /v1/completions asking for logprobs, to a model
whose adapter says its completion logprobs are chat-shaped), so no other request pays anything but one
None check per body piece: a whole body is held until it ends (it is one JSON document); a stream is
rewritten an event at a time as each event's last byte arrives.
"""

from __future__ import annotations

import json
from typing import Any


def convert_choice(choice: dict[str, Any], offset: int) -> int:
    """Add the completions fields to one choice whose `logprobs` has `content`; return the offset after it."""
    lp = choice.get("logprobs")
    content = lp.get("content") if isinstance(lp, dict) else None
    if not isinstance(content, list) or "tokens" in lp:
        return offset
    tokens, token_logprobs, top, text_offset = [], [], [], []
    for item in content:
        tok = item.get("token", "")
        tokens.append(tok)
        token_logprobs.append(item.get("logprob"))
        top.append({t.get("token", ""): t.get("logprob") for t in item.get("top_logprobs") or []})
        text_offset.append(offset)
        offset += len(tok)
    lp.update(tokens=tokens, token_logprobs=token_logprobs, top_logprobs=top, text_offset=text_offset)
    return offset


class CompletionLogprobs:
    """Rewrites one response's body, piece by piece as the relay gets it (`feed`), then `end`."""

    def __init__(self) -> None:
        self.buf = b""
        self.stream: bool | None = None  # decided by the first byte: a JSON body starts "{", an event stream does not
        self.offsets: dict[int, int] = {}

    def _doc(self, raw: bytes) -> bytes:
        try:
            doc = json.loads(raw)
        except ValueError:
            return raw  # not JSON (an engine error page): passed on as it came
        if isinstance(doc, dict) and isinstance(doc.get("choices"), list):
            for c in doc["choices"]:
                if isinstance(c, dict):
                    i = c.get("index", 0)
                    self.offsets[i] = convert_choice(c, self.offsets.get(i, 0))
        return json.dumps(doc, separators=(",", ":")).encode()

    def _event(self, ev: bytes) -> bytes:
        if not ev.startswith(b"data: {"):
            return ev  # [DONE], comments, anything else
        return b"data: " + self._doc(ev[6:])

    def feed(self, piece: bytes) -> bytes:
        self.buf += piece
        if self.stream is None:
            head = self.buf.lstrip()
            if not head:
                return b""
            self.stream = not head.startswith((b"{", b"["))
        if not self.stream:
            return b""  # a whole JSON body: held until `end`
        out = []
        while True:
            cut = self.buf.find(b"\n\n")
            if cut < 0:
                break
            ev, self.buf = self.buf[:cut], self.buf[cut + 2:]
            out.append(self._event(ev) + b"\n\n")
        return b"".join(out)

    def end(self) -> bytes:
        rest, self.buf = self.buf, b""
        if not rest:
            return b""
        if self.stream:
            return self._event(rest)
        return self._doc(rest)
