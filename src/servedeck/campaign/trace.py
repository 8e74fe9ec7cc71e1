"""The trace workload: replay a JSONL trace (loadgen/trace.py's format) open loop, on its own schedule.

Request i is sent at start + timestamp_i × time_scale, whatever the earlier ones are doing. Its prompt
is built from its hash_ids: block b is always the same text (its own tag, then `block_tokens` tokens of
real text from a place fixed by b), the blocks in the request's order, cut or extended (with text of
its own) to input_length; so requests sharing a block id share exactly that prefix, and nothing else.
A request without hash_ids is unique. Answers are asked at output_length with ignore_eos, as the trace
says. Every request is one line of requests.jsonl (prompt_index: its line in the trace).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from servedeck.campaign.bench import _finish_point, _put_point
from servedeck.campaign.conversations import _calibrate
from servedeck.campaign.reporter import QuietReporter, Reporter
from servedeck.campaign.session import Outcome, _finish, _gate_or_inherit, _guarded, _open_run, _served_context
from servedeck.campaign.target import Target
from servedeck.campaign.window import engine_window, to_run_clock
from servedeck.config.schema import merge_request
from servedeck.errors import ServerDied, UsageError
from servedeck.gates.niah import GateSpec
from servedeck.gates.server import ServerTokens
from servedeck.loadgen import texts
from servedeck.loadgen.api import ApiClient
from servedeck.loadgen.prompts import _tag, new_nonce, seeded_nonce
from servedeck.loadgen.records import RequestRecord
from servedeck.loadgen.trace import TraceRow, read_trace
from servedeck.runs.folder import RunFolder


@dataclass(frozen=True)
class TraceSpec:
    path: Path
    time_scale: float = 1.0  # 0.5: twice as fast as recorded
    window_s: Optional[float] = None  # only the first so many seconds of the trace
    block_tokens: int = 512  # tokens per hash_ids block (Mooncake's traces: 512)
    content: str = "prose"
    seed: Optional[int] = None
    request_timeout_s: Optional[float] = 600.0

    def check(self) -> list[TraceRow]:
        """Every rule, and the trace read whole: before anything launches."""
        self.check_options()
        return read_trace(self.path, self.window_s)

    def check_options(self) -> None:
        """The rules that need no file."""
        if not self.time_scale > 0:
            raise UsageError(f"--time-scale must be above 0, got {self.time_scale:g}",
                             hint="1 replays the trace as recorded, 0.5 twice as fast")
        if self.window_s is not None and self.window_s <= 0:
            raise UsageError(f"--window must be above 0, got {self.window_s:g} s", hint="e.g. --window 10m")
        if self.block_tokens < 16:
            raise UsageError(f"--block-tokens must be at least 16, got {self.block_tokens}", hint="Mooncake's: 512")
        if self.content == "random":
            raise UsageError("a trace's prompts are real text; --content random is not for it",
                             hint="--content prose (default) or --content code")

    def to_json(self) -> dict[str, Any]:
        return {"workload": "trace", "points": [f"trace {self.path.name}"], "trace": str(self.path),
                "time_scale": self.time_scale, "window_s": self.window_s, "block_tokens": self.block_tokens,
                "content": self.content, "seed": self.seed, "request_timeout_s": self.request_timeout_s,
                "warmup": 0, "api": "chat", "ignore_eos": True}


def prompt_of(row: TraceRow, block_text: Any, own_text: Any, cpt: float) -> str:
    """The prompt of one trace row (pure): its blocks' texts in order, cut or extended to input_length."""
    want = int(row.input_length * cpt)
    text = "".join(block_text(b) for b in row.hash_ids)
    if len(text) >= want:
        return text[:want]
    return text + own_text(row.line, want - len(text))


async def run_trace(spec: TraceSpec, rows: list[TraceRow], target: Target, folder: RunFolder,
                    reporter: Reporter) -> dict[str, Any]:
    rng = random.Random(spec.seed)
    nonce = seeded_nonce(spec.seed, 0) if spec.seed is not None else new_nonce()
    content = spec.content
    point: dict[str, Any] = {"index": 0, "label": f"trace {spec.path.name}", "nonce": nonce, "status": "running",
                             "shape": {"trace": str(spec.path), "time_scale": spec.time_scale, "requests": len(rows)}}
    _put_point(folder, point)
    records: list[RequestRecord] = []
    async with ApiClient(target.base_url) as api:
        tokens = ServerTokens(api, target.served_name, target.engine)
        reporter.stage("trace: sizing prompts with the server's tokenizer")
        base = texts.start_of(content, rng)  # type: ignore[arg-type]
        cpt = await _calibrate(tokens, content, base, spec.block_tokens)  # type: ignore[arg-type]
        chars = int(spec.block_tokens * cpt)

        def block_text(b: int) -> str:
            tag = _tag(nonce, "measured", b)
            return tag + texts.piece(content, base + b * chars, chars - len(tag))

        def own_text(line: int, n: int) -> str:
            tag = _tag(nonce, "warmup", line)
            return tag + texts.piece(content, base + rng.randrange(10**6), max(0, n - len(tag)))

        prompts = [prompt_of(r, block_text, own_text, cpt) for r in rows]
        point["prompts"] = {"sized_by": "server tokenizer, calibrated chars/token (approximate)",
                            "chars_per_token": round(cpt, 4), "content": content}

        async def send(row: TraceRow, prompt: str) -> None:
            due = start + (row.timestamp_ms - rows[0].timestamp_ms) / 1000 * spec.time_scale
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            body = merge_request({"model": target.served_name, "messages": [{"role": "user", "content": prompt}],
                                  "max_tokens": row.output_length, "ignore_eos": True, "temperature": 0,
                                  "stream": True, "stream_options": {"include_usage": True}}, target.request)
            reply = await api.chat(body, timeout_s=spec.request_timeout_s)
            rec = reply.record
            rec.id, rec.kind, rec.prompt_index = f"{nonce}-l{row.line}", "measured", row.line
            to_run_clock(rec, start, due)
            line = rec.to_json()
            folder.request({"point": 0, **line})
            records.append(RequestRecord.from_json(line))
            reporter.stage(f"trace line {row.line}: {rec.status}, cached {rec.cached_tokens}/{rec.prompt_tokens}")

        async with engine_window(target, folder, point) as window:
            start = time.perf_counter() + 0.05
            try:
                await asyncio.gather(*(send(r, p) for r, p in zip(rows, prompts)))
                point["status"] = "ok"
            finally:
                point["load"] = window.load(start)
    _finish_point(folder, point, records, spec)  # type: ignore[arg-type]
    reporter.point_done(point["label"], point)
    if window.death is not None:
        raise ServerDied(f"{window.death} (during the trace, after {len(records)} requests)")
    return point


async def trace(target: Target, spec: TraceSpec, *, gate_mode: Optional[bool] = None,
                gate_spec: Optional[GateSpec] = None, reporter: Optional[Reporter] = None,
                outcome: Optional[Outcome] = None) -> Outcome:
    """`servedeck bench MODEL --workload trace --trace FILE`: gate (as bench), then the trace, one run folder."""
    outcome = outcome or Outcome(target=target)
    reporter = reporter or QuietReporter()
    rows = spec.check()
    ctx = await _served_context(target)
    big = max(rows, key=lambda r: r.input_length + r.output_length)
    if big.input_length + big.output_length > ctx:
        raise UsageError(f"{spec.path}: line {big.line} asks {big.input_length} + {big.output_length} tokens, above "
                         f"the server's context of {ctx}", hint="serve a larger context, or --window to a part without it")
    folder, gate_spec_, inherited = _open_run(target, ctx, spec.to_json(), gate_spec or GateSpec(context=0),
                                              gate_mode, outcome, prompt_seed=spec.seed)

    async def work() -> None:
        await _gate_or_inherit(folder, target, gate_mode, gate_spec_, inherited, reporter, outcome)
        point = await run_trace(spec, rows, target, folder, reporter)
        counts = point["figures"]["counts"]
        _finish(folder, "failed" if counts["error"] else "ok",
                f"requests failed: {counts['error']} of {counts['measured']}" if counts["error"] else None)

    await _guarded(folder, work())
    return outcome
