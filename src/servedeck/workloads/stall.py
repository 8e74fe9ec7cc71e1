"""Long requests: progress while they run, and stalled told from slow.

A 1M-token prefill sends no byte for many minutes and is healthy; a wedged engine sends none
either. A request quiet for `stall_after_s` is judged by the engine's own progress counters
(watch/liveness.judge, the same rule the watch loop uses): counters moved since the silence began
→ slow, keep waiting (noted); they did not move, or /metrics cannot be read → stalled, the request
is ended and recorded as stalled with that evidence.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from servedeck.workloads.target import Target
from servedeck.engines import get_engine
from servedeck.engines.metrics import read_counters
from servedeck.loadgen.api import ApiClient
from servedeck.watch.liveness import judge

STALLED_PREFIX = "stalled:"


@dataclass
class Quiet:
    """The silence of one request: when it began, its last byte, tokens so far (perf_counter s)."""

    t_begin: float = 0.0
    t_last: float = 0.0
    tokens: int = 0
    # the live request's (perf_counter of its last byte, chunks so far), None when none is in flight:
    # read at each look, so the client need not report every byte
    follow: Optional[Callable[[], Optional[tuple[float, int]]]] = None

    def refresh(self) -> None:
        live = self.follow() if self.follow is not None else None
        if live is not None:
            self.t_last, self.tokens = live

    def begin(self, t: float) -> None:
        self.t_begin = self.t_last = t

    def byte(self, t: float) -> None:
        self.t_last = t

    def token(self) -> None:
        self.tokens += 1

    def since_byte(self, now: Optional[float] = None) -> float:
        return (now or time.perf_counter()) - self.t_last


@dataclass
class StallJudge:
    """Engine counters at the start of each request's silence, and the verdict once it lasts."""

    target: Target
    stall_after_s: float
    baselines: dict[Any, Optional[dict[str, float]]] = field(default_factory=dict)
    slow: list[dict[str, Any]] = field(default_factory=list)

    async def _sample(self) -> Optional[dict[str, float]]:
        names = get_engine(self.target.engine).metrics
        # generous: llama.cpp answers /metrics from its main loop, after the batch in progress
        return await asyncio.to_thread(read_counters, self.target.base_url, names, 10.0)

    async def _answers_health(self) -> bool:
        async with ApiClient(self.target.base_url) as api:
            r = await api.get(self.target.server.health_path, timeout_s=5.0)
        return r.ok

    async def check(self, key: Any, quiet_s: float, tick_s: float) -> Optional[dict[str, Any]]:
        """None while fine (or slow); a verdict {"status": "stalled", …} once the silence is a stall."""
        if quiet_s < tick_s:
            self.baselines.pop(key, None)  # bytes came since the last look: a new silence starts later
            return None
        if key not in self.baselines:
            self.baselines[key] = await self._sample()
        if quiet_s < self.stall_after_s:
            return None
        before, after = self.baselines[key], await self._sample()
        if after is None and await self._answers_health():
            # Busy rather than stuck: the page that would say so waits behind the work itself.
            self.slow.append({"request": str(key), "quiet_s": round(quiet_s, 1),
                              "detail": "no byte of the answer and /metrics did not answer in 10 s, but /health "
                                        "did: taken as busy, not stalled"})
            return None
        verdict, detail, moved = judge(True, "", False, quiet_s, before, after)
        detail = detail.replace("answers health but not a 1-token completion", "no byte of the answer")
        if verdict == "slow":
            detail = detail.replace("no answer to a 1-token completion", "no byte of the answer")
            self.slow.append({"request": str(key), "quiet_s": round(quiet_s, 1), "detail": detail})
            self.baselines[key] = after  # judge the next stretch of silence on its own
            return None
        return {"status": "stalled", "quiet_s": round(quiet_s, 1), "detail": f"{STALLED_PREFIX} {detail}",
                "moved": moved}


class StallWatch:
    """Watches one request task: progress ticks, its time limit, and stalls."""

    def __init__(self, target: Target, stall_after_s: Optional[float], timeout_s: Optional[float],
                 on_tick: Callable[[Quiet], None], tick_s: Optional[float] = None, cap_at: Optional[float] = None,
                 cap_what: str = "the time cap"):
        self.judge = StallJudge(target, stall_after_s or float("inf"))
        self.stall_after_s = stall_after_s
        self.timeout_s = timeout_s
        self.on_tick = on_tick
        # a deadline of the whole run (perf_counter), not of this request: passing it ends the request as
        # "time-capped", which its caller leaves out of the figures
        self.cap_at, self.cap_what = cap_at, cap_what
        left = cap_at - time.perf_counter() if cap_at is not None else None
        limits = [x for x in (stall_after_s, timeout_s, left) if x and x > 0]
        self.tick_s = tick_s or max(0.2, min([10.0] + [x / 4 for x in limits]))

    async def watch(self, task: "asyncio.Future[Any]", quiet: Quiet) -> Optional[dict[str, Any]]:
        """None when the task finished by itself; else the verdict after cancelling it."""
        last_tick = time.perf_counter()
        while True:
            done, _ = await asyncio.wait({task}, timeout=self.tick_s)
            if done:
                return None
            quiet.refresh()
            now = time.perf_counter()
            if now - last_tick >= 10.0:
                self.on_tick(quiet)
                last_tick = now
            verdict = None
            if self.cap_at is not None and now >= self.cap_at:
                verdict = {"status": "time-capped", "detail": f"{self.cap_what} passed during this request "
                                                              f"({quiet.tokens} tokens had come)"}
            elif self.timeout_s is not None and now - quiet.t_begin >= self.timeout_s:
                verdict = {"status": "timed-out", "detail": f"no complete answer within {self.timeout_s:g} s "
                                                            f"({quiet.tokens} tokens had come)"}
            elif self.stall_after_s is not None:
                verdict = await self.judge.check("turn", quiet.since_byte(), self.tick_s)
            if verdict is not None:
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)
                verdict["slow_before"] = self.judge.slow
                return verdict
