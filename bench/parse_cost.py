"""What the client's stream parser costs per chunk, now and against an older copy of it.

Feeds a 100-token chat stream, as a server frames it (role chunk, 100 content chunks, usage
event, [DONE]), through the client's response parser one read per chunk (now
`servedeck.loadgen.response.Response`: httptools framing, sse.EventStream events), and times
(CPU time, not wall: a busy host stretches wall time, not instructions) the work done as each
chunk arrives and the work left for the end of the response (`facts()`: the events kept for JSON
decoding). Both JSON spellings: compact (vLLM's pydantic, llama.cpp's nlohmann) and with
json.dumps' default spaces; and vLLM's continuous usage stats (a usage object on every chunk,
which `servedeck bench` asks vLLM for). The two parsers run interleaved in one process, min of --reps.
A baseline is an older sse.py that holds the whole parser (ResponseParser, before issue 21).

    .venv/bin/python bench/parse_cost.py [--baseline OLD_SSE_PY]
    # the hand-written framing before issue 21:  git show 33d2f12:src/servedeck/loadgen/sse.py > /tmp/sse_old.py
    # the parser before issue 14:               git show 19ff67b:src/servedeck/loadgen/sse.py > /tmp/sse_old.py
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from types import ModuleType

HERE = Path(__file__).resolve().parent


def load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    m = importlib.util.module_from_spec(spec)
    sys.modules[name] = m
    spec.loader.exec_module(m)
    return m


def chunk(p: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(p), p)


def stream(seps: tuple[str, str], tokens: int = 100, continuous: bool = False) -> list[bytes]:
    def ev(i: int, fin: str | None = None, text: str | None = None) -> bytes:
        obj: dict = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m",
                     "choices": [{"index": 0, "delta": {"content": f" t{i}" if text is None else text},
                                  "logprobs": None, "finish_reason": fin}]}
        if continuous:  # vLLM's continuous_usage_stats: the running count on every chunk
            obj["usage"] = {"prompt_tokens": 5, "total_tokens": 5 + i + 1, "completion_tokens": i + (text != "")}
        return chunk(b"data: " + json.dumps(obj, separators=seps).encode() + b"\n\n")

    usage = {"id": "chatcmpl-1", "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": tokens}}
    head = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    return ([head, ev(0, None, "")] + [ev(i) for i in range(tokens - 1)] + [ev(tokens - 1, "length")]
            + [chunk(b"data: " + json.dumps(usage, separators=seps).encode() + b"\n\n"),
               chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"])


def cost(mod: ModuleType, reads: list[bytes], n: int) -> tuple[float, float]:
    """(µs per chunk on arrival, ms per response at its end) for one batch of n responses."""
    t = time.process_time()
    parsers = []
    for _ in range(n):
        p = mod.ResponseParser() if hasattr(mod, "ResponseParser") else mod.Response()
        for k, r in enumerate(reads):
            p.feed(k * 0.02, r)
        parsers.append(p)
    t1 = time.process_time()
    for p in parsers:
        f = p.facts()
    t2 = time.process_time()
    assert sum(f.chunk_n) == 100 and f.output_tokens == 100 and f.finish_reason == "length"
    return (t1 - t) / n / len(reads) * 1e6, (t2 - t1) / n * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", type=Path, help="an older sse.py to compare with")
    ap.add_argument("--reps", type=int, default=25)
    ap.add_argument("--responses", type=int, default=100, help="responses per timed batch")
    a = ap.parse_args()
    from servedeck.loadgen import response

    parsers: dict[str, ModuleType] = {"current": response}
    if a.baseline:
        parsers["baseline"] = load("sse_baseline", a.baseline)
    out = {}
    for label, seps, cont in (("compact JSON", (",", ":"), False), ("JSON with spaces", (", ", ": "), False),
                              ("continuous usage", (",", ":"), True)):
        reads = stream(seps, continuous=cont)
        best = {k: [float("inf"), float("inf")] for k in parsers}
        for _ in range(a.reps):
            for k, mod in parsers.items():
                arrive, end = cost(mod, reads, a.responses)
                best[k] = [min(best[k][0], arrive), min(best[k][1], end)]
        for k in parsers:
            print(f"{label:17s} {k:8s}: {best[k][0]:6.2f} µs per chunk as it arrives; "
                  f"{best[k][1]:6.3f} ms per 100-token response at its end")
            out[f"{label}/{k}"] = best[k]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
