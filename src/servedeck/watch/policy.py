"""The watch loop's relaunch policy: pure decisions, no processes, no clocks read here.

What the loop does about one wanted model is decided from its `Incident` (what happened to it so
far), the `Settings` (`[host]` relaunch_tries, relaunch_spacing_s) and `now`, in seconds on the loop's
monotonic clock (a wall-clock step, e.g. NTP, neither hurries nor delays a relaunch). The effects
(starting the engine, notices, the journal, watch.json) are carried out by watch/loop.py, which
reports back what came of them: `tried` after a relaunch try, `crashed` when an engine ended.

Incident states (loop.py is their one owner; watch.json "models" keeps them across loop restarts):
    relaunching  absent or crash-looping: `tries` used so far, no new try before `next_at`
    gave-up      `tries` are used up: nothing more is tried until the model runs again or is unwanted
No incident: nothing is wrong with the model (it runs, or it was never missed).

The rules, in order:
  - a wanted model that is not running is tried at once (try 1), then `spacing_s` after each try
    that failed to start, up to `tries`; then the loop gives up, with each try's evidence;
  - a relaunched model that stays up for `stable_s` (= spacing_s × tries) closes its incident; a
    crash before that counts toward the same N, so a crash loop ends given up, not relaunched forever;
  - a model given up on that runs again (started by hand) closes its incident (`resumed`);
  - with `tries` = 0 the loop never relaunches: it says so once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

RELAUNCHING, GAVE_UP = "relaunching", "gave-up"

# What the loop is to do (Action.kind).
NOTHING = "nothing"  # no act, no notice
WAIT = "wait"  # the next try is not before `until`
RELAUNCH = "relaunch"  # start it now: try `attempt` of `of`
GIVE_UP = "give-up"  # stop trying; say why, with the evidence
TELL_ABSENT = "absent"  # relaunch_tries = 0: say once that the loop leaves it
RESUMED = "resumed"  # given up on, yet it runs again (started outside the loop): watch it again
STABLE = "stable"  # up for stable_s after a relaunch: the relaunch count starts again


@dataclass(frozen=True)
class Settings:
    tries: int = 3  # relaunch_tries
    spacing_s: float = 60.0  # relaunch_spacing_s

    @classmethod
    def of_host(cls, host: Any) -> Settings:
        return cls(tries=host.relaunch_tries, spacing_s=host.relaunch_spacing_s)

    @property
    def stable_s(self) -> float:
        """How long a relaunched model stays up before its incident closes."""
        return self.spacing_s * max(1, self.tries)


@dataclass(frozen=True)
class Action:
    kind: str
    attempt: int = 0  # RELAUNCH: this try's number, from 1
    of: int = 0  # RELAUNCH: of how many
    until: float | None = None  # WAIT: monotonic time of the next try


@dataclass(frozen=True)
class Incident:
    """One wanted model's trouble, as the loop keeps it (times on the monotonic clock, seconds)."""

    since: str = ""  # wall-clock ISO time it began, for people
    state: str = RELAUNCHING
    tries: int = 0  # relaunch tries used
    next_at: float | None = None  # no try before this (None: at once)
    ready_at: float | None = None  # when its last relaunch came up; cleared by a crash
    evidence: tuple[dict, ...] = ()  # per try (0: the crash that opened it): outcome, detail, cause, launch, log
    told: bool = False  # tries = 0: the "absent" notice was given
    cause: dict | None = None  # gave-up: the last try's classified cause
    detail: str = ""  # gave-up: the sentence `status` shows
    gave_up_at: str = ""  # gave-up: wall-clock ISO time

    @property
    def last(self) -> dict:
        """The latest try's evidence ({} before any)."""
        return self.evidence[-1] if self.evidence else {}

    @property
    def why(self) -> str:
        """What the last try ended with, in a few words."""
        return (self.last.get("cause") or {}).get("summary") or self.last.get("detail") or "unknown cause"

    # watch.json keeps wall-clock epoch seconds (readable by a loop started later, even after a reboot);
    # `wall_minus_mono` (time.time() - time.monotonic(), read by the caller) converts at this edge.
    def to_json(self, wall_minus_mono: float) -> dict[str, Any]:
        d: dict[str, Any] = {"state": self.state, "tries": self.tries,
                             "next_at": 0.0 if self.next_at is None else self.next_at + wall_minus_mono,
                             "since": self.since, "evidence": list(self.evidence)}
        if self.ready_at is not None:
            d["ready_at"] = self.ready_at + wall_minus_mono
        if self.told:
            d["told"] = True
        if self.state == GAVE_UP:
            d.update(cause=self.cause or {}, gave_up_at=self.gave_up_at, detail=self.detail)
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any], wall_minus_mono: float) -> Incident:
        def mono(key: str) -> float | None:
            v = d.get(key)
            return float(v) - wall_minus_mono if isinstance(v, (int, float)) and v else None

        return cls(since=str(d.get("since") or ""), state=GAVE_UP if d.get("state") == GAVE_UP else RELAUNCHING,
                   tries=int(d.get("tries") or 0), next_at=mono("next_at"), ready_at=mono("ready_at"),
                   evidence=tuple(e for e in d.get("evidence") or () if isinstance(e, dict)),
                   told=bool(d.get("told")), cause=d.get("cause"), detail=str(d.get("detail") or ""),
                   gave_up_at=str(d.get("gave_up_at") or ""))


def absent(inc: Incident, s: Settings, now: float) -> tuple[Incident, Action]:
    """The model is wanted and not running (pass `Incident(since=…)` when it has none yet)."""
    if inc.state == GAVE_UP:
        return inc, Action(NOTHING)
    if s.tries == 0:
        return (inc, Action(NOTHING)) if inc.told else (replace(inc, told=True), Action(TELL_ABSENT))
    if inc.tries >= s.tries:  # the last relaunch came up, then died again
        return inc, Action(GIVE_UP)
    if inc.next_at is not None and now < inc.next_at:
        return inc, Action(WAIT, until=inc.next_at)
    return replace(inc, tries=inc.tries + 1), Action(RELAUNCH, attempt=inc.tries + 1, of=s.tries)


def tried(inc: Incident, s: Settings, now: float, failure: dict | None = None) -> tuple[Incident, Action]:
    """A relaunch try ended: the engine is up and ready (`failure` None), or it failed to start
    (`failure`: its evidence, without the try number). The next try is `spacing_s` away either way."""
    next_at = now + s.spacing_s
    if failure is None:
        return replace(inc, ready_at=now, next_at=next_at), Action(NOTHING)
    inc = replace(inc, next_at=next_at, evidence=inc.evidence + ({"try": inc.tries, **failure},))
    return inc, Action(GIVE_UP) if inc.tries >= s.tries else Action(WAIT, until=next_at)


def crashed(inc: Incident | None, state: str, facts: dict, since: str) -> Incident:
    """The model's engine ended (`state`: crashed or failed; `facts`: detail, cause, launch_dir,
    log_tail). A crash after a relaunch counts toward the same tries; one out of the blue opens an
    incident (`since`: now, on the wall clock); a model given up on stays given up."""
    if inc is None:
        return Incident(since=since, evidence=({"try": 0, "outcome": state, **facts},))
    if inc.state == RELAUNCHING:
        return replace(inc, ready_at=None,
                       evidence=inc.evidence + ({"try": inc.tries, "outcome": f"{state} after relaunch", **facts},))
    return inc


def running(inc: Incident | None, s: Settings, now: float) -> tuple[Incident | None, Action]:
    """The model is running: does its incident close (None), and with which notice?"""
    if inc is None:
        return None, Action(NOTHING)
    if inc.state == GAVE_UP:
        return None, Action(RESUMED)
    if inc.ready_at is not None and now - inc.ready_at >= s.stable_s:
        return None, Action(STABLE)
    return inc, Action(NOTHING)


def give_up(inc: Incident, at: str) -> Incident:
    """Stop trying (`at`: now, on the wall clock): the incident keeps the last cause and says why."""
    return replace(inc, state=GAVE_UP, cause=inc.last.get("cause") or {}, gave_up_at=at,
                   detail=f"gave up after {inc.tries} relaunch tries: {inc.why}")
