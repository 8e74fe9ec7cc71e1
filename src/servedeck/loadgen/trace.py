"""A recorded trace to replay (`servedeck bench --workload trace --trace FILE`): one JSON object a line,

    {"timestamp": 0, "input_length": 812, "output_length": 32, "hash_ids": [0, 1]}

timestamp: milliseconds from the trace's start (when the request arrived); input_length and
output_length: prompt and answer tokens; hash_ids (optional): the ids of the prompt's blocks of
`block_tokens` tokens, in order, as in Mooncake's traces: two requests whose hash_ids begin alike share
exactly that prefix. Read here and checked whole before anything launches: a line that is not JSON or
lacks a field is refused naming the line and the field.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from servedeck.errors import UsageError

FIELDS = ("timestamp", "input_length", "output_length")


@dataclass(frozen=True)
class TraceRow:
    line: int  # in the file, from 1
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()


def read_trace(path: Path, window_s: Optional[float] = None) -> list[TraceRow]:
    """The trace's rows in arrival order, those within `window_s` of its first request (None: all)."""
    try:
        text = path.read_text()
    except OSError as e:
        raise UsageError(f"--trace {path}: cannot read it ({e.strerror})", hint="give the path of a JSONL trace") \
            from None
    rows: list[TraceRow] = []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise UsageError(f"{path}: line {n} is not JSON ({e.msg})",
                             hint='one object a line: {"timestamp": 0, "input_length": 512, "output_length": 32}') \
                from None
        if not isinstance(doc, dict):
            raise UsageError(f"{path}: line {n} is not a JSON object", hint="docs/workloads.md describes the format")
        for key in FIELDS:
            if key not in doc:
                raise UsageError(f"{path}: line {n} lacks {key!r}", hint=f"every line has {', '.join(FIELDS)}")
        ts, inp, out, ids = doc["timestamp"], doc["input_length"], doc["output_length"], doc.get("hash_ids", [])
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0:
            raise UsageError(f"{path}: line {n}: timestamp {ts!r} is not milliseconds ≥ 0", hint="e.g. 1500")
        for key, v in (("input_length", inp), ("output_length", out)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise UsageError(f"{path}: line {n}: {key} {v!r} is not a whole number ≥ 1", hint="tokens, e.g. 512")
        if not isinstance(ids, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            raise UsageError(f"{path}: line {n}: hash_ids {ids!r} is not a list of whole numbers", hint="e.g. [0, 1, 7]")
        rows.append(TraceRow(n, float(ts), inp, out, tuple(ids)))
    if not rows:
        raise UsageError(f"{path}: no request in it", hint="one JSON object a line")
    rows.sort(key=lambda r: r.timestamp_ms)
    if window_s is not None:
        first = rows[0].timestamp_ms
        rows = [r for r in rows if r.timestamp_ms - first < window_s * 1000]
    return rows
