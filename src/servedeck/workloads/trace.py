"""The trace workload: replay a recorded trace open loop, on its own schedule.

Two formats, told apart by the file's first line:

    Mooncake's JSONL    {"timestamp": 0, "input_length": 812, "output_length": 32, "hash_ids": [0, 1]}
                        timestamp: ms from the trace's start; input_length and output_length: prompt and answer
                        tokens; hash_ids (optional): the ids of the prompt's blocks of `block_tokens` tokens, in
                        order: two requests whose hash_ids begin alike share exactly that prefix
    Azure's CSV         TIMESTAMP,ContextTokens,GeneratedTokens (the Azure LLM inference traces of 2023 and 2024,
                        github.com/Azure/AzurePublicDataset): TIMESTAMP a date and time
                        (2023-11-16 18:15:46.6805900), the tokens of the prompt and of the answer; no blocks, so
                        every prompt is its own

Either is read and checked whole before anything launches: a line that does not parse or lacks a field is
refused naming the line and the field.

Request i is sent at start + timestamp_i × time_scale, whatever the earlier ones are doing. `length_scale` fits
a trace recorded on a large server to a small one: every input and output length × it, and the blocks with
them (block_tokens × it), so a request keeps its blocks and what it shares with the others. Its prompt is built
from its hash_ids: block b is always the same text (its own tag, then real text from a place fixed by b), sized
with the server's tokenizer to the block's tokens, the blocks in the request's order, cut or extended (with
text of its own) so the server counts the trace's input length, its chat template included; so requests
sharing a block id share exactly that prefix, and nothing else. Answers are asked at output_length with
ignore_eos, as the trace says. Every request is one line of requests.jsonl (prompt_index: its line in the
trace; prompt_tokens_expected: the length the trace asked), and the point's figures say how close the server's
count came (`length_fit`), with a warning where a prompt missed by more than 5 %.
"""

from __future__ import annotations

import asyncio
import csv
import io
import json
import random
import time
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, ClassVar, Optional

from servedeck.config.schema import merge_request
from servedeck.errors import ServerDied, UsageError
from servedeck.gates.server import ServerTokens
from servedeck.loadgen import texts
from servedeck.loadgen.api import ApiClient
from servedeck.loadgen.prompts import TooShort, _tag, fit_length, new_nonce, seeded_nonce
from servedeck.loadgen.records import RequestRecord
from servedeck.loadgen.schedule import sleep_until
from servedeck.runs.folder import RunFolder
from servedeck.timeparse import seconds
from servedeck.workloads import options as O
from servedeck.workloads.points import finish_point, put_point
from servedeck.workloads.reporter import Reporter
from servedeck.workloads.shape import Entry, Key, Kind, Option
from servedeck.workloads.target import Target
from servedeck.workloads.window import calibrate, engine_window, keep

FIELDS = ("timestamp", "input_length", "output_length")
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
FORMATS = {"jsonl": "Mooncake's JSONL", "azure-csv": "the Azure LLM inference trace's CSV"}
FIT_TOLERANCE = 0.05  # a prompt further than this from the trace's length (and more than FIT_SLACK tokens) is a miss
FIT_SLACK = 4  # tokens: a few either way is a chat template's rounding, not a miss
CHECKED = 4  # prompts counted with the server's tokenizer before the replay starts


# --- reading a trace -----------------------------------------------------------------------------

@dataclass(frozen=True)
class TraceRow:
    line: int  # in the file, from 1
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...] = ()


def sniff(text: str) -> str:
    """Which format a trace's text is in: "jsonl" or "azure-csv" (by its first line)."""
    first = next((ln for ln in text.splitlines() if ln.strip()), "")
    cols = [c.strip().strip('"').lower() for c in first.split(",")]
    return "azure-csv" if [c.lower() for c in AZURE_COLUMNS] == cols[:3] else "jsonl"


def read_trace(path: Path, window_s: Optional[float] = None) -> list[TraceRow]:
    """The trace's rows in arrival order, those within `window_s` of its first request (None: all)."""
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        why = e.strerror if isinstance(e, OSError) else "not text"
        raise UsageError(f"--trace {path}: cannot read it ({why})",
                         hint="give the path of a JSONL trace or an Azure trace's CSV") from None
    rows = _azure(path, text) if sniff(text) == "azure-csv" else _jsonl(path, text)
    if not rows:
        raise UsageError(f"{path}: no request in it", hint="one JSON object a line, or the Azure CSV's rows")
    rows.sort(key=lambda r: r.timestamp_ms)
    if window_s is not None:
        first = rows[0].timestamp_ms
        rows = [r for r in rows if r.timestamp_ms - first < window_s * 1000]
    return rows


def _jsonl(path: Path, text: str) -> list[TraceRow]:
    rows: list[TraceRow] = []
    for n, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            doc = json.loads(raw)
        except ValueError as e:
            raise UsageError(f"{path}: line {n} is not JSON ({e.msg})",
                             hint='one object a line: {"timestamp": 0, "input_length": 512, "output_length": 32}, '
                                  "or the Azure LLM inference trace's CSV (its header: "
                                  f"{','.join(AZURE_COLUMNS)})") from None
        if not isinstance(doc, dict):
            raise UsageError(f"{path}: line {n} is not a JSON object", hint='one JSON object a line: {"timestamp": 0, "input_length": 900, "output_length": 120, '
                                                                           '"hash_ids": [0, 1]} (timestamp in ms from the start; hash_ids: '
                                                                           'blocks of shared prompt)')
        for key in FIELDS:
            if key not in doc:
                raise UsageError(f"{path}: line {n} lacks {key!r}", hint=f"every line has {', '.join(FIELDS)}")
        ts, inp, out, ids = doc["timestamp"], doc["input_length"], doc["output_length"], doc.get("hash_ids", [])
        if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0:
            raise UsageError(f"{path}: line {n}: timestamp {ts!r} is not milliseconds ≥ 0", hint="e.g. 1500")
        _lengths(path, n, (("input_length", inp), ("output_length", out)))
        if not isinstance(ids, list) or any(isinstance(i, bool) or not isinstance(i, int) for i in ids):
            raise UsageError(f"{path}: line {n}: hash_ids {ids!r} is not a list of whole numbers", hint="e.g. [0, 1, 7]")
        rows.append(TraceRow(n, float(ts), inp, out, tuple(ids)))
    return rows


def _lengths(path: Path, n: int, pairs: tuple[tuple[str, Any], ...]) -> None:
    for key, v in pairs:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(f"{path}: line {n}: {key} {v!r} is not a whole number ≥ 1", hint="tokens, e.g. 512")


def _azure(path: Path, text: str) -> list[TraceRow]:
    """The Azure LLM inference trace's CSV: its header, then TIMESTAMP,ContextTokens,GeneratedTokens a row."""
    reader = csv.reader(io.StringIO(text))
    rows: list[TraceRow] = []
    start: Optional[datetime] = None
    for n, cells in enumerate(reader, 1):
        if n == 1 or not any(c.strip() for c in cells):
            continue  # the header (sniff read it), blank lines
        if len(cells) < 3:
            raise UsageError(f"{path}: line {n} has {len(cells)} columns, not {', '.join(AZURE_COLUMNS)}",
                             hint="the Azure trace's rows: 2023-11-16 18:15:46.6805900,374,44")
        stamp = _when(path, n, cells[0].strip())
        try:
            inp, out = int(cells[1]), int(cells[2])
        except ValueError:
            raise UsageError(f"{path}: line {n}: ContextTokens {cells[1]!r} or GeneratedTokens {cells[2]!r} is not "
                             "a whole number", hint="tokens, e.g. 374") from None
        _lengths(path, n, (("ContextTokens", inp), ("GeneratedTokens", out)))
        start = stamp if start is None or stamp < start else start
        rows.append(TraceRow(n, stamp.timestamp() * 1000, inp, out))
    if start is not None:  # milliseconds from the first request, as the JSONL traces count them
        first = start.timestamp() * 1000
        rows = [replace(r, timestamp_ms=r.timestamp_ms - first) for r in rows]
    return rows


def _when(path: Path, n: int, text: str) -> datetime:
    """Azure's TIMESTAMP: a date and a time with up to 7 digits of seconds (100 ns ticks)."""
    head, dot, frac = text.partition(".")
    try:
        # datetime takes 6 digits of fraction; the seventh (100 ns) is below anything a replay keeps
        return datetime.fromisoformat(head + (dot + (frac + "000000")[:6] if dot else ""))
    except ValueError:
        raise UsageError(f"{path}: line {n}: TIMESTAMP {text!r} is not a date and time",
                         hint="the Azure trace writes them like 2023-11-16 18:15:46.6805900") from None


# --- the spec ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TraceSpec:
    kind: ClassVar[str] = "trace"
    path: Path
    time_scale: float = 1.0  # 0.5: twice as fast as recorded
    window_s: Optional[float] = None  # only the first so many seconds of the trace
    block_tokens: int = 512  # tokens per hash_ids block (Mooncake's traces: 512)
    content: str = "prose"
    seed: Optional[int] = None
    request_timeout_s: Optional[float] = 600.0
    length_scale: float = 1.0  # every input and output length, and the blocks, × this
    rows: tuple[TraceRow, ...] = field(default=(), repr=False, compare=False)  # read by `fitted`

    @property
    def scaled_block(self) -> int:
        return max(1, round(self.block_tokens * self.length_scale))

    def check(self) -> list[TraceRow]:
        """Every rule, and the trace read whole (its lengths × length_scale): before anything launches."""
        self.check_options()
        return [self.scaled(r) for r in read_trace(self.path, self.window_s)]

    def scaled(self, row: TraceRow) -> TraceRow:
        if self.length_scale == 1.0:
            return row
        return replace(row, input_length=max(1, round(row.input_length * self.length_scale)),
                       output_length=max(1, round(row.output_length * self.length_scale)))

    def check_options(self) -> None:
        """The rules that need no file."""
        if not self.time_scale > 0:
            raise UsageError(f"--time-scale must be above 0, got {self.time_scale:g}",
                             hint="1 replays the trace as recorded, 0.5 twice as fast")
        if self.window_s is not None and self.window_s <= 0:
            raise UsageError(f"--window must be above 0, got {self.window_s:g} s", hint="e.g. --window 10m")
        if self.block_tokens < 16:
            raise UsageError(f"--block-tokens must be at least 16, got {self.block_tokens}", hint="Mooncake's: 512")
        if not 0 < self.length_scale <= 1:
            raise UsageError(f"--length-scale must be above 0 and at most 1, got {self.length_scale:g}",
                             hint="0.1 sends every prompt and answer at a tenth of the trace's length")
        if self.scaled_block < 16:
            raise UsageError(f"--block-tokens {self.block_tokens} × --length-scale {self.length_scale:g} leaves "
                             f"{self.scaled_block}-token blocks: below 16, a block would be mostly its unique tag",
                             hint=f"raise --length-scale to {16 / self.block_tokens:.3g} or more")
        if self.content == "random":
            raise UsageError("a trace's prompts are real text; --content random is not for it",
                             hint="--content prose (default) or --content code")

    def to_json(self) -> dict[str, Any]:
        try:
            fmt = sniff(self.path.read_text()[:4096])
        except (OSError, UnicodeDecodeError):
            fmt = None
        return {"workload": "trace", "points": [f"trace {self.path.name}"], "trace": str(self.path), "format": fmt,
                "time_scale": self.time_scale, "window_s": self.window_s, "block_tokens": self.block_tokens,
                "length_scale": self.length_scale, "content": self.content, "seed": self.seed,
                "request_timeout_s": self.request_timeout_s, "warmup": 0, "api": "chat", "ignore_eos": True,
                **({"requests": len(self.rows)} if self.rows else {})}


# --- its prompts -----------------------------------------------------------------------------------

class Prompts:
    """A trace's prompts, sized with the server's tokenizer so that the server counts each row's input_length, its
    chat template included, and two rows share exactly the blocks the trace says they share.

    The trace's blocks are positions in the token sequence the server prefills: block j is tokens [j·B, (j+1)·B).
    The chat template's opening comes first in every sequence, so it takes the start of block 0; each block's own
    text fills the rest of it (block 0: B less the template, the others B). Block b is always the same text (its
    own tag, then real text from a place fixed by b), fitted once to its tokens; a row is its blocks in order, cut
    where its input_length ends (the start of a block is a prefix of that block), then text of its own (its own
    tag first) for what its blocks do not cover. A tag is hex digits, dense in tokens: text sized by characters
    alone comes out long, and more so the smaller the blocks (issue 31: a by-hand scaled Mooncake trace asked
    41,027 tokens and sent 52,374)."""

    def __init__(self, spec: TraceSpec, tokens: ServerTokens, nonce: str, base: int) -> None:
        self.spec, self.tokens, self.nonce, self.base = spec, tokens, nonce, base
        self.content = spec.content
        self.size = spec.scaled_block
        self.blocks: dict[tuple[int, int], asyncio.Future[str]] = {}
        self.gate = asyncio.Semaphore(8)  # tokenizer calls in flight
        self.bare, self.cpt = 0, 1.0

    async def start(self) -> None:
        self.bare = await self.tokens.count_chat([{"role": "user", "content": ""}])
        self.cpt = await calibrate(self.tokens, self.content, self.base, self.size)  # type: ignore[arg-type]
        self.stride = int(self.size * self.cpt * 2) + 64  # block b's text starts here × b: never another's

    def own_tokens(self, j: int) -> int:
        """Tokens of block position j that are its text: what the template's opening leaves of it."""
        return max(0, (j + 1) * self.size - max(j * self.size, self.bare))

    async def count(self, text: str) -> int:
        """Tokens of `text` as one message's content (the template around it not counted)."""
        async with self.gate:
            return await self.tokens.count_chat([{"role": "user", "content": text}]) - self.bare

    async def _fit(self, head: str, start: int, tokens: int) -> str:
        try:
            text, _ = await fit_length(lambda k: head + texts.piece(self.content, start, k), tokens, self.count,
                                       units_per_token=self.cpt, what="unique tag")
        except TooShort:  # less room than the tag: the tag alone (a few tokens over, the price of uniqueness)
            return head
        return text

    async def block(self, b: int, tokens: int) -> str:
        key = (b, tokens)  # a block at position 0 is shorter (the template takes its start)
        if key not in self.blocks:
            self.blocks[key] = asyncio.ensure_future(self._fit(_tag(self.nonce, "measured", b),
                                                               self.base + b * self.stride, tokens))
        return await self.blocks[key]

    async def prompt(self, row: TraceRow) -> str:
        left = max(1, row.input_length - self.bare)  # tokens of the message itself
        out = []
        for j, b in enumerate(row.hash_ids):
            size = self.own_tokens(j)
            if size == 0:
                continue  # the template's opening covers this block
            text = await self.block(b, size)
            if size > left:  # the trace cut this block short: its start
                cut, _ = await fit_length(lambda k: text[:k], left, self.count, units_per_token=self.cpt)
                return "".join(out) + cut
            out.append(text)
            left -= size
            if left == 0:
                return "".join(out)
        # text of its own for the rest, unique to the row (a row of blocks alone needs no tag when little is left)
        tag = _tag(self.nonce, "warmup", row.line)
        start = texts.start_of(self.content, random.Random(f"{self.spec.seed}/{self.nonce}/{row.line}"))
        own = await self._fit(tag, start, left)
        return "".join(out) + ("" if own == tag and out else own)


def fit(records: list[RequestRecord]) -> tuple[dict[str, Any], dict[str, Any]]:
    """How close the server's prompt counts came to the lengths the trace asked (pure): a warning where a prompt
    missed by more than FIT_TOLERANCE (and FIT_SLACK tokens)."""
    pairs = [(r.prompt_tokens, r.prompt_tokens_expected) for r in records
             if r.kind == "measured" and isinstance(r.prompt_tokens, int) and isinstance(r.prompt_tokens_expected, int)
             and r.prompt_tokens_expected > 0]
    if not pairs:
        return {}, {}
    got, want = sum(p[0] for p in pairs), sum(p[1] for p in pairs)
    missed = [(g, w) for g, w in pairs if abs(g - w) > max(FIT_TOLERANCE * w, FIT_SLACK)]
    worst = max(pairs, key=lambda p: abs(p[0] / p[1] - 1))
    figures: dict[str, Any] = {"length_fit": {
        "requests": len(pairs), "prompt_tokens": got, "expected_tokens": want, "ratio": got / want,
        "missed": len(missed), "tolerance": FIT_TOLERANCE, "worst": {"counted": worst[0], "expected": worst[1]}}}
    if missed:
        figures["warnings"] = [
            f"{len(missed)} of {len(pairs)} prompts missed the trace's length by more than {FIT_TOLERANCE:.0%}: "
            f"{got:,} prompt tokens against the {want:,} the trace asked ({got / want - 1:+.0%}); the worst "
            f"{worst[0]:,} against {worst[1]:,}"]
    return figures, {}


# --- the replay ---------------------------------------------------------------------------------------

async def run_trace(spec: TraceSpec, rows: list[TraceRow], target: Target, folder: RunFolder,
                    reporter: Reporter) -> dict[str, Any]:
    rng = random.Random(spec.seed)
    nonce = seeded_nonce(spec.seed, 0) if spec.seed is not None else new_nonce()
    content = spec.content
    point: dict[str, Any] = {"index": 0, "label": f"trace {spec.path.name}", "nonce": nonce, "status": "running",
                             "shape": {"trace": str(spec.path), "time_scale": spec.time_scale, "requests": len(rows),
                                       "length_scale": spec.length_scale}}
    put_point(folder, point)
    records: list[RequestRecord] = []
    async with ApiClient(target.base_url) as api:
        tokens = ServerTokens(api, target.served_name, target.engine)
        reporter.stage("trace: sizing prompts with the server's tokenizer")
        sizer = Prompts(spec, tokens, nonce, texts.start_of(content, rng))  # type: ignore[arg-type]
        await sizer.start()
        prompts = list(await asyncio.gather(*(sizer.prompt(r) for r in rows)))
        checked = await _check_sizes(rows, prompts, tokens)
        point["prompts"] = {"sized_by": "server tokenizer: each block fitted to its tokens, each row's rest to what "
                                        "is left; a sample counted whole", "chars_per_token": round(sizer.cpt, 4),
                            "block_tokens": sizer.size, "blocks": len(sizer.blocks), "content": content,
                            "checked": checked}
        off = [c for c in checked if abs(c["counted"] - c["expected"]) > max(FIT_TOLERANCE * c["expected"], FIT_SLACK)]
        if off:
            reporter.stage(f"trace: {len(off)} of {len(checked)} prompts counted before the replay miss the trace's "
                           f"length by more than {FIT_TOLERANCE:.0%} (line {off[0]['line']}: {off[0]['counted']} "
                           f"against {off[0]['expected']} tokens)")

        async def send(row: TraceRow, prompt: str) -> None:
            due = start + (row.timestamp_ms - rows[0].timestamp_ms) / 1000 * spec.time_scale
            await sleep_until(due)  # not a delay: uvloop's timer wakes up to 0.42 ms early
            body = merge_request({"model": target.served_name, "messages": [{"role": "user", "content": prompt}],
                                  "max_tokens": row.output_length, "ignore_eos": True, "temperature": 0,
                                  "stream": True, "stream_options": {"include_usage": True}}, target.request)
            reply = await api.chat(body, timeout_s=spec.request_timeout_s)
            rec = reply.record
            rec.id, rec.kind, rec.prompt_index = f"{nonce}-l{row.line}", "measured", row.line
            rec.prompt_tokens_expected = row.input_length
            keep(folder, records, rec, start, due)
            reporter.stage(f"trace line {row.line}: {rec.status}, cached {rec.cached_tokens}/{rec.prompt_tokens}")

        async with engine_window(target, folder, point) as window:
            start = time.perf_counter() + 0.05
            try:
                await asyncio.gather(*(send(r, p) for r, p in zip(rows, prompts)))
                point["status"] = "ok"
            finally:
                point["load"] = window.load(start)
    finish_point(folder, point, records, spec.to_json(), fit)
    reporter.point_done(point["label"], point)
    if window.death is not None:
        raise ServerDied(f"{window.death} (during the trace, after {len(records)} requests)")
    return point


async def _check_sizes(rows: list[TraceRow], prompts: list[str], tokens: ServerTokens) -> list[dict[str, Any]]:
    """The first, the longest and a few more prompts counted whole, as the server will count them."""
    picks = sorted({0, max(range(len(rows)), key=lambda i: rows[i].input_length),
                    *range(0, len(rows), max(1, len(rows) // (CHECKED - 1)))})[:CHECKED + 1]
    out = []
    for i in picks:
        n = await tokens.count_chat([{"role": "user", "content": prompts[i]}])
        out.append({"line": rows[i].line, "expected": rows[i].input_length, "counted": n})
    return out


# --- the trace as a kind ---------------------------------------------------------------------------------

def fitted(spec: TraceSpec, target: Target, ctx: int) -> TraceSpec:
    rows = spec.check()
    big = max(rows, key=lambda r: r.input_length + r.output_length)
    if big.input_length + big.output_length > ctx:
        scaled = f" (× --length-scale {spec.length_scale:g})" if spec.length_scale != 1 else ""
        raise UsageError(f"{spec.path}: line {big.line} asks {big.input_length} + {big.output_length} tokens{scaled}, "
                         f"above the server's context of {ctx}",
                         hint="serve a larger context, --length-scale to fit the trace to this one, or --window to a "
                              "part without it")
    return replace(spec, rows=tuple(rows))


async def run(spec: TraceSpec, target: Target, ctx: int, folder: RunFolder, reporter: Reporter) -> Optional[str]:
    point = await run_trace(spec, list(spec.rows) or spec.check(), target, folder, reporter)
    counts = point["figures"]["counts"]
    return f"requests failed: {counts['error']} of {counts['measured']}" if counts["error"] else None


OPTIONS = (
    Option("trace_file", ("--trace",), Optional[str], None, "trace: a JSONL trace (timestamp ms, input_length, "
           "output_length, hash_ids) or an Azure LLM inference trace's CSV (TIMESTAMP, ContextTokens, GeneratedTokens)"),
    Option("time_scale", ("--time-scale",), float, 1.0, "trace: its gaps × this (0.5: twice as fast)"),
    Option("window", ("--window",), Optional[str], None, "trace: only its first stretch, e.g. 10m"),
    Option("block_tokens", ("--block-tokens",), int, 512, "trace: tokens per hash_ids block (Mooncake's: 512)"),
    Option("length_scale", ("--length-scale",), float, 1.0, "trace: every prompt and answer length × this, the "
           "blocks with them (0.1 fits a trace recorded at 32K prompts to a 4K server)"),
    O.CONTENT, O.SEED, O.REQUEST_TIMEOUT,
)
TRACE_KEYS = ("trace", "time_scale", "window", "block_tokens", "length_scale")
KEYS = (Key("trace", Optional[str]), Key("time_scale", Optional[float]), Key("window", Optional[str]),
        Key("block_tokens", Optional[int]), Key("length_scale", Optional[float]))


def from_options(o: Any) -> TraceSpec:
    if not o.get("trace_file"):
        raise UsageError("--workload trace replays a file: give --trace FILE",
                         hint='a JSONL file, one request a line: {"timestamp": 0, "input_length": 900, "output_length": 120, '
                              '"hash_ids": [0, 1]} (timestamp in ms; hash_ids: blocks of shared prompt)')
    spec = TraceSpec(path=Path(o["trace_file"]), time_scale=o.get("time_scale", 1.0),
                     block_tokens=o.get("block_tokens", 512), length_scale=o.get("length_scale", 1.0),
                     window_s=seconds(o["window"], "--window") if o.get("window") else None,
                     content=o.get("content") or "prose", seed=o.get("seed"),
                     request_timeout_s=O.request_timeout(o, 600.0))
    spec.check()  # the trace read whole, before any launch
    return spec


def trace_spec(w: Any, base: Path, check: bool = True) -> TraceSpec:
    """A kind = "trace" entry → the TraceSpec `servedeck bench --workload trace` would run; `trace` relative to
    `base` (the campaign file's folder). `check`: the rules, and the trace read whole."""
    path = Path(w.trace)
    spec = TraceSpec(path=path if path.is_absolute() else base / path,
                     time_scale=1.0 if w.time_scale is None else w.time_scale,
                     window_s=seconds(w.window, "--window") if w.window else None,
                     block_tokens=512 if w.block_tokens is None else w.block_tokens,
                     length_scale=1.0 if w.length_scale is None else w.length_scale, seed=w.seed)
    if check:
        spec.check()
    else:  # the rules that need no file
        spec.check_options()
    return spec


def check_entry(w: Any) -> None:
    """The keys' rules; the file itself is read by `file_problems`, which knows where the campaign file is."""
    if w.trace is None:
        raise ValueError("a trace workload replays a file: give trace = \"PATH.jsonl\" "
                         "(one JSON object a line: timestamp ms, input_length, output_length, hash_ids)")
    if w.concurrency or w.rate:
        raise ValueError("a trace's schedule is its own: drop concurrency/rate (time_scale = 0.5 replays it "
                         "twice as fast)")
    O.entry_rules(lambda: trace_spec(w, Path("."), check=False), TRACE_KEYS)


def file_problems(w: Any, i: int, where: Entry) -> list[str]:
    """The trace file, read whole: one line per problem, naming the workload and the file."""
    if w.trace is None or not where.read_files:
        return []
    try:
        trace_spec(w, where.base)
    except UsageError as e:
        return [f"workloads.{i}.trace: {e.message}"]
    return []


def describe(w: dict[str, Any]) -> str:
    fmt = FORMATS.get(w.get("format") or "", "a trace")
    scale = (f"; every prompt and answer × {w['length_scale']:g}, blocks of {w.get('block_tokens')} × "
             f"{w['length_scale']:g} tokens" if w.get("length_scale") not in (None, 1, 1.0)
             else f"; blocks of {w.get('block_tokens')} tokens")
    return (f"workload **trace** {w.get('trace')} ({fmt}"
            + (f", {w['requests']} requests" if w.get("requests") else "") + "): replayed on its own schedule × "
            f"{w.get('time_scale')}" + (f", its first {w['window_s']:g} s" if w.get("window_s") else "")
            + f"{scale}; {w.get('content')} text after a unique tag per block; answers at the trace's lengths "
            "(ignore_eos).")


KIND = Kind(
    name="trace", help="--trace FILE replayed on its own schedule",
    options=OPTIONS, from_options=from_options,
    keys=KEYS, check_entry=check_entry, file_problems=file_problems,
    from_entry=lambda w, where: [trace_spec(w, where.base, check=False)],
    fitted=fitted, run=run,
    point_figures=fit, describe=describe,
)
