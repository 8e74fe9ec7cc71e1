"""The page document (page/doc.py) for people: Markdown for a terminal or a file, and one self-contained
HTML page (inline styles, no script, no network). Both are drawn from the document alone, so they can
never say more than `--json` does. A stale figure carries a mark ("STALE: engine version a → b") in
both; in HTML it is a `<span class="stale">`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Optional

from jinja2 import Environment, select_autoescape
from markupsafe import Markup, escape

from servedeck.mdtable import cell, table
from servedeck.page.blocks import Cell, Link, Mark, Para, Pre, Section, Table
from servedeck.page.sections import section_blocks
from servedeck.report.html import SECTIONS, STYLE


# --- Markdown -------------------------------------------------------------------------------------------

def _md(c: Cell, in_table: bool) -> str:
    if isinstance(c, Link):
        return f"[{c.text}]({Path(c.target).as_uri() if c.target.startswith('/') else c.target})"
    if isinstance(c, Mark):
        return f"**{c.text}**"
    if isinstance(c, list):
        return " ".join(_md(x, in_table) for x in c if x not in ("", None))
    text = "" if c is None else str(c)
    return cell(text) if in_table else text


def markdown(title: str, sections: list[Section]) -> str:
    out = [f"# {title}", ""]
    for s in sections:
        out += [f"## {s.title}", ""]
        for b in s.blocks:
            if isinstance(b, Para):
                out += ["".join(_md(p, False) for p in b.parts), ""]
            elif isinstance(b, Table):
                out += [table(b.head, [[_md(c, True) for c in row] for row in b.rows], markdown=True), ""]
            elif isinstance(b, Pre):
                out += ["```", b.text, "```", ""]
    return "\n".join(out).rstrip() + "\n"


# --- HTML -------------------------------------------------------------------------------------------------

def _html(c: Cell) -> Markup:
    if isinstance(c, Link):
        href = Path(c.target).as_uri() if c.target.startswith("/") else c.target
        return Markup('<a href="{}">{}</a>').format(href, c.text)
    if isinstance(c, Mark):
        return Markup('<span class="{}">{}</span>').format(c.kind, c.text)
    if isinstance(c, list):
        return Markup(" ").join(_html(x) for x in c if x not in ("", None))
    return escape("" if c is None else str(c))


TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>{{ title }}</title><link rel="icon" href="data:,">
<style>
""" + STYLE + """
pre { white-space: pre-wrap; } td { overflow-wrap: anywhere; }
.stale { background: #fde2e2; color: #8a1111; font-weight: 600; padding: 0 .3em; border-radius: 3px; }
.warn { background: #fff3cd; color: #6b4e00; font-weight: 600; padding: 0 .3em; border-radius: 3px; }
.ok { color: #0a6b20; font-weight: 600; } .meta { color: #555; font-size: 12px; }
</style></head>
<body>
<h1>{{ title }}</h1>
<p class="meta">{{ meta }}</p>
""" + SECTIONS + """</body></html>
"""


def html(title: str, meta: str, sections: list[Section]) -> str:
    view = []
    for s in sections:
        blocks: list[dict[str, Any]] = []
        for b in s.blocks:
            if isinstance(b, Para):
                blocks.append({"kind": "para", "html": Markup("").join(_html(p) for p in b.parts)})
            elif isinstance(b, Table):
                blocks.append({"kind": "table", "head": b.head, "rows": [[_html(c) for c in row] for row in b.rows]})
            elif isinstance(b, Pre):
                blocks.append({"kind": "pre", "text": b.text})
        view.append({"id": s.id, "title": s.title, "blocks": blocks})
    env = Environment(autoescape=select_autoescape(default=True))
    return env.from_string(TEMPLATE).render(title=title, meta=meta, sections=view)


# --- the page ---------------------------------------------------------------------------------------------

def title_of(doc: dict[str, Any]) -> str:
    w = doc["sections"]["what"]
    return f"{doc['model']} ({w['build']['engine']}, build {w['build']['name']})"


def meta_of(doc: dict[str, Any]) -> str:
    return (f"Rebuilt {doc['generated_at']} by servedeck {doc['servedeck']} from the records in {doc['home']} and "
            f"{doc['results']}, with {doc['config_path']}; page schema {doc['schema']}. Nothing was written.")


def sections_of(doc: dict[str, Any], link: Optional[Callable[[str, str], Cell]] = None) -> list[Section]:
    """The document's sections as blocks. `link(text, path)` makes a link (default: to the file itself;
    the door's copy links nothing it cannot serve)."""
    return section_blocks(doc, link or (lambda text, path: Link(text, str(path))))


def to_markdown(doc: dict[str, Any]) -> str:
    text = markdown(title_of(doc), sections_of(doc))
    head, _, rest = text.partition("\n\n")
    return f"{head}\n\n*{meta_of(doc)}*\n\n{rest}"


def to_html(doc: dict[str, Any], link: Optional[Callable[[str, str], Cell]] = None) -> str:
    return html(title_of(doc), meta_of(doc), sections_of(doc, link))
