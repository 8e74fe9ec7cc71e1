"""What a page section is made of: the report's paragraphs, tables and preformatted text (report/blocks.py),
whose cells here are text, links to absolute paths (the page is printed, not written beside its records,
so a link cannot be relative to it) and marks (the **STALE** mark a figure carries)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from servedeck.report.blocks import Para, Pre, Section, Table

__all__ = ["Cell", "Link", "Mark", "Para", "Pre", "Section", "Table"]


@dataclass(frozen=True)
class Link:
    text: str
    target: str  # an absolute path


@dataclass(frozen=True)
class Mark:
    """A stale mark, or another word the reader must not miss."""

    text: str
    kind: str = "stale"  # stale | warn | ok


Cell = Union[str, Link, Mark, list]
