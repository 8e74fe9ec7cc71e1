"""`servedeck report`: report.md and report.html, rebuilt from run folders alone."""

from __future__ import annotations

from pathlib import Path

from servedeck.fsio import atomic_write_text
from servedeck.report import html
from servedeck.report.blocks import markdown
from servedeck.report.collect import Collection
from servedeck.report.sections import build


def write(coll: Collection, out: Path) -> tuple[Path, Path]:
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    sections = build(coll)
    md, page = out / "report.md", out / "report.html"
    atomic_write_text(md, markdown(coll.title, sections, out))
    atomic_write_text(page, html.render(coll.title, sections, out))
    return md, page
