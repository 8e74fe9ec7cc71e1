"""Figures as inline SVG text (matplotlib, Agg): no network, no JavaScript, one file.

Each figure gets its own `svg.hashsalt`, so the ids matplotlib writes (clip paths) stay unique when
several figures sit in one HTML page. Hollow markers: points that do not count (failed or missing
gate, client-bound), named in the legend.
"""

from __future__ import annotations

import io
from typing import Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from servedeck.report.pareto import LoadPoint, ParetoRow  # noqa: E402

COLOURS = plt.rcParams["axes.prop_cycle"].by_key()["color"]


def _svg(fig: "plt.Figure", salt: str) -> str:
    buf = io.StringIO()
    with plt.rc_context({"svg.hashsalt": salt}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata={"Date": None})
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and doctype: the SVG sits inside HTML


def _colour(variants: Sequence[str], v: str) -> str:
    return COLOURS[list(variants).index(v) % len(COLOURS)]


def pareto_svg(rows: list[ParetoRow], variants: Sequence[str]) -> str:
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    per = "GPU" if rows and all(r.per == "GPU" for r in rows) else "host"
    hollow_seen: set[str] = set()
    for v in variants:
        mine = [r for r in rows if r.point.variant == v and r.x is not None and r.y is not None]
        if not mine:
            continue
        c = _colour(variants, v)
        ax.plot([r.x for r in mine], [r.y for r in mine], "-", color=c, alpha=0.5, linewidth=1)
        ok = [r for r in mine if r.eligible]
        ax.plot([r.x for r in ok], [r.y for r in ok], "o", color=c, label=v, markersize=7)
        for r in mine:
            ax.annotate(r.point.label, (r.x, r.y), textcoords="offset points", xytext=(5, 4), fontsize=7, color=c)
        bad = [r for r in mine if not r.eligible]
        for why in sorted({"; ".join(r.why_not) for r in bad}):
            grp = [r for r in bad if "; ".join(r.why_not) == why]
            label = f"{v}: {why} (not a result)"
            ax.plot([r.x for r in grp], [r.y for r in grp], "o", markerfacecolor="none", markeredgecolor=c,
                    markeredgewidth=1.6, markersize=9, label=label if label not in hollow_seen else None)
            hollow_seen.add(label)
    front = sorted((r for r in rows if r.on_frontier), key=lambda r: r.x)  # type: ignore[arg-type,return-value]
    if front:
        ax.plot([r.x for r in front], [r.y for r in front], "--", color="black", linewidth=1.4, label="Pareto frontier")
    ax.set_xlabel("per-user output tok/s (1 / TPOT p50)")
    ax.set_ylabel(f"output tok/s per {per}")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="best")
    ax.set_title("Throughput against per-user speed", fontsize=10)
    return _svg(fig, "pareto")


def latency_svg(points: list[LoadPoint], variants: Sequence[str], loop: str) -> str:
    """TTFT and TPOT p50 (solid) and p99 (dotted) against concurrency or rate, one colour per variant."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, name in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "tpot_ms", "TPOT")):
        for v in variants:
            mine = [p for p in points if p.variant == v and p.loop == loop]
            if not mine:
                continue
            c = _colour(variants, v)
            xs = [p.order for p in mine]
            for stat, style in (("p50", "-o"), ("p99", ":^")):
                ys = [p.spread(key, stat).mean for p in mine]
                ax.plot(xs, [y if y is not None else float("nan") for y in ys], style, color=c,
                        label=f"{v} {stat}", markersize=5)
        ax.set_xlabel("concurrency" if loop == "closed" else "arrival rate (req/s)")
        ax.set_ylabel(f"{name} (ms)")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=6)
    fig.suptitle(f"Latency against {'concurrency' if loop == 'closed' else 'rate'}", fontsize=10)
    return _svg(fig, f"latency-{loop}")


def long_prompt_svg(series: dict[str, list[tuple[float, Optional[float], Optional[float]]]],
                    variants: Sequence[str]) -> str:
    """series: variant → [(prompt tokens, prefill tok/s, TTFT ms)]."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for v, pts in series.items():
        pts = sorted(pts)
        c = _colour(variants, v)
        axes[0].plot([p[0] for p in pts], [p[1] if p[1] is not None else float("nan") for p in pts], "-o", color=c, label=v)
        axes[1].plot([p[0] for p in pts], [p[2] if p[2] is not None else float("nan") for p in pts], "-o", color=c, label=v)
    for ax, name in ((axes[0], "prefill tok/s (p50)"), (axes[1], "TTFT p50 (ms)")):
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle("Long prompts: prefill and time to first token against length", fontsize=10)
    return _svg(fig, "long-prompt")
