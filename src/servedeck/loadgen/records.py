"""What was asked (`RequestSpec`) and what happened (`RequestRecord`), stored as data.

Every figure servedeck reports is computed from these records afterwards (stats.py); nothing is
measured twice. All times are `time.perf_counter()` seconds (CLOCK_MONOTONIC on Linux) relative
to the run's start `t0`, so records from one run compare directly and a record file never
depends on wall-clock time.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

Kind = Literal["warmup", "measured"]
Status = Literal["ok", "error", "cancelled"]

RECORD_SCHEMA = 1

# In JSON, chunk times are whole microseconds, each counted from the one before (the first from
# t_send): integers serialise three times faster than floats and the lines stay short, which
# matters because a record is written while the run is still going.


@dataclass(frozen=True)
class RequestSpec:
    """One request to send. `prompt` is the user message (chat) or the prompt text (completions)."""

    id: str
    prompt: str
    max_tokens: int
    kind: Kind = "measured"
    # Size the prompt generator aimed for (exact when a tokenizer sized it); None if unknown.
    prompt_tokens_expected: int | None = None
    # Which prompt of its set this is, and a digest of its text: two runs built with the same
    # --seed send the same prompt at the same index, and a comparison checks the digest.
    index: int | None = None
    digest: str | None = None


def _r(t: float | None) -> float | None:
    # Microsecond precision is well below anything we report and keeps requests.jsonl small.
    return None if t is None else round(t, 6)


@dataclass
class RequestRecord:
    """Timings and counts of one request, as measured by the client and reported by the server.

    Times (seconds relative to run start, monotonic):
        t_target       when the schedule wanted the request sent
        t_send         when the request bytes were handed to the socket
        t_first_byte   first response byte (status line)
        t_first_token  first chunk carrying non-empty content (role-only / empty chunks skipped)
        chunk_t/n      every content chunk: arrival time and how many tokens it carried
        t_end          last byte of the response (or the moment it failed / was cancelled)
    Counts:
        prompt_tokens, output_tokens, cached_tokens: as the server reported them (usage,
            llama.cpp timings); None when the server did not say.
        streamed_tokens: what the client counted from the stream (sum of chunk_n).
    """

    id: str
    kind: Kind
    t_target: float
    t_send: float | None = None
    t_first_byte: float | None = None
    t_first_token: float | None = None
    chunk_t: list[float] = field(default_factory=list)
    chunk_n: list[int] = field(default_factory=list)
    t_end: float | None = None
    prompt_tokens: int | None = None
    output_tokens: int | None = None
    cached_tokens: int | None = None
    streamed_tokens: int = 0
    # True when the server said per chunk how many tokens it carried (continuous usage stats);
    # otherwise chunk_n is 1 per content chunk, a guess that multi-token chunks break.
    chunk_n_from_server: bool = False
    timings: dict[str, Any] | None = None  # llama.cpp's own account, verbatim
    finish_reason: str | None = None
    status: Status | None = None  # None only while in flight
    error: str | None = None
    http_status: int | None = None
    prompt_tokens_expected: int | None = None
    prompt_index: int | None = None
    prompt_digest: str | None = None
    # Multi-turn workloads (workloads/conversations.py): which conversation, which turn (from 1); None elsewhere,
    # and then left out of the JSON line.
    conversation: int | None = None
    turn: int | None = None
    # The shared-prefix workload (workloads/shared_prefix.py): which group shares this prompt's prefix, and this
    # request's place in it (from 1: the first one finds the prefix cold); None elsewhere, and left out.
    group: int | None = None
    in_group: int | None = None

    @property
    def ttft(self) -> float | None:
        if self.t_first_token is None or self.t_send is None:
            return None
        return self.t_first_token - self.t_send

    @property
    def e2e(self) -> float | None:
        if self.t_end is None or self.t_send is None:
            return None
        return self.t_end - self.t_send

    @property
    def lag(self) -> float | None:
        """Schedule lag: how late the client sent compared with what the schedule asked."""
        return None if self.t_send is None else self.t_send - self.t_target

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict (one line of requests.jsonl once dumped)."""
        line = {
            "schema": RECORD_SCHEMA,
            "id": self.id,
            "kind": self.kind,
            "status": self.status,
            "http_status": self.http_status,
            "error": self.error,
            "t_target": _r(self.t_target),
            "t_send": _r(self.t_send),
            "t_first_byte": _r(self.t_first_byte),
            "t_first_token": _r(self.t_first_token),
            "t_end": _r(self.t_end),
            "chunk_dt_us": _to_dt_us(self.chunk_t, self.t_send),
            "chunk_n": list(self.chunk_n),
            "chunk_n_from_server": self.chunk_n_from_server,
            "prompt_tokens": self.prompt_tokens,
            "prompt_tokens_expected": self.prompt_tokens_expected,
            "prompt_index": self.prompt_index,
            "prompt_digest": self.prompt_digest,
            "output_tokens": self.output_tokens,
            "streamed_tokens": self.streamed_tokens,
            "cached_tokens": self.cached_tokens,
            "finish_reason": self.finish_reason,
            "timings": self.timings,
        }
        if self.conversation is not None:
            line.update(conversation=self.conversation, turn=self.turn)
        if self.group is not None:
            line.update(group=self.group, in_group=self.in_group)
        return line

    @classmethod
    def from_json(cls, data: Mapping[str, Any] | str) -> RequestRecord:
        d = json.loads(data) if isinstance(data, str) else dict(data)
        schema = d.pop("schema", RECORD_SCHEMA)
        if schema != RECORD_SCHEMA:
            raise ValueError(f"request record schema {schema} is not {RECORD_SCHEMA}")
        chunk_n = d.pop("chunk_n", [])
        chunk_t = _from_dt_us(d.pop("chunk_dt_us", []), d.get("t_send"))
        if len(chunk_t) != len(chunk_n):
            raise ValueError(f"record {d.get('id')}: chunk_t and chunk_n differ in length")
        return cls(chunk_t=list(chunk_t), chunk_n=list(chunk_n), **d)


def _to_dt_us(chunk_t: list[float], t_send: float | None) -> list[int]:
    if not chunk_t:
        return []
    import numpy as np  # here, not at the top: every servedeck command imports this module (--help included)

    us = np.round(np.asarray(chunk_t, dtype=float) * 1e6).astype(np.int64)
    base = round((t_send if t_send is not None else 0.0) * 1e6)
    dt: list[int] = np.diff(us, prepend=base).tolist()
    return dt


def _from_dt_us(dt_us: list[int], t_send: float | None) -> list[float]:
    if not dt_us:
        return []
    import numpy as np

    base = round((t_send if t_send is not None else 0.0) * 1e6)
    t: list[float] = ((np.cumsum(np.asarray(dt_us, dtype=np.int64)) + base) / 1e6).tolist()
    return t
