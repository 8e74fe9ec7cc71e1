"""SSE event splitting, kept off the JSON path (the HTTP framing around it is response.py's).

`EventStream.feed(t, body)` runs inside the socket's read callback, under httptools' on_body, so
it only splits events and tags each with the arrival time `t` of the read that completed it.
Events that plainly carry one content token take a fast path (a couple of `bytes.find`); the
few others (role-only first chunk, finish, usage, llama.cpp timings, errors) are kept raw and
decoded once the response has ended (`facts`), where their cost no longer shifts timestamps.
Hand-written because no SSE library splits at this cost or keeps the read's arrival time.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

# Matches `"content":` and `"reasoning_content":` (chat) in one search; `"text":` (completions).
# JSON may put spaces after the colon (Python's json.dumps does by default): they are skipped.
_CONTENT = b'content":'
_TEXT = b'"text":'
_REASONING = b'"reasoning":'
_FINISH_STR = b'"finish_reason":"'  # a finish reason that is a string, not null
_FINISH_STR_SPACED = b'"finish_reason": "'
_QUOTE = 0x22
_COMPLETION = re.compile(rb'"completion_tokens": ?(\d+)')
_PROMPT = re.compile(rb'"prompt_tokens": ?(\d+)')
_SPACE = 0x20
_PENDING = -1  # chunk_n placeholder: decide after the response ends


@dataclass
class StreamFacts:
    """What the raw events said, decoded after the response ended."""

    chunk_t: list[float] = field(default_factory=list)
    chunk_n: list[int] = field(default_factory=list)
    chunk_n_from_server: bool = False
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    timings: dict[str, Any] | None = None
    finish_reason: str | None = None
    error: str | None = None
    usage: dict[str, Any] | None = None  # the last usage object as the server wrote it (decoded events)
    # Only with EventStream(keep_text=True): the answer's text, and its reasoning apart
    text: str = ""
    reasoning: str = ""


class EventStream:
    """The events of one SSE body as its bytes arrive; `end(t)` once the body is complete."""

    __slots__ = ("saw_done_marker", "chunk_t", "chunk_n", "_raw", "_usage", "_spaced", "_sse", "_sep", "_keep")

    def __init__(self, keep_text: bool = False) -> None:
        self.saw_done_marker = False
        self.chunk_t: list[float] = []
        self.chunk_n: list[int] = []
        self._raw: dict[int, bytes] = {}  # index into chunk_* -> event kept for JSON decoding
        # index into chunk_* -> (prompt_tokens, completion_tokens) of a content chunk that carried
        # continuous usage (vLLM's continuous_usage_stats): read with two finds, no JSON decoding
        self._usage: dict[int, tuple[int | None, int]] = {}
        self._spaced: bool | None = None  # the server puts a space after JSON's colons
        self._sse = b""
        self._sep: bytes | None = None
        # keep every event for decoding (the text is wanted): one request, not a measured stream
        self._keep = keep_text

    def end(self, t: float) -> None:
        if self._sse.strip():  # a last event without its blank line
            self._on_event(t, self._sse.strip())
            self._sse = b""

    def feed(self, t: float, data: bytes) -> None:
        """Body bytes that arrived at `t` (any piece: events may span several)."""
        s = self._sse + data if self._sse else data
        sep = self._sep
        if sep is None:
            # "\r\n\r\n" contains no "\n\n", so the two separators cannot be confused.
            if b"\n\n" in s:
                sep = self._sep = b"\n\n"
            elif b"\r\n\r\n" in s:
                sep = self._sep = b"\r\n\r\n"
            else:
                self._sse = s
                return
        start = 0
        n = len(sep)
        while True:
            j = s.find(sep, start)
            if j < 0:
                break
            if j > start:
                self._on_event(t, s[start:j])
            start = j + n
        self._sse = s[start:]

    def _on_event(self, t: float, ev: bytes) -> None:
        # Hot path: runs once per streamed chunk, before anything else sees the bytes.
        k = ev.find(_CONTENT)
        if k >= 0:
            k += 9
        else:
            k = ev.find(_TEXT)
            if k >= 0:
                k += 7
            else:
                k = ev.find(_REASONING)
                if k >= 0:
                    k += 12
        n = len(ev)
        spaced = self._spaced
        if spaced is None:  # a server writes all its events alike: look once, after the first key
            i = ev.find(b'":')
            spaced = self._spaced = i >= 0 and ev[i + 2 : i + 3] == b" "
        if spaced and 0 < k < n - 1 and ev[k] == _SPACE:
            k = n - len(ev[k:].lstrip(b" "))
        # A string that is not empty: an opening quote, then anything but the closing one.
        text = 0 < k < n - 1 and ev[k] == _QUOTE and ev[k + 1] != _QUOTE
        usage = _has_usage(ev)
        plain = b'"timings"' not in ev and (_FINISH_STR_SPACED if spaced else _FINISH_STR) not in ev
        if text and plain and not self._keep:
            if not usage:
                self.chunk_t.append(t)
                self.chunk_n.append(1)
                return
            m = _COMPLETION.search(ev)
            if m is not None:  # vLLM's continuous usage: every content chunk says its count
                p = _PROMPT.search(ev)
                self._usage[len(self.chunk_t)] = (int(p[1]) if p else None, int(m[1]))
                self.chunk_t.append(t)
                self.chunk_n.append(_PENDING)
                return
        plain = plain and not usage
        if ev.startswith((b"data: [DONE]", b"data:[DONE]")):
            self.saw_done_marker = True
            return
        if plain and _is_empty_delta(ev):
            return  # the role-only first chunk: nothing to count, nothing to decode
        self._raw[len(self.chunk_t)] = ev
        self.chunk_t.append(t)
        self.chunk_n.append(_PENDING)

    def facts(self) -> StreamFacts:
        """Decode the kept events; drop chunks that carried no content. Call once, after done.

        Only the kept (pending) events are visited: the fast-path chunks are already final,
        so a 10,000-token answer costs no more here than a 10-token one.
        """
        f = StreamFacts(chunk_t=self.chunk_t, chunk_n=self.chunk_n)
        content_chunks = len(self.chunk_n) - len(self._raw) - len(self._usage)
        with_usage = 0  # content chunks that said how many tokens they carried
        extra = 0  # tokens beyond one per chunk assigned so far (continuous usage)
        drop: list[int] = []
        counted = self._usage
        for i in sorted(self._raw.keys() | counted.keys()) if self._raw else counted:
            if i in counted:  # a content chunk with its running count: the same steps, no JSON
                prompt, completion = counted[i]
                if prompt is not None:
                    f.prompt_tokens = prompt
                f.output_tokens = completion
                content_chunks += 1
                before = i - len(drop) + extra
                n_tok = max(completion - before, 1)
                extra += n_tok - 1
                with_usage += 1
                f.chunk_n[i] = n_tok
                continue
            obj, err = _decode_event(self._raw[i])
            n_tok = 0
            if err is not None:
                f.error = f.error or err
            elif obj is not None:
                if obj.get("error"):
                    e = obj["error"]
                    f.error = f.error or (e.get("message") if isinstance(e, dict) else None) or str(e)
                usage = obj.get("usage")
                has_content, finish = _choice_content(obj)
                if self._keep and has_content:
                    _take_text(f, obj)
                if finish:
                    f.finish_reason = finish
                if isinstance(usage, dict):
                    f.usage = usage
                    _take_usage(f, usage)
                if isinstance(obj.get("timings"), dict):
                    f.timings = obj["timings"]
                if has_content:
                    n_tok = 1
                    content_chunks += 1
                    if isinstance(usage, dict) and isinstance(usage.get("completion_tokens"), int):
                        # Continuous usage stats: the server says how many tokens this chunk
                        # carried, including any generated for earlier empty chunks (held-back
                        # partial UTF-8). Tokens before it: one per earlier chunk, plus extras.
                        before = i - len(drop) + extra
                        n_tok = max(usage["completion_tokens"] - before, 1)
                        extra += n_tok - 1
                        with_usage += 1
            if n_tok:
                f.chunk_n[i] = n_tok
            else:
                drop.append(i)
        for i in reversed(drop):
            del f.chunk_t[i]
            del f.chunk_n[i]
        f.chunk_n_from_server = content_chunks > 0 and with_usage == content_chunks
        if f.timings is not None:
            _take_timings(f, f.timings)
        return f


def _is_empty_delta(ev: bytes) -> bool:
    """A chat chunk whose content is "" or null and that carries nothing else worth decoding."""
    if not any(m in ev for m in (b'"content":""', b'"content":null', b'"content": ""', b'"content": null')):
        return False
    return not any(m in ev for m in (b'"reasoning', b'"text"', b'"tool_calls"', b'"error"'))


def _has_usage(ev: bytes) -> bool:
    # OpenAI sends `"usage":null` on every chunk once include_usage is set; only a value counts.
    u = ev.find(b'"usage"')
    if u < 0:
        return False
    rest = ev[u + 7 : u + 14].lstrip(b": ")
    return not rest.startswith(b"null")


def _decode_event(ev: bytes) -> tuple[dict[str, Any] | None, str | None]:
    """(json object or None, error text or None) for one SSE event."""
    data_lines: list[bytes] = []
    for line in ev.splitlines():
        if line.startswith(b"data:"):
            data_lines.append(line[5:].lstrip(b" "))
        elif line.startswith(b"error:"):  # llama.cpp's in-stream error event
            return None, line[6:].strip().decode("utf-8", "replace")[:500]
    if not data_lines:
        return None, None
    data = b"\n".join(data_lines)
    if data.strip() == b"[DONE]":
        return None, None
    try:
        obj = json.loads(data)
    except ValueError:
        return None, f"undecodable event: {data[:200].decode('utf-8', 'replace')}"
    return (obj, None) if isinstance(obj, dict) else (None, None)


def _choice_content(obj: dict[str, Any]) -> tuple[bool, str | None]:
    choices = obj.get("choices")
    if not choices or not isinstance(choices, list):
        return False, None
    c = choices[0]
    if not isinstance(c, dict):
        return False, None
    finish = c.get("finish_reason")
    if c.get("text"):
        return True, finish
    delta = c.get("delta") or {}
    if not isinstance(delta, dict):
        return False, finish
    has = bool(
        delta.get("content") or delta.get("reasoning_content") or delta.get("reasoning")
        or delta.get("tool_calls")
    )
    return has, finish


def _take_text(f: StreamFacts, obj: dict[str, Any]) -> None:
    c = obj["choices"][0]  # _choice_content found content there
    if isinstance(c.get("text"), str):
        f.text += c["text"]
        return
    delta = c.get("delta") or {}
    if isinstance(delta.get("content"), str):
        f.text += delta["content"]
    thought = delta.get("reasoning_content") or delta.get("reasoning")
    if isinstance(thought, str):
        f.reasoning += thought


def _take_usage(f: StreamFacts, usage: dict[str, Any]) -> None:
    if isinstance(usage.get("prompt_tokens"), int):
        f.prompt_tokens = usage["prompt_tokens"]
    if isinstance(usage.get("completion_tokens"), int):
        f.output_tokens = usage["completion_tokens"]
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and isinstance(details.get("cached_tokens"), int):
        f.cached_tokens = details["cached_tokens"]


def _take_timings(f: StreamFacts, timings: dict[str, Any]) -> None:
    # llama.cpp: prompt_n = prompt tokens evaluated, cache_n = prompt tokens reused from cache.
    prompt_n, cache_n = timings.get("prompt_n"), timings.get("cache_n")
    if f.cached_tokens is None and isinstance(cache_n, int):
        f.cached_tokens = cache_n
    if f.prompt_tokens is None and isinstance(prompt_n, int):
        f.prompt_tokens = prompt_n + (cache_n if isinstance(cache_n, int) else 0)
    if f.output_tokens is None and isinstance(timings.get("predicted_n"), int):
        f.output_tokens = timings["predicted_n"]
