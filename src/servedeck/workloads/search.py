"""The capacity search's decisions, pure: which load to measure next, from what was measured so far.

    search = Search(SearchOptions(start=1, cap=64, cap_reason="--max 64", resolution=Resolution(0.1)))
    while (load := search.next_load()) is not None:
        search.tell(load, measure(load))        # measure: load -> a judged point (servedeck.slo.judge)
    search.result()                             # boundary, steps, binding constraint, cliff or smooth

Bracket: from `start`, double until the SLO fails or the cap is reached; once two loads have passed, a step
goes no further than one resolution step past where the trend of the binding figure through them (its share
of its limit, straight through the last two) reaches the limit, so a boundary at 8 of 16 is bracketed at 10
rather than at 16. Bisect: narrow the gap between the last passing and the first failing load until it is
within the resolution of the failing one, at the load where the binding figure, drawn straight between the
two, meets its limit (false position), or at the middle when there is no such figure or the last two
narrowing steps fell on the same side (the Illinois rule: false position alone can creep in from one end).
Verify: measure both again (fresh prompts). The last passing load is the highest that passed every time it
was measured, below the lowest that failed every time (the first failing); a load with mixed verdicts is
unstable and holds neither end, so a lucky pass cannot hold the boundary and an unlucky failure cannot cap
it. When a re-measure disagrees the search says so and widens: past a last passing load that now fails it
bisects again below; past a first failing load that now passes it brackets again above. A client-bound point
is not a result: that load is measured once more (fresh prompts: a box's passing spike should not end a
search), and when it is client-bound again the search stops there and says so. Where the client itself was short
of CPU (judged "client_kind" "short"), the second measure uses more client processes, as many as the host's free
cores allow (loadgen/pace.py `more_procs`), and every later step keeps them; where its lag came from a busy host
("lag"), more processes would not help and the same count measures again.
`max_steps` bounds the search.
Floor (`floor`, good req/s of the launch; a campaign's `stop_below`, the tune's best so far): once a load has
failed every time, the search's answer can be no more than its ceiling, the larger of the request rate completed
at that first failing load and the good req/s of every passing load below it (the answer is measured at one of
those): under a load that does not fall in throughput as it rises (a closed loop's c / latency, or an open loop
below collapse), nothing between them carries more. A ceiling below the floor ends the search there,
`below floor`, its bisection and re-measures never run: the launch cannot carry what it was held to.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Optional

from servedeck.errors import UsageError

Judged = dict[str, Any]  # servedeck.slo.judge's answer: "passed", "binding", "thresholds", "client_bound", ...


@dataclass(frozen=True)
class Resolution:
    """How close the boundary must be: `relative` of the first failing load (0.1 = 10 %), or `absolute`."""

    relative: Optional[float] = None
    absolute: Optional[float] = None

    def width(self, hi: float) -> float:
        return self.absolute if self.absolute is not None else (self.relative or 0.1) * hi

    @property
    def text(self) -> str:
        return f"{self.absolute:g}" if self.absolute is not None else f"{(self.relative or 0.1) * 100:g}%"


def parse_resolution(text: str) -> Resolution:
    """`10%` (of the first failing load) or an absolute step like `2` or `0.5`."""
    t = (text or "").strip()
    try:
        value = float(t[:-1]) / 100 if t.endswith("%") else float(t)
    except ValueError:
        raise UsageError(f"--resolution: {text!r} is not a percentage or a number",
                         hint="write it like --resolution 10% or --resolution 2") from None
    if not value > 0 or (t.endswith("%") and value >= 1):
        raise UsageError(f"--resolution: {text!r} must be above 0 (and a percentage below 100 %)",
                         hint="write it like --resolution 10%")
    return Resolution(relative=value) if t.endswith("%") else Resolution(absolute=value)


BELOW_FLOOR = "below floor"  # the verdict of a search stopped by its floor
FEW_PER_STREAM = 8  # requests a closed-loop stream sends in a step, below which its figure is coarse (a note)


@dataclass(frozen=True)
class SearchOptions:
    start: float
    cap: float
    cap_reason: str  # what set the cap: "--max 512", "the engine's 4 slots", ...
    resolution: Resolution = field(default_factory=lambda: Resolution(0.1))
    integer: bool = True  # concurrency: whole numbers; rate: any positive number
    max_steps: int = 30
    procs: int = 1  # client processes the search starts with (--client-procs); it adds some where the client is short
    floor: Optional[float] = None  # good req/s the launch must be able to carry, else the search stops (below floor)


@dataclass
class Step:
    load: float
    judged: Judged
    phase: str  # bracket | bisect | verify | widen
    why: str  # why this load was measured
    then: str = ""  # what the search concluded from it


class Search:
    """States: searching (next_load returns a load) → done (next_load returns None; result() final)."""

    def __init__(self, opts: SearchOptions):
        self.opts = opts
        self.steps: list[Step] = []
        self.notes: list[str] = []  # disagreements, the cap, client-bound points: said to the user
        self._verdict: Optional[str] = None
        self._pending: Optional[tuple[str, str]] = None  # (phase, why) of the load next_load handed out
        self._retry: Optional[float] = None  # a load whose measurement was client-bound once: measure again
        self._said_coarse = False  # the note on streams that each sent few requests is said once
        self.procs = opts.procs  # client processes for the next step: only ever raised, when the client was short
        self.procs_why = f"{opts.procs} client process{'es' if opts.procs > 1 else ''}, as asked"
        self._below: Optional[dict[str, Any]] = None  # the ceiling that ended the search below its floor

    # --- what was measured -------------------------------------------------------------------------
    def _runs(self, load: float) -> list[bool]:
        """Every verdict at this load (a client-bound point is no verdict)."""
        return [s.judged["passed"] for s in self.steps if s.load == load and not s.judged.get("client_bound")]

    def _loads(self) -> list[float]:
        return sorted({s.load for s in self.steps})

    def _bracket(self) -> tuple[Optional[float], Optional[float]]:
        """(last passing, first failing): the lowest load that failed every time it was measured, and the
        highest load below it that passed every time. Loads with mixed verdicts lie between (unstable)."""
        fails = [x for x in self._loads() if self._runs(x) and not any(self._runs(x))]
        hi = fails[0] if fails else None
        good = [x for x in self._loads() if self._runs(x) and all(self._runs(x)) and (hi is None or x < hi)]
        return (good[-1] if good else None), hi

    def _unstable(self) -> list[float]:
        return [x for x in self._loads() if len(set(self._runs(x))) > 1]

    def ceiling(self) -> Optional[dict[str, Any]]:
        """The most good req/s this search can still end with (the floor's docs above), once a load has failed every
        time it was measured: {"ceiling", "at" (the first failing load), "from" (what set it)}; None before, or
        where the failing load's figures have no window."""
        lo, hi = self._bracket()
        if hi is None:
            return None
        rates = [r for r in (_completed_rate(s.judged) for s in self.steps
                             if s.load == hi and not s.judged.get("client_bound")) if r is not None]
        if not rates:
            return None
        goods = [(float(s.judged["goodput_request_s"]), s.load) for s in self.steps
                 if s.load < hi and s.judged["passed"] and not s.judged.get("client_bound")
                 and s.judged.get("goodput_request_s") is not None]
        best_good = max(goods, default=None)
        if best_good is not None and best_good[0] > max(rates):
            return {"ceiling": best_good[0], "at": hi,
                    "from": f"the good req/s at {self._label(best_good[1])}, which passed"}
        return {"ceiling": max(rates), "at": hi, "from": f"the requests completed a second at {self._label(hi)}, "
                                                         "which failed"}

    def _below_floor(self) -> bool:
        """Whether the search ends here because its ceiling is below its floor (said in a note, kept for result)."""
        if self.opts.floor is None:
            return False
        top = self.ceiling()
        if top is None or not top["ceiling"] < self.opts.floor:
            return False
        self._below = {"floor": self.opts.floor, **top}
        self.notes.append(f"below its floor: no load below {self._label(top['at'])} can carry more than "
                          f"{top['ceiling']:.3g} good req/s ({top['from']}; throughput taken not to fall as load "
                          f"rises), below the {self.opts.floor:.3g} it was held to: the search stopped there, "
                          "before narrowing the boundary")
        self._verdict = BELOW_FLOOR
        return True

    # --- decisions ---------------------------------------------------------------------------------
    def next_load(self) -> Optional[float]:
        if self._verdict is not None:
            return None
        decision = self._decide()
        if decision is None:
            return None
        load, phase, why = decision
        self._pending = (phase, why)
        return load

    @property
    def why_next(self) -> str:
        """Why the load next_load just handed out is measured."""
        return self._pending[1] if self._pending else ""

    def tell(self, load: float, judged: Judged) -> None:
        phase, why = self._pending or ("bracket", "measured")
        self._pending = None
        step = Step(load, judged, phase, why)
        self.steps.append(step)
        if judged.get("client_bound"):
            reasons = '; '.join(judged.get('client_reasons') or []) or 'self-check'
            short = judged.get("client_kind") == "short"  # "lag": a busy host; None: figures that did not say
            if not (len(self.steps) >= 2 and self.steps[-2].load == load and self.steps[-2].judged.get("client_bound")):
                self._retry = load
                more, why = self._more_procs(load, judged) if short else (None, "")
                if more is not None:
                    self.procs, self.procs_why = more, f"{why} (after {self._label(load)} found the client short)"
                    step.then = f"client-bound (the client short of CPU): measured again with {more} client processes"
                    self.notes.append(f"{self._label(load)}: the client was short of CPU ({reasons}): not a result, "
                                      f"so it is measured again with {why}")
                    return
                step.then = "client-bound: not a result; measured again"
                self.notes.append(f"{self._label(load)}: the client, not the server, set the pace ({reasons}): "
                                  "not a result, so it is measured again with fresh prompts"
                                  + ("" if short else "; the client had CPU to spare (the host's cores were busy), "
                                     "so more client processes would not help") + (f" ({why})" if why else ""))
                return
            step.then = "client-bound again: not a result; the search stops here"
            procs = judged.get("client_procs") or self.procs
            self.notes.append(f"{self._label(load)}: client-bound twice in a row ({reasons}), the second time with "
                              f"{procs} client process{'es' if procs > 1 else ''}: not a result, so the search "
                              "stopped; " + ("more cores for the client (a host with free cores, an engine that "
                                             "leaves some) would help" if short else
                                             "its lag can move what the SLO reads although the client had CPU: a "
                                             "host with cores the engine does not hold, or a looser SLO, would help"))
            self._verdict = "client-bound"
            return
        self._few_per_stream(load, judged)
        runs = self._runs(load)
        if len(runs) > 1 and len(set(runs[:-1])) == 1 and runs[-1] != runs[0]:  # it just became unstable
            first = "passed" if runs[0] else "failed"
            now = "passes" if judged["passed"] else "fails"
            self.notes.append(f"{self._label(load)} {first} at first and {now} on re-measure: the two disagree, "
                              "so the search widens around it (a load passes only when every measurement did)")
        step.then = ("passed" if judged["passed"] else f"failed ({', '.join(judged.get('missed') or []) or '-'})")

    def _few_per_stream(self, load: float, judged: Judged) -> None:
        """Said once a search: a closed-loop step whose streams each sent fewer than FEW_PER_STREAM requests
        measures good req/s in steps of load/window (one request more or fewer a stream), so two figures that far
        apart are not told apart. On an H100 (2026-12-07, 4 s steps of 512 tokens in, 128 out) c=128 sent 4
        requests a stream at one launch and 6 at the next with the same flags: 114 and 180 good req/s."""
        measured = judged.get("measured") or 0
        if not self.opts.integer or load < 1 or not measured or self._said_coarse:
            return
        per = measured / load
        window = judged.get("window_s") or 0.0
        if per >= FEW_PER_STREAM or window <= 0:
            return
        self.notes.append(f"{self._label(load)}: {per:.3g} requests a stream in its {window:.1f} s window, so its "
                          f"good req/s moves in steps of {load / window:.3g} (one request more or fewer a stream): "
                          f"figures that close are not told apart; a `duration` that lets each stream send "
                          f"{FEW_PER_STREAM} or more would")
        self._said_coarse = True

    def _more_procs(self, load: float, judged: Judged) -> tuple[Optional[int], str]:
        from servedeck.loadgen.pace import more_procs

        free = (judged.get("host") or {}).get("free_cores")
        streams = int(load) if self.opts.integer else 1 << 20  # an open loop has no fixed stream count
        return more_procs(self.procs, free, streams)

    def _label(self, load: float) -> str:
        return f"c={load:g}" if self.opts.integer else f"rate={load:g}/s"

    def _mid(self, lo: float, hi: float) -> Optional[float]:
        if self.opts.integer:
            m = float((int(lo) + int(hi)) // 2)
            return m if lo < m < hi else None
        return float(f"{(lo + hi) / 2:.4g}")

    def _share(self, load: float, key: str) -> Optional[float]:
        """The mean share of its limit that figure `key` reached at `load` (value / limit), over its verdicts."""
        got = [_ratio(s.judged, key) for s in self.steps if s.load == load and not s.judged.get("client_bound")]
        got = [g for g in got if g is not None]
        return sum(got) / len(got) if got else None

    def _binding_at(self, load: float) -> Optional[str]:
        keys = [s.judged.get("binding") for s in self.steps if s.load == load and not s.judged.get("client_bound")]
        return keys[-1] if keys else None

    def _trend_step(self, lo: float, nxt: float) -> Optional[tuple[float, str]]:
        """While bracketing: where the binding figure's trend through the last two passing loads reaches its
        limit, and one resolution step past it, when that is below `nxt` (the doubled load)."""
        passing = [x for x in self._loads() if x < lo and self._runs(x) and all(self._runs(x))]
        key = self._binding_at(lo)
        if not passing or key is None:
            return None
        prev = passing[-1]
        a, b = self._share(prev, key), self._share(lo, key)
        if a is None or b is None or not b > a or b >= 1:
            return None
        cross = lo + (1 - b) / (b - a) * (lo - prev)
        r = self.opts.resolution
        past = cross * (1 + r.relative) if r.absolute is None else cross + r.absolute
        step = math.ceil(past) if self.opts.integer else float(f"{past:.4g}")
        floor = lo + 1 if self.opts.integer else lo * (1 + (r.relative or 0.1))
        step = max(step, floor)
        if step >= nxt:
            return None
        return float(step), (f"{self._label(lo)} passed; {key} went from {a:.0%} to {b:.0%} of its limit between "
                             f"{self._label(prev)} and {self._label(lo)}, which reaches it near {cross:.3g}: "
                             f"one resolution step past that, short of doubling to {nxt:g}")

    def _narrow(self, lo: float, hi: float) -> Optional[tuple[float, str]]:
        """The next load between the last passing and the first failing: false position on the binding
        figure, the middle when there is none or the Illinois rule says so."""
        mid = self._mid(lo, hi)
        between = f"between {self._label(lo)} (passed) and {self._label(hi)} (failed)"
        narrowing = [s for s in self.steps if s.phase in ("bisect", "widen")]
        if len(narrowing) >= 2 and narrowing[-1].judged["passed"] == narrowing[-2].judged["passed"]:
            return (mid, f"{between}: the middle (the last two steps fell on the same side)") if mid else None
        key = self._binding_at(hi)
        a, b = (self._share(lo, key), self._share(hi, key)) if key else (None, None)
        if a is None or b is None or not b > a or not a < 1 <= b:
            return (mid, f"{between}: the middle") if mid else None
        x = lo + (1 - a) / (b - a) * (hi - lo)
        if self.opts.integer:
            at = float(min(max(round(x), int(lo) + 1), int(hi) - 1))
            if not lo < at < hi:
                return None
        else:
            at = float(f"{min(max(x, lo + 0.1 * (hi - lo)), hi - 0.1 * (hi - lo)):.4g}")
        if self._runs(at):
            return (mid, f"{between}: the middle") if mid else None
        return at, f"{between}: where {key}, straight between them ({a:.0%} → {b:.0%} of its limit), meets it"

    def _decide(self) -> Optional[tuple[float, str, str]]:
        o = self.opts
        if len(self.steps) >= o.max_steps:
            self.notes.append(f"the search used its {o.max_steps} steps before the boundary settled")
            self._verdict = "step budget spent"
            return None
        if not self.steps:
            return o.start, "bracket", "the smallest load"
        if self._retry is not None:
            load, self._retry = self._retry, None
            return load, "retry", (f"{self._label(load)} was client-bound: measure it again with fresh prompts"
                                   + (f" and {self.procs} client processes" if self.procs > self.opts.procs else ""))
        lo, hi = self._bracket()
        widening = bool(self._unstable())
        if hi is None:  # nothing failed every time so far: double, up to the cap
            if lo is None:  # the smallest load passed and failed: no measurement can make it pass every time
                runs = self._runs(o.start)
                self.notes.append(f"{self._label(o.start)} passed {sum(runs)} of {len(runs)} times: no load passed "
                                  "every time it was measured, so there is no capacity to give; measured again it "
                                  "could only stay unstable (a busy host, or an SLO this close to what the engine "
                                  "does at its smallest load)")
                self._verdict = "unstable at smallest load"
                return None
            if lo >= o.cap:
                if len(self._runs(lo)) < 2:
                    return lo, "verify", f"re-measure the cap ({o.cap_reason}) with fresh prompts"
                self.notes.append(f"the SLO still holds at the cap, {self._label(lo)} ({o.cap_reason}): "
                                  "the capacity is at least that")
                self._verdict = "capped"
                return None
            nxt = min(lo * 2, o.cap)
            guided = self._trend_step(lo, nxt)
            if guided is not None and not self._runs(guided[0]):
                return guided[0], ("widen" if widening else "bracket"), guided[1]
            while self._runs(nxt) and nxt < o.cap:  # an unstable load in the way: step past it
                nxt = min(nxt * 2, o.cap)
            if self._runs(nxt):  # up to the cap every load above the last passing one is unstable
                if len(self._runs(lo)) < 2:
                    return lo, "verify", "re-measure the last passing load with fresh prompts"
                self.notes.append(f"above {self._label(lo)} every load measured up to the cap ({o.cap_reason}) "
                                  "passed some times and failed others: the capacity is the last load that "
                                  "passed every time")
                self._verdict = "unstable above"
                return None
            why = f"{self._label(lo)} passed: double" + (" (up to the cap)" if nxt == o.cap else "")
            return nxt, ("widen" if widening else "bracket"), why
        if lo is None:  # the smallest load failed
            if len(self._runs(hi)) < 2:
                return hi, "verify", "the smallest load failed: re-measure it with fresh prompts"
            self.notes.append(f"the SLO fails already at the smallest load, {self._label(hi)}")
            self._verdict = "fails at smallest load"
            return None
        if self._below_floor():
            return None
        if hi - lo > o.resolution.width(hi):
            step = self._narrow(lo, hi)
            if step is not None and not self._runs(step[0]):
                return step[0], ("widen" if widening else "bisect"), step[1]
        if len(self._runs(lo)) < 2:
            return lo, "verify", "re-measure the last passing load with fresh prompts"
        if len(self._runs(hi)) < 2:
            return hi, "verify", "re-measure the first failing load with fresh prompts"
        self._verdict = "found"
        return None

    # --- the answer --------------------------------------------------------------------------------
    def result(self) -> dict[str, Any]:
        lo, hi = self._bracket()
        first_fail = [s for s in self.steps if s.load == hi and not s.judged["passed"]]
        last_pass = [s for s in self.steps if s.load == lo and s.judged["passed"]]
        binding = first_fail[-1].judged.get("binding") if first_fail else None
        return {"verdict": self._verdict or "searching", "capacity": lo,
                "boundary": {"max_passing": lo, "min_failing": hi, "unstable": self._unstable()},
                "binding": binding, "shape": _shape(last_pass, first_fail),
                "cap": {"load": self.opts.cap, "reason": self.opts.cap_reason},
                "resolution": self.opts.resolution.text, "notes": list(self.notes),
                "client_procs": {"count": self.procs, "why": self.procs_why},
                "floor": self.opts.floor, "below_floor": self._below,
                "steps": [{"step": i + 1, "load": s.load, "phase": s.phase, "why": s.why, "then": s.then,
                           "passed": s.judged["passed"], "client_procs": s.judged.get("client_procs"),
                           "judged": s.judged} for i, s in enumerate(self.steps)]}


def _completed_rate(judged: Judged) -> Optional[float]:
    """Requests a point completed a second (failed ones left out), over its window; None without a window."""
    window = judged.get("window_s") or 0.0
    measured = judged.get("measured")
    if window <= 0 or measured is None:
        return None
    return (measured - (judged.get("failed_requests") or 0)) / window


CLIFF_RATIO = 2.0  # TTFT at the first failing load at least this many times the last passing one's


def _ratio(judged: Judged, key: str) -> Optional[float]:
    """Threshold `key`'s value as a share of its limit in one judged point (servedeck.slo.judge's rows)."""
    for row in judged.get("thresholds") or []:
        if row.get("key") == key and row.get("ratio") is not None:
            return float(row["ratio"])
    return None


def _figure(judged: Judged, prefix: str) -> Optional[float]:
    for row in judged.get("thresholds") or []:
        if row["key"].startswith(prefix) and row.get("value") is not None:
            return float(row["value"])
    return None


def _shape(last_pass: list[Step], first_fail: list[Step]) -> Optional[dict[str, Any]]:
    """Cliff (queueing: TTFT jumps past the boundary) or smooth, from the TTFT median either side."""
    if not last_pass or not first_fail:
        return None
    a = [s.judged.get("ttft_p50_ms") for s in last_pass]
    b = [s.judged.get("ttft_p50_ms") for s in first_fail]
    a = [x for x in a if x]
    b = [x for x in b if x is not None]
    if not a or not b:
        return {"kind": "unknown", "detail": "no TTFT on one side of the boundary"}
    before, after = max(a), min(b)
    ratio = after / before
    kind = "cliff" if ratio >= CLIFF_RATIO else "smooth"
    return {"kind": kind, "ttft_p50_ms_last_passing": before, "ttft_p50_ms_first_failing": after,
            "ratio": ratio, "detail": (f"TTFT p50 {before:.0f} → {after:.0f} ms across the boundary (×{ratio:.1f}): "
                                       + ("queueing, a cliff" if kind == "cliff" else "a smooth rise"))}
