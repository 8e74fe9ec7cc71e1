"""report.html: one self-contained page. Plots are inline SVG, styles inline, no script, no network.
jinja2 renders it because the page nests sections, tables and figures and must escape everything."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

from markupsafe import Markup

from servedeck.report.blocks import Figure, Moved, Para, Pre, Section, Table, html_cell

# the look servedeck's HTML pages share (the report, a model's page: servedeck/page/render.py)
STYLE = """body { font: 14px/1.45 system-ui, sans-serif; max-width: 1100px; margin: 1.5em auto; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; margin-top: 1.8em; }
table { border-collapse: collapse; margin: .6em 0; font-size: 12.5px; display: block; overflow-x: auto; }
th, td { border: 1px solid #ddd; padding: 3px 7px; text-align: left; vertical-align: top; overflow-wrap: break-word; }
th { background: #f4f4f4; } td.num { text-align: right; }
figure { margin: 1em 0; } figure svg { max-width: 100%; height: auto; }
figcaption { font-size: 12px; color: #555; }
pre { background: #f7f7f7; padding: .6em; overflow-x: auto; font-size: 12px; }
nav ul { columns: 2; }"""

# the sections and their blocks, each block a dict with its `kind` (para, table, figure, pre): shared with a
# model's page, which draws its own cells into the same shapes
SECTIONS = """<nav><ul>{% for s in sections %}<li><a href="#{{ s.id }}">{{ s.title }}</a></li>{% endfor %}</ul></nav>
{% for s in sections %}
<section id="{{ s.id }}"><h2>{{ s.title }}</h2>
{% for b in s.blocks %}
{% if b.kind == "para" %}<p>{{ b.html }}</p>
{% elif b.kind == "table" %}<table><thead><tr>{% for h in b.head %}<th>{{ h }}</th>{% endfor %}</tr></thead>
<tbody>{% for row in b.rows %}<tr>{% for c in row %}<td>{{ c }}</td>{% endfor %}</tr>{% endfor %}</tbody></table>
{% elif b.kind == "figure" %}<figure>{{ b.svg }}<figcaption>{{ b.caption }} Sources: {{ b.sources }}</figcaption></figure>
{% elif b.kind == "pre" %}{% if b.source %}<p>from {{ b.source }}:</p>{% endif %}<pre>{{ b.text }}</pre>
{% endif %}
{% endfor %}
</section>
{% endfor %}
"""

TEMPLATE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<title>{{ title }}</title>
<style>
""" + STYLE + """
</style></head>
<body>
<h1>{{ title }}</h1>
""" + SECTIONS + """</body></html>
"""


def render(title: str, sections: list[Section], base: Path, moved: Optional[Moved] = None) -> str:
    from jinja2 import Environment, select_autoescape  # on first use: every servedeck command imports this module

    env = Environment(autoescape=select_autoescape(default=True))
    view = []
    for s in sections:
        blocks = []
        for b in s.blocks:
            if isinstance(b, Para):
                blocks.append({"kind": "para", "html": Markup("").join(html_cell(p, base, moved) for p in b.parts)})
            elif isinstance(b, Table):
                blocks.append({"kind": "table", "head": b.head,
                               "rows": [[html_cell(c, base, moved) for c in row] for row in b.rows]})
            elif isinstance(b, Figure):
                # our own matplotlib output, not user text: safe to place as markup
                blocks.append({"kind": "figure", "svg": Markup(b.svg), "caption": b.caption,
                               "sources": Markup(", ").join(html_cell(x, base, moved) for x in b.sources)})
            elif isinstance(b, Pre):
                blocks.append({"kind": "pre", "text": b.text,
                               "source": html_cell(b.source, base, moved) if b.source else None})
        view.append({"id": s.id, "title": s.title, "blocks": blocks})
    return env.from_string(TEMPLATE).render(title=title, sections=view)
