"""Who set a point's pace, and whether the client's lag matters: pure decisions (docs/loadgen.md, "The client's
self-check").

Two different things make a send late. The client can be short of CPU: a process near a full core, or one that
waited for a core a quarter of its window or more (runnable, not running), or one never idle (running or waiting
nearly its whole window), or a loop that fell behind while it was running rather than waiting (its own work);
more client processes cure that where there are cores for them. Or the host is busy: the client had CPU to spare
and waited little, but its wake-ups came a few ms late (2026-12-06, vLLM on a 16-CPU H100 host: 7 % of one core
per client process, lag p99 5-8 ms); more client processes change nothing there. Either way, whether a lag voids
a point depends on what it does to the figures the SLO reads; a client process near a full core voids it anyway
(its stamps are late whatever the sends say).

    short_of_cpu(procs)                       reasons a client process was short of CPU ([] when none was)
    saturated(procs)                          whether one ran near a full core
    lag_matters(lags_ms, readings, ...)       reasons the lag could move a figure the SLO reads ([] when not)
    loop_fell_behind(cpu, wait)               whether such a lag was the client's own loop's (running, not waiting)
    more_procs(current, free_cores, streams)  how many client processes to measure again with, and why

A lag reaches a figure by at most its own size: a first token stamped late by the loop (TTFT), a gap (ITL), the
end (E2E); spread over the answer for TPOT ((e2e − ttft) / (tokens − 1)). It matters when that reach is a
material share (`SHARE`, 5 %) of the figure's limit, for at least two requests (one late wake-up alone never
voids a point), or, in a closed loop, when the streams sat idle waiting on late sends for a material share of
their time (`SHORTFALL`, 5 %): the point then did not hold its concurrency. A margin thinner than the reach is
not a reason on its own: at the boundary every margin is thin, and a figure moved by under 5 % of its limit is
within the noise a re-measure shows anyway.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

SHORT_FRACTION = 0.9  # of the window busy or waiting for a core: the loop never idled
WAIT_FRACTION = 0.25  # of the window runnable but waiting for a core: short of CPU, whoever held the cores
MIN_WALL_S = 1.0  # under this the shares are start-up noise (imports, first connections)
SHARE = 0.05  # of a limit: a lag that can move a figure by this much matters
SHORTFALL = 0.05  # of a closed loop's time its streams waited on late sends


@dataclass(frozen=True)
class ProcUse:
    """One client process over the measured window: CPU time and time runnable but waiting for a core
    (Linux schedstat; None where the kernel does not say), seconds. `index` None: the only process."""

    index: Optional[int]
    cpu_s: Optional[float]
    wall_s: Optional[float]
    wait_s: Optional[float] = None


@dataclass(frozen=True)
class Reading:
    """A figure the SLO reads: `key` (ttft_p90), `figure` (ttft, tpot, itl, e2e, error_rate), its value and limit (ms)."""

    key: str
    figure: str
    value_ms: Optional[float]
    limit_ms: float


def short_of_cpu(procs: Sequence[ProcUse], *, fraction: float = SHORT_FRACTION, wait_fraction: float = WAIT_FRACTION,
                 min_wall_s: float = MIN_WALL_S) -> list[str]:
    """A reason for each client process short of CPU: it ran `fraction` of a core or more, or it waited for a core
    `wait_fraction` of its window or more (runnable, not running: whoever held the cores, a process of its own on
    a freer core would not wait so), or it was running or waiting `fraction` of its window (never idle)."""
    out = []
    for p in procs:
        if p.cpu_s is None or not p.wall_s or p.wall_s < min_wall_s:
            continue
        who = "client" if p.index is None else f"client process {p.index}"
        cpu = p.cpu_s / p.wall_s
        wait = (p.wait_s or 0.0) / p.wall_s
        if cpu >= fraction:
            out.append(f"{who} CPU {cpu:.0%} of a core >= {fraction:.0%}")
        elif wait >= wait_fraction or cpu + wait >= fraction:
            out.append(f"{who} ran {cpu:.0%} of its window and waited for a core {wait:.0%} of it"
                       + (f" (>= {wait_fraction:.0%})" if wait >= wait_fraction else
                          f": its loop never idled (>= {fraction:.0%})"))
    return out


def saturated(procs: Sequence[ProcUse], *, fraction: float = SHORT_FRACTION, min_wall_s: float = MIN_WALL_S) -> bool:
    """A client process ran `fraction` of a core or more: its loop stamps late whatever the lag says."""
    return any(p.cpu_s is not None and p.wall_s and p.wall_s >= min_wall_s and p.cpu_s / p.wall_s >= fraction
               for p in procs)


def lag_reach_ms(figure: str, lag_ms: float, output_tokens: Optional[int]) -> float:
    """How far a send or loop delay of `lag_ms` can move one request's `figure`."""
    if figure == "tpot":
        return lag_ms / (output_tokens - 1) if output_tokens and output_tokens > 1 else 0.0
    if figure in ("ttft", "itl", "e2e"):
        return lag_ms
    return 0.0  # error_rate: a late send is not a failed one


def lag_matters(lags_ms: Sequence[float], readings: Sequence[Reading], *, output_tokens: Optional[int],
                e2e_mean_ms: Optional[float], closed_loop: bool, share: float = SHARE,
                shortfall: float = SHORTFALL) -> list[str]:
    """The reasons the point's schedule lag could move what the SLO reads; [] when it cannot."""
    if not lags_ms:
        return []
    import numpy as np  # here, not at the top: every servedeck command imports loadgen

    lags = np.asarray(lags_ms, dtype=float)
    p99 = float(np.percentile(lags, 99))
    out = []
    for r in readings:
        reach = lag_reach_ms(r.figure, 1.0, output_tokens)  # per ms of lag
        if reach <= 0 or not r.limit_ms > 0:
            continue
        bar = share * r.limit_ms / reach  # the lag that moves this figure by `share` of its limit
        over = int((lags > bar).sum())
        if p99 > bar and over >= 2:
            moved = p99 * reach
            out.append(f"schedule lag p99 {p99:.1f} ms can move {r.key} by {moved:.1f} ms, "
                       f"{moved / r.limit_ms:.0%} of its {_ms(r.limit_ms)} limit (>= {share:.0%}; "
                       f"{over} of {len(lags)} requests sent later than {bar:.1f} ms)")
    if closed_loop and e2e_mean_ms and e2e_mean_ms > 0:
        mean = float(lags.mean())
        idle = mean / (mean + e2e_mean_ms)
        if idle >= shortfall:
            out.append(f"each stream waited on late sends {idle:.0%} of its time (lag mean {mean:.1f} ms beside "
                       f"E2E mean {e2e_mean_ms:.0f} ms): the point did not hold its concurrency (>= {shortfall:.0%})")
    return out


def loop_fell_behind(cpu_fraction: Optional[float], wait_fraction: Optional[float]) -> Optional[str]:
    """Whose a lag that matters was, when the client was not short of CPU: its own loop's (it was running, not
    waiting for a core, more of the time: work of its own, like a wave of 256 streams ending together, kept it
    from the schedule, and more client processes split that work), said as a reason; None when it waited for a
    core at least as long as it ran, or the kernel does not say (the host's cores were busy: more processes would
    wait the same)."""
    if cpu_fraction is None or wait_fraction is None or wait_fraction >= cpu_fraction:
        return None
    return (f"the client's loop fell behind while it had the CPU (running {cpu_fraction:.0%} of its window, "
            f"waiting for a core {wait_fraction:.0%})")


def more_procs(current: int, free_cores: Optional[float], streams: int) -> tuple[Optional[int], str]:
    """How many client processes to measure again with, after `current` were short of CPU: as many as the
    host's free cores (cores not busy with anything but the client), at least one more, never more than
    the streams. (None, why) when every stream already has its own process."""
    if current >= streams:
        return None, "every stream already has its own client process"
    free = int(math.floor(free_cores)) if free_cores is not None else 0
    if free > current:
        n = min(free, streams)
        return n, (f"{n} client processes: the host had {free_cores:.1f} cores free of other work"
                   + (f" ({streams} streams)" if n == streams and free > streams else ""))
    n = current + 1
    return n, (f"{n} client processes: one more, though the host had no free core beyond the client's "
               f"{current} ({_cores(free_cores)} free of other work): whether it helps is what the re-measure shows")


def _cores(x: Optional[float]) -> str:
    return "unknown" if x is None else f"{x:.1f}"


def _ms(ms: float) -> str:
    return f"{ms / 1000:g} s" if ms >= 1000 else f"{ms:g} ms"
