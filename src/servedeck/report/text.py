"""How figures are written for people, everywhere a run is shown: milliseconds, counts, shares, tables.
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


def num(x: Optional[float], digits: int = 1) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}f}"


def pct(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.1%}"


def table(head: list[str], rows: list[list[str]]) -> str:
    """A markdown table; a `|` or a newline inside a cell cannot break it."""
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    out += ["| " + " | ".join(c.replace("|", "\\|").replace("\n", "⏎") for c in row) + " |" for row in rows]
    return "\n".join(out)
