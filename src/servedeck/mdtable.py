"""Markdown tables, written one way wherever servedeck writes one (a run's summary, reports, campaign views,
the page): one writer and one escaping rule, below everything that renders.

Hand-written rather than tabulate's "pipe" format: tabulate leaves a `|` inside a cell as it is, which splits
the row, and a line break ends it; the rule below is the part that matters, and it is two replaces."""

from __future__ import annotations

from typing import Any, Iterable, Sequence

_ALIGN = {"l": "---", "r": "---:", "c": ":---:"}


def cell(value: Any) -> str:
    """A cell's text that cannot break its row: `|` escaped as `\\|`, each line break shown as ⏎ (kept
    visible: a model's output or a log line in a cell may hinge on one). None is an empty cell."""
    text = "" if value is None else str(value)
    return text.replace("|", "\\|").replace("\r\n", "⏎").replace("\n", "⏎").replace("\r", "⏎")


def table(head: Sequence[Any], rows: Iterable[Sequence[Any]], align: str = "", *, markdown: bool = False) -> str:
    """A Markdown table, its lines joined (table_lines says how it is written)."""
    return "\n".join(table_lines(head, rows, align, markdown=markdown))


def table_lines(head: Sequence[Any], rows: Iterable[Sequence[Any]], align: str = "", *,
                markdown: bool = False) -> list[str]:
    """A Markdown table's lines. `align` has a letter per column, l(eft), r(ight) or c(entre), all left when
    empty. Every cell goes through cell(), the header's too; with markdown=True the rows' cells are Markdown
    already (links, bold) whose text the caller passed through cell() itself."""
    if align and len(align) != len(head):
        raise ValueError(f"align {align!r} has {len(align)} letters for {len(head)} columns")
    if any(a not in _ALIGN for a in align):
        raise ValueError(f"align {align!r}: each letter is l, r or c")
    rule = [_ALIGN[a] for a in (align or "l" * len(head))]
    out = ["| " + " | ".join(cell(h) for h in head) + " |", "|" + "|".join(rule) + "|"]
    for row in rows:
        out.append("| " + " | ".join(str(c) if markdown else cell(c) for c in row) + " |")
    return out
