"""A page per model (`servedeck page MODEL`): what the deck knows about it, every figure with where it came
from and whether it still holds. Built from servedeck's records alone (page/doc.py), drawn as Markdown or
HTML (page/render.py); docs/page.md has the document's shape."""

from servedeck.page.doc import SCHEMA, SECTIONS, build_page
from servedeck.page.render import to_html, to_markdown

__all__ = ["SCHEMA", "SECTIONS", "build_page", "to_html", "to_markdown"]
