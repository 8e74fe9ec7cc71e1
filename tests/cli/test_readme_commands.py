"""The README's command list is the help's (issue 49, item 5): under each of `servedeck --help`'s headings,
in its order, every command it lists, and none it does not. One source: cli/panels.py's PANELS, which
orders the help (tests/cli/test_help_panels.py holds the help to it)."""

from __future__ import annotations

import re
from pathlib import Path

from servedeck.cli.panels import PANELS

README = Path(__file__).parents[2] / "README.md"


def readme_blocks() -> list[tuple[str, list[str]]]:
    """(heading, commands in order of first mention) for each bold heading of "A day's work"."""
    text = README.read_text()
    day = text[text.index("## A day's work"):]
    day = day[:day.index("\n## ", 1)]
    out: list[tuple[str, list[str]]] = []
    for m in re.finditer(r"^\*\*(.+?)\*\*.*?\n```\n(.*?)```", day, re.S | re.M):
        names: list[str] = []
        for line in m.group(2).splitlines():
            word = re.match(r"servedeck ([a-z][a-z-]*)", line)
            if word and word.group(1) not in names:
                names.append(word.group(1))
        out.append((m.group(1), names))
    return out


def test_the_readme_lists_every_command_under_the_helps_headings_in_its_order():
    assert readme_blocks() == [(title, list(names)) for title, names in PANELS]


def test_the_readme_says_where_the_list_comes_from():
    assert "in the order and under the headings of `servedeck --help`" in README.read_text()
