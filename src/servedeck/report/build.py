"""`servedeck report`: report.md and report.html, rebuilt from run folders alone.

Where the links go. A report written inside the results tree its runs live in (the default: the campaign
folder, or `<results>/reports/<stamp>/`) links to the run folders where they are, relative to the
report's folder: the two travel together with `results/`. A report written anywhere else (`--out
/elsewhere`) is made self-contained: the run folders it links to (and the campaign's files) are copied
into `sources/` beside report.md (plain copies: a hard link would let an edit of the copy change the
run), and every link points there, so the folder can be copied, zipped or served on its own.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Optional

from servedeck.fsio import atomic_write_text
from servedeck.report import html
from servedeck.report.blocks import Moved, markdown
from servedeck.report.collect import Collection
from servedeck.report.sections import build

SOURCES = "sources"


def results_root(coll: Collection) -> Optional[Path]:
    """The results tree the collection's run folders live in (`<results>/runs/<run>` → `<results>`), when
    they all share one."""
    roots = {r.path.resolve().parent.parent for r in coll.runs}
    if coll.folder is not None:
        roots.add(coll.folder.resolve().parent.parent)
    return roots.pop() if len(roots) == 1 else None


def _copy_sources(coll: Collection, out: Path) -> Moved:
    """Copy every run folder (and the campaign folder's files) under out/sources/; what went where."""
    moved: Moved = {}
    for r in coll.runs:
        dst = out / SOURCES / "runs" / r.name
        shutil.copytree(r.path, dst, dirs_exist_ok=True)
        moved[r.path] = dst
    if coll.folder is not None:
        dst = out / SOURCES / "campaign"
        dst.mkdir(parents=True, exist_ok=True)
        for f in coll.folder.iterdir():
            if f.is_file() and f.name not in ("report.md", "report.html") and not (dst / f.name).exists():
                shutil.copy2(f, dst / f.name)
        moved[coll.folder] = dst
    return moved


def self_contained(coll: Collection, out: Path) -> bool:
    """True when the report's folder must carry copies of its sources (it sits outside their results tree)."""
    root = results_root(coll)
    return root is None or not out.resolve().is_relative_to(root)


def write(coll: Collection, out: Path) -> tuple[Path, Path]:
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    moved = _copy_sources(coll, out) if self_contained(coll, out) else None
    sections = build(coll)
    md, page = out / "report.md", out / "report.html"
    atomic_write_text(md, markdown(coll.title, sections, out, moved))
    atomic_write_text(page, html.render(coll.title, sections, out, moved))
    return md, page
