"""The conversation ramp: one chat grown turn by turn toward the context limit.

Each turn appends the next stretch of real text (sized by the server's tokenizer) and a question;
the model's answers stay in the history exactly as they came (content only: reasoning text is
not sent back, as the soak learned). Turn 1 plants a 7-digit access code after the run's unique
tag; every `needle_every` turns the question asks for it back. One line per turn goes to
ramp.jsonl the moment the turn ends:

    context_tokens   prompt tokens of the turn, by the server's count (usage)
    new_tokens       of those, the ones not served from the prefix cache
    cached_share     cached / context (usage or llama.cpp timings; else the engine's counters)
    ttft_s           send → first token (content or reasoning)
    prefill_tok_s    new_tokens / ttft_s: the speed of prefilling the part the cache did not hold
    decode_tok_s     (completion tokens − 1) / (end − first token)
    needle           on recall turns: asked, found, the answer

It stops at the first of: the next turn would not fit (`max_context`), the time cap, a failed,
stalled or timed-out turn, or a needle miss with `stop_on_miss`; the cut-off and its reason go
into summary.json. The time cap also ends a turn still in flight when it passes: that turn is kept in
ramp.jsonl as `time-capped` and left out of the figures ("the last turn hit the run's time cap and is
excluded", as seed 000 reported its ramp to 1M).

`servedeck ramp MODEL`, `servedeck bench MODEL --workload ramp` and a campaign file's `kind = "ramp"`
(turn_tokens, answer_tokens, max_context, needle_every, time_cap, turn_timeout, stop_on_miss, seed) run
the same spec.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Optional

from servedeck.config.schema import merge_request
from servedeck.engines.metrics import prefix_counters_async
from servedeck.errors import UsageError
from servedeck.fsio import read_jsonl
from servedeck.gates.server import ServerTokens
from servedeck.loadgen import texts
from servedeck.loadgen.api import ApiClient
from servedeck.loadgen.prompts import _tag, chars_per_token, fit_length, new_nonce
from servedeck.loadgen.texts import Content
from servedeck.mdtable import table
from servedeck.runs.folder import RunFolder
from servedeck.telemetry.point import sampled_stretch
from servedeck.workloads import options as O
from servedeck.workloads.options import ContentChoice
from servedeck.workloads.reporter import Reporter
from servedeck.workloads.shape import Key, Kind, Option
from servedeck.workloads.stall import Quiet, StallWatch
from servedeck.workloads.target import Target

FILE = "ramp.jsonl"
CAPPED = "time-capped"  # a turn the run's time cap ended: kept in ramp.jsonl, left out of every figure
NEEDLE_ANSWER_TOKENS = 32  # a needle turn's answer room at least (the gate's default answer_tokens)
SUMMARY_Q = "In one sentence, what is the text above about?"
NEEDLE_Q = ("What is the access code I gave you at the very start of this conversation? "
            "Answer with the 7 digits only.")


@dataclass(frozen=True)
class RampSpec:
    kind: ClassVar[str] = "ramp"
    turn_tokens: int = 2000
    answer_tokens: int = 64
    max_context: Optional[int] = None  # None: what the server serves per request
    needle_every: int = 4  # 0: never ask
    time_cap_s: Optional[float] = 7200.0
    turn_timeout_s: Optional[float] = 1200.0
    stop_on_miss: bool = False
    content: Content = "prose"
    stall_after_s: Optional[float] = 300.0
    seed: Optional[int] = None

    def check(self, context: Optional[int]) -> None:
        if self.turn_tokens < 32:
            raise UsageError(f"--turn-tokens must be at least 32, got {self.turn_tokens}",
                             hint="each turn appends this much text, e.g. --turn-tokens 2000")
        if self.answer_tokens < 1:
            raise UsageError(f"--answer-tokens must be at least 1, got {self.answer_tokens}",
                             hint="the room each answer gets, e.g. --answer-tokens 64")
        if self.needle_every < 0:
            raise UsageError(f"--needle-every must be 0 (never) or more, got {self.needle_every}",
                             hint="--needle-every 4 asks for the planted code every fourth turn")
        if self.content == "random":
            raise UsageError("the ramp grows a conversation from real text; --content random is not for it",
                             hint="--content prose (default for the ramp) or --content code")
        limit = self.max_context or context
        if limit and self.turn_tokens + self.answer_tokens + 64 > limit:
            raise UsageError(f"one turn ({self.turn_tokens} + {self.answer_tokens} answer tokens) does not fit "
                             f"a context of {limit} tokens", hint="lower --turn-tokens or raise --max-context")
        if context and self.max_context and self.max_context > context:
            raise UsageError(f"--max-context {self.max_context} is above what the server serves per request "
                             f"({context} tokens)", hint=f"use --max-context {context} or less")

    def to_json(self) -> dict[str, Any]:
        return {"workload": "ramp", "points": [], "turn_tokens": self.turn_tokens,
                "answer_tokens": self.answer_tokens, "max_context": self.max_context,
                "needle_every": self.needle_every, "time_cap_s": self.time_cap_s,
                "turn_timeout_s": self.turn_timeout_s, "stop_on_miss": self.stop_on_miss, "content": self.content,
                "stall_after_s": self.stall_after_s, "seed": self.seed, "api": "chat", "temperature": 0}


@dataclass
class _Turn:
    """What one streamed answer brought back (times are perf_counter seconds)."""

    t_send: float = 0.0
    t_first: Optional[float] = None
    t_end: Optional[float] = None
    content: str = ""
    chunks: int = 0
    usage: Optional[dict[str, Any]] = None
    timings: Optional[dict[str, Any]] = None
    finish_reason: Optional[str] = None
    error: Optional[str] = None
    status: str = "ok"


async def stream_turn(api: ApiClient, body: dict[str, Any], quiet: Quiet) -> _Turn:
    """One streamed chat request on the load generator's client; `quiet` follows it (last byte,
    chunks) so a watchdog can see the silence. Failures come back in the turn, never raised."""
    quiet.begin(time.perf_counter())
    quiet.follow = lambda: _live(api)
    reply = await api.chat(body)
    r = reply.record
    return _Turn(t_send=r.t_send if r.t_send is not None else quiet.t_begin, t_first=r.t_first_token,
                 t_end=r.t_end, content=reply.text, chunks=reply.chunks, usage=reply.usage, timings=reply.timings,
                 finish_reason=reply.finish_reason, error=reply.error, status="ok" if reply.ok else "error")


def _live(api: ApiClient) -> Optional[tuple[float, int]]:
    busy = api.in_flight()  # the ramp sends one request at a time
    return (time.perf_counter() - busy[0][1], busy[0][2]) if busy else None


def turn_line(i: int, turn: _Turn, needle: Optional[dict[str, Any]], cached_from_counters: Optional[float],
              start: float, prev_context: Optional[int] = None, cache_block: int = 1) -> dict[str, Any]:
    """The ramp.jsonl line of one finished turn (pure). `cache_block`: the engine's prefix-cache unit in
    tokens (vLLM caches whole KV blocks; llama.cpp single tokens)."""
    usage = turn.usage or {}
    timings = turn.timings or {}
    ctx = usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else timings.get("prompt_n")
    out_n = usage.get("completion_tokens") if isinstance(usage.get("completion_tokens"), int) else \
        timings.get("predicted_n")
    details = usage.get("prompt_tokens_details") or {}
    cached, cached_src = None, None
    if isinstance(details.get("cached_tokens"), int):
        cached, cached_src = details["cached_tokens"], "usage"
    elif isinstance(timings.get("cache_n"), int):
        cached, cached_src = timings["cache_n"], "timings"
        if isinstance(timings.get("prompt_n"), int):
            ctx = timings["prompt_n"] + timings["cache_n"]  # llama.cpp's prompt_n counts only the new part
    elif cached_from_counters is not None:
        cached, cached_src = int(cached_from_counters), "engine counters"
    ttft = (turn.t_first - turn.t_send) if turn.t_first else None
    new = (ctx - cached) if isinstance(ctx, int) and cached is not None else None
    decode = None
    if turn.t_first and turn.t_end and isinstance(out_n, int) and out_n > 1 and turn.t_end > turn.t_first:
        decode = (out_n - 1) / (turn.t_end - turn.t_first)
    line: dict[str, Any] = {
        "turn": i, "status": turn.status, "error": turn.error, "at_s": round(turn.t_send - start, 3),
        "context_tokens": ctx, "completion_tokens": out_n, "cached_tokens": cached, "cached_source": cached_src,
        "cached_share": (cached / ctx) if cached is not None and ctx else None,
        "new_tokens": new, "ttft_s": round(ttft, 4) if ttft is not None else None,
        "prefill_tok_s": (new / ttft) if new and ttft else None, "decode_tok_s": decode,
        "e2e_s": round(turn.t_end - turn.t_send, 4) if turn.t_end else None,
        "finish_reason": turn.finish_reason, "answer": turn.content[:400], "needle": needle,
        "engine_timings": {k: timings[k] for k in ("prompt_n", "prompt_ms", "predicted_n", "predicted_ms", "cache_n")
                           if k in timings} or None,
    }
    # The whole previous prompt is this turn's prefix: all of it the cache can hold (whole blocks) should
    # come from the cache.
    reusable = (prev_context // cache_block) * cache_block if prev_context else 0
    if reusable and cached is not None and cached < 0.9 * reusable:
        line["cache_note"] = (f"the conversation prefix was not reused: {cached} tokens came from the prefix cache, "
                              f"the previous turn's prompt alone was {prev_context}"
                              + (f" ({reusable} in whole {cache_block}-token cache blocks)" if cache_block > 1 else ""))
    return line


def summarize(lines: list[dict[str, Any]]) -> dict[str, Any]:
    """Ramp summary from ramp.jsonl lines (pure): TTFT and decode speed against context, needle results. A turn
    the time cap ended is in the curve with its status and no figures; every count leaves it out."""
    ok = [ln for ln in lines if ln.get("status") == "ok"]
    needles = [ln["needle"] for ln in lines if ln.get("needle")]
    return {"turns": len(lines), "ok_turns": len(ok),
            "max_context_tokens": max((ln["context_tokens"] or 0 for ln in ok), default=0),
            "needle_checks": len(needles), "needle_found": sum(bool(n.get("found")) for n in needles),
            "curve": [{"turn": ln["turn"], "status": ln.get("status"), "context_tokens": ln["context_tokens"], "ttft_s": ln["ttft_s"],
                       "decode_tok_s": ln["decode_tok_s"], "prefill_tok_s": ln["prefill_tok_s"],
                       "cached_share": ln["cached_share"], "needle": (ln.get("needle") or {}).get("found")}
                      for ln in lines]}


async def run_ramp(spec: RampSpec, target: Target, context: int, folder: RunFolder, reporter: Reporter) -> dict:
    """Grow the conversation until a cut-off; returns the cut-off ({"reason", "turn"})."""
    limit = spec.max_context or context
    rng = random.Random(spec.seed)
    code = f"{rng.randrange(10**6, 10**7)}"
    nonce = new_nonce()
    start_at = texts.start_of(spec.content, rng)
    offset = 0  # characters of the corpus used so far: the text reads on from turn to turn
    history: list[dict[str, str]] = []
    lines: list[dict[str, Any]] = []
    start = time.perf_counter()
    cutoff: dict[str, Any] = {"reason": "", "turn": 0}
    folder.update(ramp={"status": "running", "file": FILE, "code": code, "nonce": nonce, "limit": limit})
    async with ApiClient(target.base_url) as api:
        tokens = ServerTokens(api, target.served_name, target.engine)
        i = 0
        while True:
            i += 1
            elapsed = time.perf_counter() - start
            if spec.time_cap_s is not None and elapsed >= spec.time_cap_s:
                cutoff = {"reason": f"time cap of {spec.time_cap_s:g} s reached", "turn": i - 1}
                break
            last_ctx = lines[-1]["context_tokens"] + (lines[-1]["completion_tokens"] or 0) if lines else 0
            if last_ctx + spec.turn_tokens + max(spec.answer_tokens, NEEDLE_ANSWER_TOKENS) + 32 > limit:
                cutoff = {"reason": f"context limit: {last_ctx} tokens so far + a {spec.turn_tokens}-token turn + "
                                    f"{spec.answer_tokens} answer tokens would pass {limit}", "turn": i - 1}
                break
            needle_turn = spec.needle_every > 0 and i % spec.needle_every == 0
            question = NEEDLE_Q if needle_turn else SUMMARY_Q
            head = (f"{_tag(nonce, 'measured', 0)}Remember this access code, I will ask for it later: "
                    f"the access code is {code}.\n\n") if i == 1 else ""
            tail = f"\n\n{question}"
            base = start_at + offset

            def text_of(k: int, base: int = base, head: str = head, tail: str = tail) -> str:
                return head + texts.piece(spec.content, base, k) + tail

            async def count(text: str) -> int:
                # the turn as the server will prefill it, template included
                return await tokens.count_chat([{"role": "user", "content": text}])

            reporter.stage(f"turn {i}: sizing {spec.turn_tokens} tokens of {spec.content}")
            message, _ = await fit_length(text_of, spec.turn_tokens, count,
                                          units_per_token=chars_per_token(spec.content), what="question")
            offset += len(message) - len(head) - len(tail)
            history.append({"role": "user", "content": message})
            # a needle turn gets the gate's answer room at least: vLLM's SmolLM2 began "The access code I gave
            # you at the start of this conversation was:" and a 16-token answer ended before the code
            answer = max(spec.answer_tokens, NEEDLE_ANSWER_TOKENS) if needle_turn else spec.answer_tokens
            body = merge_request({"model": target.served_name, "messages": history, "max_tokens": answer,
                                  "temperature": 0, "stream": True, "stream_options": {"include_usage": True}},
                                 target.request)
            before = await prefix_counters_async(target.engine, target.base_url)
            quiet = Quiet()
            watch = StallWatch(target, spec.stall_after_s, spec.turn_timeout_s,
                               on_tick=lambda q, i=i: reporter.stage(
                                   f"turn {i}: {q.tokens} tokens so far, last byte {q.since_byte():.0f} s ago"),
                               cap_at=None if spec.time_cap_s is None else start + spec.time_cap_s,
                               cap_what=f"the run's time cap of {spec.time_cap_s:g} s" if spec.time_cap_s else "")
            task = asyncio.ensure_future(stream_turn(api, body, quiet))
            verdict = await watch.watch(task, quiet)
            if verdict is not None:
                turn = _Turn(t_send=quiet.t_begin, status=verdict["status"], error=verdict["detail"],
                             content="", chunks=quiet.tokens)
            else:
                turn = task.result()
            from_counters = None
            if turn.status == "ok" and before is not None:
                after = await prefix_counters_async(target.engine, target.base_url)
                if after is not None:
                    from_counters = after.get("hits", 0.0) - before.get("hits", 0.0)
            needle = None
            if needle_turn and turn.status == "ok":
                needle = {"asked": True, "found": code in turn.content, "answer": turn.content.strip()[:80]}
            line = turn_line(i, turn, needle, from_counters, start,
                             prev_context=lines[-1]["context_tokens"] if lines else None,
                             cache_block=target.cache_block)
            if verdict is not None:
                line["stall"] = verdict
            folder.append_jsonl(FILE, line)
            lines.append(line)
            reporter.stage(f"turn {i}: {line['status']} context {line['context_tokens']} tokens, TTFT "
                           f"{line['ttft_s']} s, decode {_f(line['decode_tok_s'])} tok/s, cached {_pct(line['cached_share'])}"
                           + (f", needle {'found' if needle['found'] else 'MISSED'}" if needle else ""))
            if turn.status == CAPPED:
                cutoff = {"reason": f"time cap of {spec.time_cap_s:g} s reached during turn {i} (that turn is "
                                    "excluded)", "turn": i - 1}
                break
            if turn.status != "ok":
                cutoff = {"reason": f"turn {i} {turn.status}: {turn.error}", "turn": i}
                break
            history.append({"role": "assistant", "content": turn.content})
            if needle is not None and not needle["found"] and spec.stop_on_miss:
                cutoff = {"reason": f"needle missed at turn {i} (--stop-on-miss)", "turn": i}
                break
    death = target.death()
    if death:
        cutoff = {"reason": f"{death} (at turn {cutoff['turn']})", "turn": cutoff["turn"]}
    folder.update(ramp={"status": "done", "file": FILE, "code": code, "nonce": nonce, "limit": limit,
                        "cutoff": cutoff, **{k: v for k, v in summarize(lines).items() if k != "curve"}})
    return cutoff


def _f(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1f}"


def _pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.0%}"


# --- the ramp as a kind: its options, keys, run and figures -----------------------------------------

def sampled_ramp(folder: Any, target: Any) -> Any:
    """The conversation sampled as one stretch (point "ramp"; output tokens and turns from ramp.jsonl's
    finished turns)."""
    def tally() -> tuple[int, int]:
        f = folder.path / FILE
        turns = [t for t in read_jsonl(f) if t.get("status") == "ok"] if f.exists() else []
        return sum(t.get("completion_tokens") or 0 for t in turns), len(turns)

    return sampled_stretch(folder, target, "ramp", tally)


def fitted(spec: RampSpec, target: Target, ctx: int) -> RampSpec:
    spec.check(ctx)
    return spec


async def run(spec: RampSpec, target: Target, ctx: int, folder: RunFolder, reporter: Reporter) -> Optional[str]:
    async with sampled_ramp(folder, target):
        cutoff = await run_ramp(spec, target, ctx, folder, reporter)
    reporter.stage(f"ramp stopped after turn {cutoff['turn']}: {cutoff['reason']}")
    failed = (folder.summary.get("ramp") or {}).get("ok_turns", 0) == 0
    return f"no turn finished: {cutoff['reason']}" if failed else None


WHOLE_HINT = "the ramp takes one value, e.g. 2000; distributions are for --workload conversations"
OPTIONS = (
    O.TURN_TOKENS, O.ANSWER_TOKENS, O.MAX_CONTEXT,
    Option("needle_every", ("--needle-every",), int, 4,
           "ramp: ask for the code planted in turn 1 every N turns (0: never)"),
    Option("time_cap", ("--time-cap",), str, "2h", "ramp: stop after this long (a turn still running is ended and "
                                                   "left out), or none"),
    Option("turn_timeout", ("--turn-timeout",), str, "20m", "ramp: a turn taking longer ends the ramp, or none"),
    Option("stop_on_miss", ("--stop-on-miss",), bool, False, "ramp: stop at the first needle missed"),
    O.CONTENT, O.STALL_AFTER, O.SEED, O.REQUEST_TIMEOUT,
)
KEYS = (O.TURN_TOKENS_KEY, O.ANSWER_TOKENS_KEY, O.MAX_CONTEXT_KEY, Key("needle_every", Optional[int]),
        Key("time_cap", Optional[str]), Key("turn_timeout", Optional[str]), Key("stop_on_miss", Optional[bool]))
KEY_NAMES = tuple(k.name for k in KEYS)


def from_options(o: Any) -> RampSpec:
    """`servedeck ramp` / `bench --workload ramp`: --request-timeout, when given, bounds each turn (as it bounds
    each request of the other kinds), else --turn-timeout."""
    timeout = (o["request_timeout"], "--request-timeout") if o.get("request_timeout") else \
        (o.get("turn_timeout") or "20m", "--turn-timeout")
    spec = RampSpec(turn_tokens=2000 if o.get("turn_tokens") is None else O.whole(o["turn_tokens"], "--turn-tokens",
                                                                                   WHOLE_HINT),
                    answer_tokens=O.whole(o.get("answer_tokens") or "64", "--answer-tokens", WHOLE_HINT),
                    max_context=o.get("max_context"), needle_every=o.get("needle_every", 4),
                    time_cap_s=O.limit(o.get("time_cap") or "2h", "--time-cap"), turn_timeout_s=O.limit(*timeout),
                    stop_on_miss=bool(o.get("stop_on_miss")), content=ContentChoice(o.get("content") or "prose").value,
                    stall_after_s=O.limit(o.get("stall_after") or "5m", "--stall-after"), seed=o.get("seed"))
    spec.check(None)  # what needs no server, before any launch; the context is checked once it is known
    return spec


def spec_of(w: Any) -> RampSpec:
    """A kind = "ramp" entry → the RampSpec `servedeck ramp` would run, with the same defaults."""
    return from_options({"turn_tokens": w.turn_tokens, "answer_tokens": w.answer_tokens, "max_context": w.max_context,
                         "needle_every": 4 if w.needle_every is None else w.needle_every, "time_cap": w.time_cap,
                         "turn_timeout": w.turn_timeout, "stop_on_miss": w.stop_on_miss, "seed": w.seed})


def check_entry(w: Any) -> None:
    if w.concurrency or w.rate:
        raise ValueError("a ramp grows one conversation: drop concurrency/rate")
    O.entry_rules(lambda: spec_of(w), KEY_NAMES)


def describe(w: dict[str, Any]) -> str:
    return (f"workload **ramp** ({w.get('content')}): {w.get('turn_tokens')} tokens a turn, "
            f"{w.get('answer_tokens')} answer tokens, needle every {w.get('needle_every')} turns, time cap "
            f"{w.get('time_cap_s')} s, turn timeout {w.get('turn_timeout_s')} s, stall after "
            f"{w.get('stall_after_s')} s" + (", stop on a miss" if w.get("stop_on_miss") else "") + ".")


def _n(x: Optional[float], digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _p(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1%}"


def section(view: dict[str, Any]) -> list[str]:
    r = view.get("ramp")
    if not r:
        return []
    cut = r.get("cutoff") or {}
    out = ["## Ramp: one conversation grown turn by turn", "",
           f"Stopped after turn {cut.get('turn', '-')}: {cut.get('reason') or 'still running'}. "
           f"Needle (code planted in turn 1): found {r.get('needle_found', 0)} of {r.get('needle_checks', 0)} checks. "
           f"Largest context {r.get('max_context_tokens', '-')} tokens of {r.get('limit', '-')}.", ""]
    rows = []
    for ln in r.get("turns") or []:
        needle = ln.get("needle")
        rows.append([str(ln.get("turn")), ln.get("status", "-"), str(ln.get("context_tokens") or "-"),
                     _n(ln.get("ttft_s"), 2), _n(ln.get("prefill_tok_s"), 0), _n(ln.get("decode_tok_s")),
                     _p(ln.get("cached_share")),
                     "-" if not needle else ("found" if needle.get("found") else "MISSED")])
    if rows:
        out += [table(["turn", "status", "context tokens", "TTFT s", "prefill tok/s (new part)", "decode tok/s",
                       "cached", "needle"], rows), "",
                "Context: prompt tokens by the server's count. Prefill: tokens not served from the prefix cache / "
                "TTFT. Decode: (answer tokens − 1) / (end − first token). Cached: the engine's own count "
                "(usage, timings or its counters). Lines: ramp.jsonl."]
    capped = [ln for ln in r.get("turns") or [] if ln.get("status") == CAPPED]
    if capped:
        out += ["", f"Turn {capped[-1].get('turn')} hit the run's time cap and is excluded from every figure."]
    notes = [ln["cache_note"] for ln in r.get("turns") or [] if ln.get("cache_note")]
    if notes:
        out += ["", f"**Prefix cache**: {len(notes)} turn(s) did not reuse the conversation prefix ({notes[0]})."]
    return out


def headline(view: dict[str, Any]) -> str:
    r = view.get("ramp")
    if not isinstance(r, dict) or not r.get("cutoff"):
        return "-"
    return (f"ramp: {r.get('ok_turns')} turns to {r.get('max_context_tokens')} tokens, needle "
            f"{r.get('needle_found')}/{r.get('needle_checks')}; stopped: {r['cutoff'].get('reason')}")


def view(path: Any, v: dict[str, Any], records: list[Any]) -> dict[str, Any]:
    """ramp.jsonl's turns beside the summary's tally."""
    if not isinstance(v.get("ramp"), dict):
        return {}
    return {"ramp": {**v["ramp"], "turns": read_jsonl(path / FILE)}}


KIND = Kind(
    name="ramp", help="one conversation grown turn by turn to its cut-off, as `servedeck ramp`",
    options=OPTIONS, from_options=from_options,
    keys=KEYS, check_entry=check_entry, from_entry=lambda w, where: [spec_of(w)],
    fitted=fitted, run=run,
    command=("ramp", "Grow one conversation with MODEL turn by turn to its cut-off (context, time cap, a missed "
                     "needle), after the gate, recorded as a run folder: the same run as `servedeck bench MODEL "
                     "--workload ramp`."),
    view=view, describe=describe, tail_sections=section, headline=headline,
)
