"""One Markdown-table writer and one escaping rule for every table servedeck writes (issue 50, item 5)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from servedeck.mdtable import cell, table

SRC = Path(__file__).resolve().parents[2] / "src" / "servedeck"


def test_a_pipe_or_a_line_break_in_a_cell_cannot_break_its_row():
    md = table(["name", "a|b"], [["x|y", "one\ntwo\r\nthree"], [None, 3]])
    assert md.splitlines() == ["| name | a\\|b |", "|---|---|", "| x\\|y | one⏎two⏎three |", "|  | 3 |"]


def test_columns_align_by_letter():
    assert table(["a", "b", "c"], [], "lrc").splitlines()[1] == "|---|---:|:---:|"


@pytest.mark.parametrize("align", ["lr", "lrx"])
def test_an_alignment_that_does_not_fit_the_columns_is_refused(align):
    with pytest.raises(ValueError, match="align"):
        table(["a", "b", "c"], [], align)


def test_markdown_cells_are_kept_as_written():
    link = f"[{cell('a|b')}](run/1)"
    assert table(["run"], [[link]], markdown=True).splitlines()[2] == "| [a\\|b](run/1) |"


def test_no_module_writes_a_table_rule_of_its_own():
    # a table's rule line written by hand ("|---|", "---:|") is a second table writer, with its own escaping
    rule = re.compile(r"""["']\|?(:?-{3,}:?\|)+""")
    found = [f"{p.relative_to(SRC)}:{n}" for p in sorted(SRC.rglob("*.py")) if p.name != "mdtable.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if rule.search(line)
             or '"|".join(' in line]
    assert found == []
