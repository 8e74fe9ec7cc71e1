"""What a report section is made of, and its two renderings (report.md, report.html).

Sections build blocks; a cell or a line may carry links (to run folders and their files), so every
table row and figure says where its numbers came from. Links are absolute paths until rendering,
which makes them relative to the report's folder; `moved` (a run folder → its copy inside the report's
folder, see build.py) sends a link to the copy instead.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional, Union

from markupsafe import Markup, escape

from servedeck.mdtable import cell, table


@dataclass(frozen=True)
class Link:
    text: str
    target: Path


Cell = Union[str, Link, list]  # a list: several links/texts in one cell


@dataclass
class Para:
    parts: list[Cell]


@dataclass
class Table:
    head: list[str]
    rows: list[list[Cell]]


@dataclass
class Figure:
    svg: str
    caption: str
    sources: list[Link] = field(default_factory=list)


@dataclass
class Pre:
    text: str
    source: Optional[Link] = None


Block = Union[Para, Table, Figure, Pre]


@dataclass
class Section:
    id: str
    title: str
    blocks: list[Block]


Moved = dict[Path, Path]  # a folder the report links into → where its copy is


def _rel(target: Path, base: Path, moved: Optional[Moved] = None) -> str:
    for src, copy in (moved or {}).items():
        if target == src or src in target.parents:
            target = copy / target.relative_to(src)
            break
    return os.path.relpath(target, base)


def _md_cell(c: Cell, base: Path, moved: Optional[Moved] = None) -> str:
    if isinstance(c, Link):
        return f"[{c.text}]({_rel(c.target, base, moved)})"
    if isinstance(c, list):
        return " ".join(_md_cell(x, base, moved) for x in c)
    return cell(c)


def markdown(title: str, sections: list[Section], base: Path, moved: Optional[Moved] = None) -> str:
    out = [f"# {title}", ""]
    out += [f"- [{s.title}](#{s.id})" for s in sections] + [""]
    for s in sections:
        out += [f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, Para):
                out += ["".join(_md_cell(p, base, moved) for p in b.parts), ""]
            elif isinstance(b, Table):
                out += [table(b.head, [[_md_cell(c, base, moved) for c in row] for row in b.rows], markdown=True), ""]
            elif isinstance(b, Figure):
                out += [f"*Figure: {b.caption}* (drawn in report.html) — sources: "
                        + ", ".join(_md_cell(x, base, moved) for x in b.sources), ""]
            elif isinstance(b, Pre):
                out += (["from " + _md_cell(b.source, base, moved) + ":"] if b.source else []) + ["```", b.text, "```", ""]
    return "\n".join(out).rstrip() + "\n"


def html_cell(c: Cell, base: Path, moved: Optional[Moved] = None) -> Markup:
    if isinstance(c, Link):
        return Markup('<a href="{}">{}</a>').format(_rel(c.target, base, moved), c.text)
    if isinstance(c, list):
        return Markup(" ").join(html_cell(x, base, moved) for x in c)
    return escape(str(c))
