"""How figures are written for people, everywhere a run is shown: milliseconds, counts, shares (tables:
servedeck/mdtable.py).
Pure, and below everything that renders (each workload kind renders its own figures with these)."""

from __future__ import annotations

from typing import Optional


def ms(x: Optional[float]) -> str:
    if x is None:
        return "-"
    if abs(x) >= 10_000:
        return f"{x / 1000:.1f} s"
    if abs(x) >= 100:
        return f"{x:.0f} ms"
    return f"{x:.1f} ms"


def _precision_ms(x: float) -> float:
    """The step of the last digit ms() writes for x."""
    return 100.0 if abs(x) >= 10_000 else 1.0 if abs(x) >= 100 else 0.1


def quantile_text(x: Optional[float], bucket: Optional[tuple[float, float]]) -> str:
    """A quantile read from a histogram (x interpolated inside `bucket`, both in ms), at the histogram's
    resolution: the figure where the bucket is no wider than the figure's last digit, else the bucket itself
    ("≤ 300 ms", "500–800 ms", "> 7,680 s"), since where inside it the quantile lies is a guess."""
    if x is None:
        return "-"
    if not bucket:
        return ms(x)
    lo, hi = bucket
    if hi - lo <= _precision_ms(x):
        return ms(x)
    in_s = (lo if hi == float("inf") else hi) >= 10_000
    unit, div = ("s", 1000.0) if in_s else ("ms", 1.0)
    if hi == float("inf"):
        return f"> {lo / div:,g} {unit}"
    if lo <= 0:
        return f"≤ {hi / div:,g} {unit}"
    return f"{lo / div:,g}–{hi / div:,g} {unit}"


def num(x: Optional[float], digits: int = 1) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1%}"
