"""Whether an open-loop rate is more than the server keeps up with, decided while the point runs.

Pure: fed the point's elapsed time and the requests finished so far (when each finished, its TTFT), it
says "overloaded" when both hold: arrivals outpace completions (over the latest half of the point the
server finished fewer than `keep_up` of the requests the schedule sent, and the backlog grew since the
half-way mark) and TTFT keeps rising (the median of the latest third of finished requests is at least
`rising` times that of the first third). A server that keeps up shows neither; one that does not would
only queue deeper for the rest of the point, so the point ends early as failed, with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from statistics import median
from typing import Optional


@dataclass
class OverloadJudge:
    rate: float  # requests/s the schedule sends
    min_elapsed_s: float = 3.0  # say nothing before this much of the point has run
    min_finished: int = 6  # nor before this many requests finished (thirds of TTFT need a few)
    keep_up: float = 0.8
    rising: float = 1.5
    finished: list[tuple[float, Optional[float]]] = field(default_factory=list)  # (finished at s, TTFT s)

    def saw(self, at_s: float, ttft_s: Optional[float]) -> None:
        """A measured request finished `at_s` seconds into the point (TTFT None: it failed)."""
        self.finished.append((at_s, ttft_s))

    def check(self, elapsed_s: float) -> Optional[str]:
        """The reason the point is overloaded, or None while it keeps up (or it is too early to say)."""
        if elapsed_s < self.min_elapsed_s or len(self.finished) < self.min_finished:
            return None
        half = elapsed_s / 2
        sent_late = self.rate * (elapsed_s - half)
        done_late = sum(1 for at, _ in self.finished if at >= half)
        backlog_half = self.rate * half - sum(1 for at, _ in self.finished if at < half)
        backlog_now = self.rate * elapsed_s - len(self.finished)
        if done_late >= self.keep_up * sent_late or backlog_now <= backlog_half:
            return None
        ttfts = [t for _, t in self.finished if t is not None]
        if len(ttfts) < self.min_finished:
            return None
        third = len(ttfts) // 3
        early, late = median(ttfts[:third]), median(ttfts[-third:])
        if early <= 0 or late < self.rising * early:
            return None
        return (f"overloaded: arrivals outpace completions ({done_late} finished against {sent_late:.0f} sent over "
                f"the last {elapsed_s - half:.1f} s; backlog {backlog_half:.0f} → {backlog_now:.0f}) and TTFT keeps "
                f"rising (median {early * 1000:.0f} → {late * 1000:.0f} ms); ended after {elapsed_s:.1f} s")
