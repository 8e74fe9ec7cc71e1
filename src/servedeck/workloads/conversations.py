"""The conversations workload: N users, each a conversation of T turns, all at once.

Every user's conversation opens (after an optional system prompt of S tokens, the same for all
users, so the engine can share it) with its own unique tag, then each turn appends U tokens of real
text and a question; the model's answer goes back into the history exactly as it came, and the next
turn sends the whole history again, after the think time. What the engine serves from its prefix
cache is its own account, per request (llama.cpp: usage.prompt_tokens_details.cached_tokens and
timings.cache_n; vLLM: usage.prompt_tokens_details.cached_tokens with prefix caching and
enable-prompt-tokens-details on), kept in requests.jsonl with `conversation` and `turn`; figures per
turn index and overall come from those lines (runs/turns.py).

The user-turn tokens, the answer tokens and the think time are each fixed or drawn per turn from a
distribution (`uniform:128-384`, `normal:256,64`, `exp:2s`: loadgen/drawn.py), from the user's own seeded
generator, so a seeded run draws the same lengths again.

A conversation stops, as the ramp does, when its next turn would not fit the context (its
previous prompt + answer + U + A + 32 tokens of margin) or a turn fails; each stop and its reason
go into summary.json's `conversations.cutoffs`. Before the first request, the turn at which the
context will cut the conversations is estimated from U, A and S and said (`expected_cut_turn`).

One point (index 0) holds every turn, so the usual figures (TTFT, TPOT, tok/s, the engine's
counters) are the overall ones.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Literal, Optional

from servedeck.config.schema import merge_request
from servedeck.errors import ServerDied, UsageError
from servedeck.gates.server import ServerTokens
from servedeck.loadgen import texts
from servedeck.loadgen.api import ApiClient
from servedeck.loadgen.drawn import Drawn, fixed, parse_drawn
from servedeck.loadgen.prompts import _tag, new_nonce, seeded_nonce
from servedeck.loadgen.records import RequestRecord
from servedeck.loadgen.schedule import sleep_until
from servedeck.loadgen.texts import Content
from servedeck.mdtable import table
from servedeck.runs.folder import RunFolder
from servedeck.runs.turns import turn_figures
from servedeck.workloads import options as O
from servedeck.workloads.points import finish_point, put_point
from servedeck.workloads.reporter import Reporter
from servedeck.workloads.shape import Key, Kind, Option
from servedeck.workloads.target import Target
from servedeck.workloads.window import calibrate, engine_window, keep

DEFAULT_TURN_TOKENS = 256
QUESTION = "In one sentence, what is the text above about?"
MARGIN = 32  # tokens kept free below the context: the chat template of the next turn
PER_TURN_EXTRA = 24  # about what the question and the template add per user + assistant pair (the estimate only)


@dataclass(frozen=True)
class ConversationsSpec:
    kind: ClassVar[str] = "conversations"
    users: int = 4
    turns: int = 4
    turn_tokens: int = DEFAULT_TURN_TOKENS  # text tokens each user turn adds
    answer_tokens: int = 64  # room for each answer
    think_time_s: float = 0.0  # between an answer and the same user's next turn
    system_prompt_tokens: int = 0  # 0: no system prompt; else one shared by every user
    content: Content = "prose"
    seed: Optional[int] = None
    request_timeout_s: Optional[float] = 600.0
    max_context: Optional[int] = None  # None: what the server serves per request
    # drawn per turn instead of the fixed values above (which then hold their means); None: fixed
    turn_dist: Optional[Drawn] = None
    answer_dist: Optional[Drawn] = None
    think_dist: Optional[Drawn] = None
    served_context: Optional[int] = None  # set once fitted to the server (`fitted`)

    @property
    def turn(self) -> Drawn:
        return self.turn_dist or fixed(self.turn_tokens, 16)

    @property
    def answer(self) -> Drawn:
        return self.answer_dist or fixed(self.answer_tokens, 1)

    @property
    def think(self) -> Drawn:
        return self.think_dist or fixed(self.think_time_s, 0.0, integer=False)

    def check(self, context: Optional[int]) -> None:
        """Every rule on the spec; context None before the server is asked."""
        for flag, value, least in (("--users", self.users, 1), ("--turns", self.turns, 1),
                                   ("--turn-tokens", self.turn_tokens, 16), ("--answer-tokens", self.answer_tokens, 1),
                                   ("--system-prompt-tokens", self.system_prompt_tokens, 0)):
            if value < least:
                raise UsageError(f"{flag} must be at least {least}, got {value}",
                                 hint="e.g. --users 16 --turns 6 --turn-tokens 256 --answer-tokens 64")
        if self.think_time_s < 0:
            raise UsageError(f"--think-time must be 0 or more, got {self.think_time_s:g} s", hint="e.g. --think-time 2s")
        if self.content == "random":
            raise UsageError("a conversation is real text; --content random is not for it",
                             hint="--content prose (default) or --content code")
        limit = self.max_context or context
        if limit and self.cut_turn(limit) == 1:
            raise UsageError(f"not even one turn fits a context of {limit} tokens: system prompt "
                             f"{self.system_prompt_tokens} + turn {self.turn_tokens} + answer {self.answer_tokens} "
                             f"+ {MARGIN} tokens of margin", hint="lower --turn-tokens or --system-prompt-tokens")

    def cut_turn(self, context: int) -> Optional[int]:
        """The first turn that will not fit `context` (an estimate from S, U and A, their means where they are
        drawn: the server's counts decide at run time), or None when every turn fits."""
        for t in range(1, self.turns + 1):
            if self.system_prompt_tokens + t * (self.turn_tokens + self.answer_tokens + PER_TURN_EXTRA) \
                    + MARGIN > context:
                return t
        return None

    def to_json(self) -> dict[str, Any]:
        drawn = {k: d.to_json() for k, d in (("turn_tokens", self.turn_dist), ("answer_tokens", self.answer_dist),
                                             ("think_time_s", self.think_dist)) if d is not None}
        return {"workload": "conversations", "points": [self.label], "users": self.users, "turns": self.turns,
                "turn_tokens": self.turn_tokens, "answer_tokens": self.answer_tokens,
                "think_time_s": self.think_time_s, "system_prompt_tokens": self.system_prompt_tokens,
                "content": self.content, "seed": self.seed, "request_timeout_s": self.request_timeout_s,
                "max_context": self.max_context, "warmup": 0, "api": "chat", "temperature": 0,
                **({"drawn": drawn} if drawn else {}), **self._cut()}

    def _cut(self) -> dict[str, Any]:
        """Once fitted to the server: where its context will cut the conversations, as said before the first turn."""
        if self.served_context is None:
            return {}
        limit = self.max_context or self.served_context
        return {"expected_cut_turn": self.cut_turn(limit), "cut_note": cut_note(self, limit)}

    @property
    def label(self) -> str:
        return f"{self.users} users x {self.turns} turns"


def cut_note(spec: ConversationsSpec, context: int) -> Optional[str]:
    """What to tell the user before launching when the context will cut the conversations short."""
    t = spec.cut_turn(context)
    if t is None:
        return None
    return (f"each conversation will be cut at turn {t} of {spec.turns}: by then its history (system prompt "
            f"{spec.system_prompt_tokens} + {t} × ({spec.turn_tokens} + {spec.answer_tokens}) tokens) passes the "
            f"context of {context} tokens; turns {t}–{spec.turns} will not be sent")


class _Run:
    """One run's shared state: the client, the records as written, the cut-offs."""

    def __init__(self, spec: ConversationsSpec, target: Target, limit: int, folder: RunFolder, api: ApiClient,
                 reporter: Reporter, nonce: str, cpt: float, system: str, start: float) -> None:
        self.spec, self.target, self.limit, self.folder, self.api = spec, target, limit, folder, api
        self.reporter, self.nonce, self.cpt, self.system, self.start = reporter, nonce, cpt, system, start
        self.records: list[RequestRecord] = []
        self.cutoffs: list[dict[str, Any]] = []

    def keep(self, rec: RequestRecord, c: int, t: int, t_target: float) -> None:
        """The turn's record on the run's clock, written to requests.jsonl at once."""
        rec.id, rec.kind, rec.conversation, rec.turn = f"{self.nonce}-c{c}-t{t}", "measured", c, t
        keep(self.folder, self.records, rec, self.start, t_target)

    async def converse(self, c: int, rng: random.Random) -> None:
        spec = self.spec
        history: list[dict[str, str]] = [{"role": "system", "content": self.system}] if self.system else []
        pos = texts.start_of(spec.content, rng)
        so_far = 0  # the previous turn's prompt + answer tokens, by the server's count
        due = self.start  # when this turn is due: at the start, then the previous answer's end + the think time
        for t in range(1, spec.turns + 1):
            turn_tokens, answer_tokens = int(spec.turn.draw(rng)), int(spec.answer.draw(rng))
            think = spec.think.draw(rng) if t > 1 else 0.0
            if so_far + turn_tokens + answer_tokens + MARGIN > self.limit:
                self.cutoffs.append({"conversation": c, "turn": t - 1, "reason": (
                    f"context limit: {so_far} tokens so far + a {turn_tokens}-token turn + "
                    f"{answer_tokens} answer tokens would pass {self.limit}")})
                return
            due += think
            await sleep_until(due)
            chars = int(turn_tokens * self.cpt)
            text = (_tag(self.nonce, "measured", c) if t == 1 else "") + texts.piece(spec.content, pos, chars)
            pos += chars
            history.append({"role": "user", "content": f"{text}\n\n{QUESTION}"})
            body = merge_request({"model": self.target.served_name, "messages": history,
                                  "max_tokens": answer_tokens, "temperature": 0, "stream": True,
                                  "stream_options": {"include_usage": True}}, self.target.request)
            reply = await self.api.chat(body, timeout_s=spec.request_timeout_s)
            rec = reply.record
            end = rec.t_end if rec.t_end is not None else time.perf_counter()
            self.keep(rec, c, t, due)
            due = end
            cached = f"{rec.cached_tokens}/{rec.prompt_tokens}" if rec.cached_tokens is not None else "-"
            self.reporter.stage(f"conversation {c} turn {t}: {rec.status}, TTFT "
                                f"{'-' if rec.ttft is None else f'{rec.ttft * 1000:.0f} ms'}, cached {cached}")
            if not reply.ok:
                self.cutoffs.append({"conversation": c, "turn": t, "reason": f"turn {t} {rec.status}: {rec.error}"})
                return
            history.append({"role": "assistant", "content": reply.text})
            so_far = (rec.prompt_tokens or 0) + (rec.output_tokens or 0)
        self.cutoffs.append({"conversation": c, "turn": spec.turns, "reason": "every turn sent"})


async def run_conversations(spec: ConversationsSpec, target: Target, context: int, folder: RunFolder,
                            reporter: Reporter) -> dict[str, Any]:
    """Every user's conversation at once, as one point (index 0); returns the point."""
    limit = spec.max_context or context
    rng = random.Random(spec.seed)
    nonce = seeded_nonce(spec.seed, 0) if spec.seed is not None else new_nonce()
    point: dict[str, Any] = {"index": 0, "label": spec.label, "shape": {"conversations": spec.users},
                             "nonce": nonce, "status": "running"}
    put_point(folder, point)
    async with ApiClient(target.base_url) as api:
        tokens = ServerTokens(api, target.served_name, target.engine)
        reporter.stage("conversations: sizing turns with the server's tokenizer")
        cpt = await calibrate(tokens, spec.content, texts.start_of(spec.content, rng), spec.turn_tokens)
        system = ""
        if spec.system_prompt_tokens:
            system = ("You are a careful assistant. Answer briefly. Background reading follows.\n\n"
                      + texts.piece(spec.content, texts.start_of(spec.content, rng),
                                    int(spec.system_prompt_tokens * cpt)))
        point["prompts"] = {"sized_by": "server tokenizer, calibrated chars/token (approximate per turn)",
                            "chars_per_token": round(cpt, 4), "content": spec.content}
        async with engine_window(target, folder, point) as window:
            run = _Run(spec, target, limit, folder, api, reporter, nonce, cpt, system, time.perf_counter())
            reporter.stage(f"conversations: {spec.label}")
            try:
                await asyncio.gather(*(run.converse(c, random.Random(rng.random())) for c in range(spec.users)))
                point["status"] = "ok"
            finally:
                point["load"] = window.load(run.start)
                folder.update(conversations={"cutoffs": sorted(run.cutoffs, key=lambda x: x["conversation"]),
                                             **turn_figures(run.records)})
    finish_point(folder, point, run.records, spec.to_json())
    reporter.point_done(spec.label, point)
    if window.death is not None:
        raise ServerDied(f"{window.death} (during the conversations, after {len(run.records)} turns)")
    return point


def fitted(spec: ConversationsSpec, target: Target, ctx: int) -> ConversationsSpec:
    spec.check(ctx)
    target.check_output_cap(int(spec.answer.high), "--answer-tokens")
    return replace(spec, served_context=ctx)


async def run(spec: ConversationsSpec, target: Target, ctx: int, folder: RunFolder, reporter: Reporter
              ) -> Optional[str]:
    note = cut_note(spec, spec.max_context or ctx)
    if note:
        reporter.stage(note)
    point = await run_conversations(spec, target, ctx, folder, reporter)
    counts = point["figures"]["counts"]
    return f"requests failed: {counts['error']} of {counts['measured']} turns" if counts["error"] else None


def spec_from_options(*, users: int, turns: int, turn_tokens: Optional[int | str], answer_tokens: int | str,
                      think_time: str, system_prompt_tokens: int, content: Optional[str], seed: Optional[int],
                      request_timeout_s: Optional[float] | Literal["default"], max_context: Optional[int]
                      ) -> ConversationsSpec:
    """`servedeck bench --workload conversations`' options → a spec checked before anything launches. The turn
    and answer tokens and the think time are each a fixed value or a distribution (loadgen/drawn.py)."""
    turn = parse_drawn(str(DEFAULT_TURN_TOKENS if turn_tokens is None else turn_tokens), "--turn-tokens", least=16)
    answer = parse_drawn(str(answer_tokens), "--answer-tokens", least=1)
    think = parse_drawn(think_time.strip() or "0", "--think-time", least=0.0, integer=False)
    spec = ConversationsSpec(users=users, turns=turns, turn_tokens=int(round(turn.mean)),
                             answer_tokens=int(round(answer.mean)), think_time_s=think.mean,
                             system_prompt_tokens=system_prompt_tokens, content=content or "prose",  # type: ignore[arg-type]
                             seed=seed, request_timeout_s=600.0 if request_timeout_s == "default"
                             else request_timeout_s, max_context=max_context,  # type: ignore[arg-type]
                             turn_dist=None if turn.fixed else turn, answer_dist=None if answer.fixed else answer,
                             think_dist=None if think.fixed else think)
    spec.check(None)
    return spec


# --- the conversations as a kind: options, keys, figures --------------------------------------------

OPTIONS = (
    Option("users", ("--users",), int, 4, "conversations: users talking at once"),
    Option("turns", ("--turns",), int, 4, "conversations: turns per conversation"),
    O.TURN_TOKENS, O.ANSWER_TOKENS, O.MAX_CONTEXT,
    Option("think_time", ("--think-time",), str, "0", "conversations: pause between an answer and the next turn, "
           "e.g. 2s, or drawn per turn: uniform:1s-3s, exp:2s"),
    Option("system_prompt_tokens", ("--system-prompt-tokens",), int, 0,
           "conversations: a system prompt of this many tokens shared by every user (0: none)"),
    O.CONTENT, O.SEED, O.REQUEST_TIMEOUT,
)
KEYS = (Key("users", Optional[int]), Key("turns", Optional[int]), O.TURN_TOKENS_KEY, O.ANSWER_TOKENS_KEY,
        Key("think_time", Optional[str]), Key("system_prompt_tokens", Optional[int]), O.MAX_CONTEXT_KEY)
CONVERSATION_KEYS = ("users", "turns", "turn_tokens", "answer_tokens", "think_time", "system_prompt_tokens",
                     "max_context")


def from_options(o: Any) -> ConversationsSpec:
    return spec_from_options(
        users=o.get("users", 4), turns=o.get("turns", 4), turn_tokens=o.get("turn_tokens"),
        answer_tokens=o.get("answer_tokens") or "64", think_time=o.get("think_time") or "0",
        system_prompt_tokens=o.get("system_prompt_tokens", 0), content=o.get("content"), seed=o.get("seed"),
        request_timeout_s=O.request_timeout(o), max_context=o.get("max_context"))


def spec_of(w: Any) -> ConversationsSpec:
    """A kind = "conversations" entry → the ConversationsSpec `servedeck bench` would run, same defaults."""
    d = ConversationsSpec()
    return spec_from_options(users=d.users if w.users is None else w.users,
                             turns=d.turns if w.turns is None else w.turns, turn_tokens=w.turn_tokens,
                             answer_tokens=d.answer_tokens if w.answer_tokens is None else w.answer_tokens,
                             think_time=w.think_time or "0",
                             system_prompt_tokens=0 if w.system_prompt_tokens is None else w.system_prompt_tokens,
                             content=None, seed=w.seed, request_timeout_s="default", max_context=w.max_context)


def check_entry(w: Any) -> None:
    if w.concurrency or w.rate:
        raise ValueError("a conversations workload's load is its users: drop concurrency/rate (users = 16)")
    O.entry_rules(lambda: spec_of(w), CONVERSATION_KEYS)


def view(path: Any, v: dict[str, Any], records: list[RequestRecord]) -> dict[str, Any]:
    """Per-turn figures, rebuilt from requests.jsonl."""
    if not isinstance(v.get("conversations"), dict):
        return {}
    return {"conversations": {**v["conversations"], **turn_figures(records)}}


def _ms(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.0f}"


def _share(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.0%}"


def _tok(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.0f}"


def section(view: dict[str, Any]) -> list[str]:
    c = view.get("conversations")
    if not isinstance(c, dict):
        return []
    w = view.get("workload") or {}
    head = ["turn", "turns sent", "ok", "prompt tokens p50", "cached tokens p50", "cached share",
            "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms"]

    def row(label: str, f: dict[str, Any]) -> list[str]:
        return [label, str(f.get("requests")), str(f.get("ok")), _tok(f.get("prompt_tokens_p50")),
                _tok(f.get("cached_tokens_p50")), _share(f.get("cached_share")), _ms(f.get("ttft_ms_p50")),
                _ms(f.get("ttft_ms_p99")), _ms(f.get("tpot_ms_p50"))]

    out = ["## Conversations: figures per turn", "",
           f"{w.get('users')} users at once, {w.get('turns')} turns each: {w.get('turn_tokens')} tokens of "
           f"{w.get('content')} a turn, {w.get('answer_tokens')} answer tokens, think time {w.get('think_time_s')} s, "
           + (f"a shared system prompt of {w.get('system_prompt_tokens')} tokens." if w.get("system_prompt_tokens")
              else "no system prompt."), ""]
    if w.get("cut_note"):
        out += [f"Said before the first request: {w['cut_note']}.", ""]
    rows = [row(str(f["turn"]), f) for f in c.get("per_turn") or []] + [row("all", c.get("overall") or {})]
    out += [table(head, rows, "r" * len(head)), "",
            "Prompt tokens: the whole history as the server counted it. Cached: what the engine reported served "
            "from its prefix cache (usage.prompt_tokens_details.cached_tokens, or llama.cpp's timings.cache_n); "
            "share = Σ cached / Σ prompt tokens. Lines: requests.jsonl (conversation, turn)."]
    stops: dict[str, int] = {}
    for cut in c.get("cutoffs") or []:
        stops[cut["reason"]] = stops.get(cut["reason"], 0) + 1
    if stops:
        out += ["", "Where the conversations stopped: " + "; ".join(f"{n} × {r}" for r, n in stops.items()) + "."]
    return out


def describe(w: dict[str, Any]) -> str:
    return (f"workload **conversations** ({w.get('content')}): {w.get('users')} users at once, {w.get('turns')} turns "
            f"each, {w.get('turn_tokens')} tokens a turn, {w.get('answer_tokens')} answer tokens, think time "
            f"{w.get('think_time_s')} s, " + (f"a shared system prompt of {w.get('system_prompt_tokens')} tokens"
                                              if w.get("system_prompt_tokens") else "no system prompt")
            + (f", drawn per turn: {', '.join(w['drawn'])}" if w.get("drawn") else "") + ".")


KIND = Kind(
    name="conversations", help="--users at once, --turns each, the whole history every turn",
    options=OPTIONS, from_options=from_options,
    keys=KEYS, check_entry=check_entry, from_entry=lambda w, where: [spec_of(w)],
    fitted=fitted, run=run,
    view=view, describe=describe, tail_sections=section,
)
