"""Figures as inline SVG text (matplotlib, Agg): no network, no JavaScript, one file.

Each figure gets its own `svg.hashsalt`, so the ids matplotlib writes (clip paths) stay unique when
several figures sit in one HTML page. Hollow markers: points that do not count (failed or missing
gate, client-bound), named in the legend.
"""

from __future__ import annotations

import io
from typing import Collection, Optional, Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from matplotlib.transforms import Bbox  # noqa: E402

from servedeck.report.caveats import not_a_result  # noqa: E402
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


def _from_zero(ax: "plt.Axes") -> None:
    """Rate and latency axes start at zero: two variants 1.5 % apart must not look far apart."""
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)


def _overlaps(box: Bbox, others: list[Bbox]) -> bool:
    return any(box.overlaps(o) for o in others)


def place_labels(ax: "plt.Axes", points: list[tuple[float, float, str, str]], fontsize: int = 7) -> None:
    """Point labels that do not overlap one another or the markers: one label for points of the same
    text that sit on top of each other (three variants' c=1 in one spot), and for each label the first
    offset, of a few around its point, where it collides with nothing drawn so far."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    to_px = ax.transData.transform
    groups: list[tuple[float, float, str, str]] = []
    for x, y, text, colour in sorted(points, key=lambda p: -p[1]):
        px = to_px((x, y))
        near = next((g for g in groups if g[2] == text and abs(to_px((g[0], g[1]))[0] - px[0]) < 14
                     and abs(to_px((g[0], g[1]))[1] - px[1]) < 14), None)
        if near is None:
            groups.append((x, y, text, colour))
        elif near[3] != colour:  # several variants under one label: draw it in black
            groups[groups.index(near)] = (near[0], near[1], text, "black")
    markers = [Bbox.from_bounds(*(to_px((x, y)) - 5), 10, 10) for x, y, _, _ in points]
    placed: list[Bbox] = []
    offsets = [(5, 4), (5, -11), (-6, 4), (-6, -11), (5, 13), (5, -20), (-6, 13), (-6, -20), (14, -4), (-15, -4)]
    for x, y, text, colour in groups:
        for i, (dx, dy) in enumerate(offsets):
            ann = ax.annotate(text, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=fontsize,
                              color=colour, ha="left" if dx > 0 else "right")
            box = ann.get_window_extent(renderer)
            if not _overlaps(box, placed + markers) or i == len(offsets) - 1:
                placed.append(box)
                break
            ann.remove()


def pareto_figure(rows: list[ParetoRow], variants: Sequence[str]) -> "plt.Figure":
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    per = "GPU" if rows and all(r.per == "GPU" for r in rows) else "host"
    hollow_seen: set[str] = set()
    labels: list[tuple[float, float, str, str]] = []
    for v in variants:
        mine = [r for r in rows if r.point.variant == v and r.x is not None and r.y is not None]
        if not mine:
            continue
        c = _colour(variants, v)
        ok = [r for r in mine if r.eligible]
        # the legend's entry for the variant is its curve, with a filled marker only if one is drawn
        ax.plot([r.x for r in mine], [r.y for r in mine], "-", color=c, alpha=0.5, linewidth=1,
                marker="o" if ok else None, markersize=7 if ok else 0, markevery=[i for i, r in enumerate(mine)
                                                                               if r.eligible] or None,
                label=v)
        labels += [(r.x, r.y, r.point.label, c) for r in mine]  # type: ignore[misc]
        bad = [r for r in mine if not r.eligible]
        for why in sorted({"; ".join(r.why_not) for r in bad}):
            grp = [r for r in bad if "; ".join(r.why_not) == why]
            label = f"{v}: {why} (not a result)"
            ax.plot([r.x for r in grp], [r.y for r in grp], "o", markerfacecolor="none", markeredgecolor=c,
                    markeredgewidth=1.6, markersize=9, label=label if label not in hollow_seen else None)
            hollow_seen.add(label)
    from servedeck.report.capacity import is_capacity_point  # each variant's capacity under an SLO, starred

    caps = [r for r in rows if r.x is not None and r.y is not None and is_capacity_point(r.point)]
    for i, r in enumerate(caps):
        ax.plot([r.x], [r.y], "*", markersize=15, markerfacecolor="none", markeredgecolor="black",
                markeredgewidth=1.2, label="capacity under an SLO" if i == 0 else None)
    front = sorted((r for r in rows if r.on_frontier), key=lambda r: r.x)  # type: ignore[arg-type,return-value]
    if front:
        ax.plot([r.x for r in front], [r.y for r in front], "--", color="black", linewidth=1.4, label="Pareto frontier")
    ax.set_xlabel("per-user output tok/s (1 / TPOT p50)")
    ax.set_ylabel(f"output tok/s per {per}")
    ax.grid(alpha=0.3)
    _from_zero(ax)
    place_labels(ax, labels)
    ax.legend(fontsize=7, loc="best")
    title = "Throughput against per-user speed"
    if rows and not any(r.eligible for r in rows):
        title += " — NOT A RESULT: no point counts (hollow)"
    ax.set_title(title, fontsize=10)
    return fig


def pareto_svg(rows: list[ParetoRow], variants: Sequence[str]) -> str:
    return _svg(pareto_figure(rows, variants), "pareto")


def latency_figure(points: list[LoadPoint], variants: Sequence[str], loop: str) -> "plt.Figure":
    """TTFT and TPOT p50 (solid) and p99 (dotted) against concurrency or rate, one colour per variant;
    the points of a launch that is not a result are hollow and the legend says so."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for ax, key, name in ((axes[0], "ttft_ms", "TTFT"), (axes[1], "tpot_ms", "TPOT")):
        for v in variants:
            mine = [p for p in points if p.variant == v and p.loop == loop]
            if not mine:
                continue
            c = _colour(variants, v)
            why = not_a_result([r for p in mine for r in p.runs])
            xs = [p.order for p in mine]
            for stat, line, marker in (("p50", "-", "o"), ("p99", ":", "^")):
                ys = [p.spread(key, stat).mean for p in mine]
                ax.plot(xs, [y if y is not None else float("nan") for y in ys], line, marker=marker, color=c,
                        markerfacecolor="none" if why else c,
                        label=f"{v} {stat}" + (f" ({why}: not a result)" if why else ""), markersize=5)
        ax.set_xlabel("concurrency" if loop == "closed" else "arrival rate (req/s)")
        ax.set_ylabel(f"{name} (ms)")
        ax.grid(alpha=0.3)
        _from_zero(ax)
        ax.legend(fontsize=6)
    fig.suptitle(f"Latency against {'concurrency' if loop == 'closed' else 'rate'}", fontsize=10)
    return fig


def latency_svg(points: list[LoadPoint], variants: Sequence[str], loop: str) -> str:
    return _svg(latency_figure(points, variants, loop), f"latency-{loop}")


Series = dict[str, list[tuple[float, Optional[float], Optional[float], Optional[float]]]]


def long_prompt_figure(series: Series, variants: Sequence[str], not_results: Collection[str] = ()) -> "plt.Figure":
    """series: variant → [(prompt tokens, client prefill tok/s, TTFT ms, engine prefill tok/s)]."""
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    nan = float("nan")
    for v, pts in series.items():
        pts = sorted(pts, key=lambda p: p[0])
        c = _colour(variants, v)
        tag = " (not a result)" if v in not_results else ""
        face = "none" if v in not_results else c
        xs = [p[0] for p in pts]
        axes[0].plot(xs, [p[1] if p[1] is not None else nan for p in pts], "-o", color=c, markerfacecolor=face,
                     label=f"{v}: client (tokens / TTFT){tag}")
        if any(p[3] is not None for p in pts):
            axes[0].plot(xs, [p[3] if p[3] is not None else nan for p in pts], "--s", color=c,
                         markerfacecolor=face, label=f"{v}: engine's own{tag}")
        axes[1].plot(xs, [p[2] if p[2] is not None else nan for p in pts], "-o", color=c, markerfacecolor=face,
                     label=f"{v}{tag}")
    for ax, name in ((axes[0], "prefill tok/s (p50)"), (axes[1], "TTFT p50 (ms)")):
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel(name)
        ax.grid(alpha=0.3)
        _from_zero(ax)
        ax.legend(fontsize=6)
    fig.suptitle("Long prompts: prefill and time to first token against length", fontsize=10)
    return fig


def long_prompt_svg(series: Series, variants: Sequence[str], not_results: Collection[str] = ()) -> str:
    return _svg(long_prompt_figure(series, variants, not_results), "long-prompt")
