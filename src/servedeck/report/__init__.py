"""Rendering runs for people: summary.md, `show`, the `runs` list."""

from servedeck.report.render import banner, gate_cell, headline_cell, list_row, markdown

__all__ = ["banner", "gate_cell", "headline_cell", "list_row", "markdown"]
