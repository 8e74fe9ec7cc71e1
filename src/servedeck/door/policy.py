"""The front door's swap policy: pure decisions, no processes, no clocks read here.

`decide` answers "a request wants model T: what now?" from a snapshot of what the door knows
(`View` per model) and the time `now`; its `why` is the reason a waiting request gives for its wait
(`Waited` adds those up into the `x-servedeck-waited` header). A model's `ReplicaPolicy` answers
"which replica takes this request" (`POLICIES`, by name: `least-outstanding`, the default; `session`;
`prefix`; chosen per model by models.toml's `routing`).
The effects (deck start/switch/stop, waiting, answering 429/502/503) are carried out by
door/manager.py, which asks again after every change.

Door states of a model (manager.py is their one owner):
    stopped    not running (as far as the door and the deck know)
    asleep     its engine sleeps (deck state asleep): it holds no slot and takes no request; a request
               for it wakes it (its slot's awake holder moved out of the way first, as for a start)
    starting   a deck start/switch (or wake) for it is under way
    ready      answering; requests are proxied
    draining   ready, but a switch will evict it: in-flight requests finish, new ones queue
    stopping   a deck stop/switch is taking it down
    failed     its last boot failed; `retry_at` says when a request may try again
"""

from __future__ import annotations

import hashlib
import json
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from servedeck.errors import UsageError

STOPPED, STARTING, READY, DRAINING, STOPPING, FAILED = "stopped", "starting", "ready", "draining", "stopping", "failed"
ASLEEP = "asleep"
HOLDING = {STARTING, READY, DRAINING, STOPPING}  # states that occupy a slot (a sleeping model holds none)

# Why a request waited for its model, in the words of the x-servedeck-waited header and the page.
WHY_START = "start"  # its model was booting, in a free slot (or started outside the door)
WHY_SWITCH = "switch"  # the slot's holder was being stopped and its model booted in its place
WHY_DRAIN = "drain"  # the holder's in-flight requests were finishing before the switch
WHY_RESIDENCY = "min-residency"  # the holder was in use and had held the slot for less than min_residency_s
WHY_SLOT = "slot-busy"  # another model's start, stop or switch in the slot came first
WHY_HANDOVER = "handover"  # the holder had just become ready and its own waiting requests were taking it first
WHY_WAKE = "wake"  # its model was asleep and was woken (the deck says `wake (level 2)` for a level-2 wake)
# While the deck works, it says what each phase is (deck/sleepops.py): `sleep` / `sleep (level 2)` (the
# holder put to sleep), `switch (cold: WHY)` (a holder whose entry asked to sleep stopped instead),
# `cold restart (WHY)` (a wake that failed, or answers that differed after it).


@dataclass(frozen=True)
class View:
    """One model as the door sees it at one instant (times on the door's monotonic clock, seconds)."""

    name: str
    slot: str
    state: str = STOPPED
    inflight: int = 0
    queued: int = 0
    ready_since: float | None = None  # when it last became ready (the residency clock)
    last_request: float | None = None  # when a request for it last arrived
    retry_at: float | None = None  # its last boot failed (502) or was refused (503): no new try before this


@dataclass(frozen=True)
class Settings:
    min_residency_s: float = 30.0
    drain_timeout_s: float = 120.0


@dataclass(frozen=True)
class Action:
    """What to do for the target now.

    serve    proxy the request (target is ready)
    wait     nothing to do yet; look again at `until` or on the next change (`reason` says why)
    start    boot the target; nothing holds its slot
    wake     wake the target from sleep; nothing awake holds its slot
    switch   evict `evict` (none has requests in flight, or the drain deadline passed), boot the target
    drain    mark `evict` draining; look again when their in-flight count reaches 0 or at `until`
    fail     answer the waiting requests with `status` (502: last boot failed) until `until`
    """

    kind: str
    evict: tuple[str, ...] = ()
    until: float | None = None
    reason: str = ""
    status: int | None = None
    why: str = ""  # one of the WHY_ words: what a request waiting for the target waits on now


def holders_of(target: View, views: dict[str, View]) -> list[View]:
    return [v for v in views.values() if v.name != target.name and v.slot == target.slot and v.state in HOLDING]


def in_use(v: View) -> bool:
    """Contention for the slot: requests run or wait for the holder. A request that finished is no
    claim on it, however recent: one user alternating two models would otherwise wait out
    min_residency at every switch (issue 20). What is in flight is served before a switch (drain)."""
    return v.inflight > 0 or v.queued > 0


def decide(target: str, views: dict[str, View], now: float, settings: Settings,
           drain_started: float | None = None) -> Action:
    """What to do for a request that wants `target`. `drain_started`: when this switch began draining."""
    t = views[target]
    if t.state == READY:
        return Action("serve")
    if t.state == STARTING:
        return Action("wait", reason=f"{target} is starting", why=WHY_START)
    if t.state in (DRAINING, STOPPING):
        return Action("wait", reason=f"{target} is being switched out; the request queues behind the switch",
                      why=WHY_SLOT)
    if t.retry_at is not None and now < t.retry_at:
        if t.state == FAILED:
            return Action("fail", until=t.retry_at, status=502,
                          reason=f"{target} failed to boot; the next try is not before the watch loop's spacing")
        return Action("fail", until=t.retry_at, status=503,
                      reason=f"the deck refused to start {target}; the next try is not before the refusal's Retry-After")
    holders = holders_of(t, views)
    if not holders:
        if t.state == ASLEEP:
            return Action("wake", reason=f"{target} is asleep and slot {t.slot!r} is free", why=WHY_WAKE)
        return Action("start", reason=f"slot {t.slot!r} is free", why=WHY_START)
    busy = [h for h in holders if h.state in (STARTING, STOPPING)]
    if busy:  # another start or stop in this slot is under way: its outcome changes the picture
        return Action("wait", reason=f"slot {t.slot!r}: {', '.join(h.name for h in busy)} is {busy[0].state}",
                      why=WHY_SLOT)
    # No thrash on a truly contended slot: a holder that became ready less than min_residency ago
    # and is in use keeps the slot (and keeps taking requests) until the residency has passed.
    young = [h for h in holders if h.ready_since is not None and now - h.ready_since < settings.min_residency_s
             and in_use(h)]
    if young and drain_started is None:
        until = max(h.ready_since for h in young) + settings.min_residency_s  # type: ignore[operator]
        return Action("wait", until=until, why=WHY_RESIDENCY,
                      reason=f"slot {t.slot!r} switched to {', '.join(h.name for h in young)} less than "
                             f"min_residency ({settings.min_residency_s:g} s) ago and it has requests in flight")
    # Progress: a holder's waiting requests are handed it before it can go, whatever min_residency_s says.
    # A ready model's queued requests are the ones that waited for it (a request for a ready model never
    # queues) and are being woken to take it. Before issue 48 they counted as idle: with min_residency_s = 0
    # the slot worker switched the holder out before its own waiters ran, and two models in one slot
    # switched back and forth (29-33 switches in 40 s, 0 of 4 requests answered).
    owed = [h for h in holders if h.state == READY and h.queued > 0]
    if owed:
        return Action("wait", why=WHY_HANDOVER,
                      reason=f"{', '.join(f'{h.name} ({h.queued} waiting)' for h in owed)} just became ready: "
                             "the requests that waited for it are served before the slot switches")
    evict = tuple(sorted(h.name for h in holders))
    inflight = [h for h in holders if h.inflight > 0]
    if inflight:
        start = drain_started if drain_started is not None else now
        deadline = start + settings.drain_timeout_s
        if now < deadline:
            return Action("drain", evict=evict, until=deadline, why=WHY_DRAIN,
                          reason=f"waiting for {sum(h.inflight for h in inflight)} in-flight request(s) of "
                                 f"{', '.join(h.name for h in inflight)} (drain_timeout {settings.drain_timeout_s:g} s)")
        return Action("switch", evict=evict, reason="drain_timeout passed with requests still in flight",
                      why=WHY_SWITCH)
    return Action("switch", evict=evict, reason=f"slot {t.slot!r} held by {', '.join(evict)}", why=WHY_SWITCH)


@dataclass
class Waited:
    """How long one request waited for its model, by reason, in the order the reasons came.

    The waiting request calls `note(now, why)` at every look (each wake-up, and once at the end with
    whatever held then); the time since its previous look goes to the reason that held at that look,
    and the time before the first reason was known goes to the first one. A reason that names the one
    before it more closely (the deck's `switch (cold: …)` after the door's `switch`, `wake (level 2)`
    after `wake`) takes over its time: it is the same phase, now better said."""

    since: float
    why: str = ""
    parts: list[tuple[str, float]] = field(default_factory=list)

    def note(self, now: float, why: str) -> None:
        held = self.why or why
        if held:
            spent = now - self.since
            if self.parts and self.parts[-1][0] == held:
                self.parts[-1] = (held, self.parts[-1][1] + spent)
            else:
                self.parts.append((held, spent))
            self.since = now
        if why and self.parts and why.startswith(self.parts[-1][0] + " ("):
            self.parts[-1] = (why, self.parts[-1][1])
        self.why = why or self.why

    def text(self) -> str:
        """`28.2s min-residency, 2.0s switch`: the x-servedeck-waited header and the page's column. A
        reason that held for under 0.05 s (the door's word before the deck named the phase) is left
        out, unless it is the only one."""
        parts = [(why, s) for why, s in self.parts if s >= 0.05] or self.parts[-1:]
        return ", ".join(f"{s:.1f}s {why}" for why, s in parts)


RECENT_PER_REPLICA = 64


@dataclass
class Replica:
    """One server of a model; `outstanding` counts requests sent to it and not yet finished. `recent`
    is its policy's own memory of what it sent there (the door never reads it; a policy that needs
    no history leaves it empty)."""

    url: str
    outstanding: int = 0
    sent: int = field(default=0)
    recent: deque = field(default_factory=lambda: deque(maxlen=RECENT_PER_REPLICA), repr=False)


class Ask(NamedTuple):
    """What a replica policy may read of one request: its path, its headers as the client sent them,
    its body as sent (a prompt's prefix is its first bytes) and that body's JSON (None when it is not
    JSON). Given, never changed: the door forwards the request as it came."""

    path: bytes
    headers: list[tuple[bytes, bytes]]
    body: bytes | bytearray
    doc: Any = None

    def header(self, name: bytes) -> bytes | None:
        for k, v in self.headers:
            if k.lower() == name:
                return v
        return None


def pick_replica(replicas: list[Replica]) -> Replica:
    """The replica with the fewest outstanding requests; ties go to the one sent fewer in total
    (so an idle set is used round-robin rather than always the first)."""
    return min(replicas, key=lambda r: (r.outstanding, r.sent))


class ReplicaPolicy:
    """How one model's requests are spread over its ready replicas: one instance per model, so a
    policy may keep state across requests (a session → replica map), and `replica.recent` per
    replica. `pick` is a pure decision over what it is given; the manager counts what it picked
    (`outstanding`, `sent`). A new policy is a subclass here and a line in POLICIES."""

    name = ""
    knobs: tuple[str, ...] = ()  # the models.toml `routing` keys it takes, besides `policy`

    def pick(self, ask: Ask | None, replicas: list[Replica]) -> Replica:
        """The replica for this request. `ask` is None for a request the door makes itself (preload)."""
        raise NotImplementedError


class LeastOutstanding(ReplicaPolicy):
    name = "least-outstanding"
    knobs: tuple[str, ...] = ()

    def pick(self, ask: Ask | None, replicas: list[Replica]) -> Replica:
        return pick_replica(replicas)


# Defaults of the routing knobs (models.toml's `routing` table, config/schema.py's Routing says the same).
SESSION_HEADER = "x-session-id"
IMBALANCE = 4  # a replica more than this many outstanding requests above the least loaded is overloaded
PREFIX_CHARS = 16384  # characters of a request's rendered opening a policy reads (and `prefix` keeps)
SESSIONS_MAX = 4096  # session pins kept per model; the least recently used is forgotten first


def opening(doc: Any, chars: int, first_user_only: bool = False) -> str | None:
    """The request's text as a prefix cache sees it, at most `chars` characters: each chat message as
    role, a unit separator, its content (a string, or its parts as JSON), a record separator; a
    completion's `prompt` as sent. `first_user_only`: stop after the first user message (the
    conversation's identity: its system prompt and first question). None when the body has neither."""
    if not isinstance(doc, dict):
        return None
    messages = doc.get("messages")
    if isinstance(messages, list):
        out: list[str] = []
        size = 0
        for m in messages:
            if not isinstance(m, dict):
                continue
            content = m.get("content")
            text = content if isinstance(content, str) else json.dumps(content, sort_keys=True)
            piece = f"{m.get('role', '')}\x1f{text}\x1e"
            out.append(piece)
            size += len(piece)
            if size >= chars or (first_user_only and m.get("role") == "user"):
                break
        return "".join(out)[:chars] if out else None
    prompt = doc.get("prompt")
    if prompt is None:
        return None
    return (prompt if isinstance(prompt, str) else json.dumps(prompt))[:chars]


def shared_prefix(a: str, b: str, floor: int = 0) -> int:
    """How many leading characters `a` and `b` share, or at most `floor` when they share no more (the
    caller's best so far, so an entry that cannot beat it costs one comparison). Hand-written
    (os.path.commonprefix walks the characters in Python): startswith and a binary search over
    slices, which compare in C."""
    if a.startswith(b) or b.startswith(a):
        return min(len(a), len(b))
    if len(a) <= floor or len(b) <= floor or not a.startswith(b[:floor + 1]):
        return floor
    lo, hi = floor + 1, min(len(a), len(b)) - 1  # they share lo characters, and not hi + 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a.startswith(b[:mid]):
            lo = mid
        else:
            hi = mid - 1
    return lo


def overloaded(r: Replica, replicas: list[Replica], imbalance: int) -> bool:
    """More than `imbalance` outstanding requests above the least loaded of `replicas`."""
    return r.outstanding > min(x.outstanding for x in replicas) + imbalance


class Session(ReplicaPolicy):
    """Pins a conversation to one replica, so its engine's prefix cache serves the turns that follow.
    The conversation is the `header`'s value when the client sends it, else a hash of its opening (the
    system prompt and first user message, at most `prefix_chars` characters). A pinned replica that is
    overloaded (more than `imbalance` outstanding above the least loaded) or gone loses the pin: the
    request goes to the least-outstanding replica, which is pinned from then on. A request with neither
    header nor chat/prompt body is routed least-outstanding and pins nothing."""

    name = "session"
    knobs = ("header", "imbalance", "prefix_chars")

    def __init__(self, header: str = SESSION_HEADER, imbalance: int = IMBALANCE, prefix_chars: int = PREFIX_CHARS,
                 sessions_max: int = SESSIONS_MAX):
        self.header = header.lower().encode()
        self.imbalance = imbalance
        self.prefix_chars = prefix_chars
        self.sessions_max = sessions_max
        self.pins: OrderedDict[bytes, str] = OrderedDict()  # conversation → replica url, least recent first

    def conversation(self, ask: Ask | None) -> bytes | None:
        if ask is None:
            return None
        given = ask.header(self.header)
        if given:
            return b"h:" + given
        text = opening(ask.doc, self.prefix_chars, first_user_only=True)
        return None if text is None else b"o:" + hashlib.blake2b(text.encode(), digest_size=16).digest()

    def pick(self, ask: Ask | None, replicas: list[Replica]) -> Replica:
        key = self.conversation(ask)
        if key is None:
            return pick_replica(replicas)
        url = self.pins.get(key)
        pinned = next((r for r in replicas if r.url == url), None)
        if pinned is None or overloaded(pinned, replicas, self.imbalance):
            pinned = pick_replica(replicas)
        self.pins[key] = pinned.url
        self.pins.move_to_end(key)
        while len(self.pins) > self.sessions_max:
            self.pins.popitem(last=False)
        return pinned


class Prefix(ReplicaPolicy):
    """To the replica whose recent requests share the longest prefix with this one, among those not
    overloaded (at most `imbalance` outstanding above the least loaded), as vllm-router's cache_aware
    does. The measure is character-level: the longest common prefix between this request's rendered
    messages (`opening`, at most `prefix_chars` characters) and any of the last RECENT_PER_REPLICA
    requests sent to that replica, which `recent` keeps (so memory is bounded at RECENT_PER_REPLICA ×
    prefix_chars characters per replica). A best match under `min_share` of the request's opening
    (vllm-router's cache_threshold, 0.5 by default there too), or no chat/prompt body: the
    least-outstanding replica (vllm-router takes the one holding the least cached text). Ties: fewer
    outstanding, then fewer sent.

    A match that continues a request the replica served (that request's whole text begins this one: the
    next turn of a conversation) goes there within the bound. A match that diverges (only a context shared
    with other requests is cached there: a system prompt, a document) goes there only while that replica
    is no busier than the least loaded; else least-outstanding. A shared context costs one prefill per
    replica and is then cached on each, so following it would pile new conversations onto whichever
    replica served the first (16 openings behind one system prompt went 10/6, and the later turns of the
    heavier side were moved at the bound, prefilling their history again)."""

    name = "prefix"
    knobs = ("imbalance", "prefix_chars")

    def __init__(self, imbalance: int = IMBALANCE, prefix_chars: int = PREFIX_CHARS, min_share: float = 0.5):
        self.imbalance = imbalance
        self.prefix_chars = prefix_chars
        self.min_share = min_share

    def pick(self, ask: Ask | None, replicas: list[Replica]) -> Replica:
        text = opening(ask.doc, self.prefix_chars) if ask is not None else None
        if text is None:
            return pick_replica(replicas)
        scored = [(*self.longest(text, r.recent), r) for r in replicas if not overloaded(r, replicas, self.imbalance)]
        shared, continues, chosen = max(scored, key=lambda s: (s[0], -s[2].outstanding, -s[2].sent))
        if shared == 0 or shared < self.min_share * len(text):
            chosen = pick_replica(replicas)
        elif not continues and chosen.outstanding > min(r.outstanding for r in replicas):
            chosen = pick_replica(replicas)
        chosen.recent.append(text)
        return chosen

    @staticmethod
    def longest(text: str, recent: deque) -> tuple[int, bool]:
        """(the longest prefix `text` shares with an entry, whether that entry is all of it: a request this
        one continues)."""
        best, whole = 0, False
        for seen in recent:
            n = shared_prefix(text, seen, best)
            if n > best or (n == best and n == len(seen) and not whole):
                best, whole = n, n == len(seen)
        return best, whole


POLICIES: dict[str, type[ReplicaPolicy]] = {p.name: p for p in (LeastOutstanding, Session, Prefix)}
DEFAULT_POLICY = LeastOutstanding.name


def replica_policy(policy: str | None = None, **knobs: Any) -> ReplicaPolicy:
    """A fresh policy for one model, by its name (None: the default) and its knobs (models.toml's
    `routing` table: each policy takes the ones in its `knobs`; None means the default)."""
    try:
        cls = POLICIES[policy or DEFAULT_POLICY]
    except KeyError:
        raise UsageError(f"no replica routing policy named {policy!r}",
                         hint=f"use one of: {', '.join(sorted(POLICIES))}") from None
    return cls(**{k: v for k, v in knobs.items() if k in cls.knobs and v is not None})


def idle_expired(v: View, ttl_s: float | None, now: float) -> bool:
    """ttl: a ready (or sleeping) model with nothing running or waiting, and no request for `ttl_s`, is
    unloaded."""
    if ttl_s is None or v.state not in (READY, ASLEEP) or v.inflight or v.queued:
        return False
    times = [x for x in (v.last_request, v.ready_since) if x is not None]
    return bool(times) and now - max(times) >= ttl_s


def sleep_due(v: View, ttl_sleep_s: float | None, now: float) -> bool:
    """ttl_sleep: a ready model with nothing running or waiting, and no request for `ttl_sleep_s`, is put
    to sleep (its ttl, longer, then stops it)."""
    return ttl_sleep_s is not None and v.state == READY and idle_expired(v, ttl_sleep_s, now)
