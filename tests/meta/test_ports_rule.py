"""Tests, bench scripts and the demo take the ports their servers will bind from `servedeck.testing.ports`,
never by binding port 0 (that module says why: such a port lies in the ephemeral range and can become an
outgoing connection's source port before the server binds it). Before issue 20 seven test helpers did; until
2026-12-06 six bench scripts and the demo still did, and a routing bench run by a test lost its router."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BIND_PORT_ZERO = re.compile(r"""\.bind\(\(\s*["'][^"']*["']\s*,\s*0\s*\)\)""")
THE_PICKER = REPO / "src" / "servedeck" / "testing" / "ports.py"  # its fallback when nothing is free below the range


def _files():
    for top, pattern in (("tests", "*.py"), ("bench", "*.py"), ("scripts", "*.py"), ("scripts", "*.sh"), ("src", "*.py")):
        yield from (p for p in sorted((REPO / top).rglob(pattern)) if p not in (THE_PICKER, Path(__file__).resolve()))


def test_nothing_reserves_a_port_by_binding_port_zero():
    found = [f"{p.relative_to(REPO)}:{n}" for p in _files()
             for n, line in enumerate(p.read_text().splitlines(), 1) if BIND_PORT_ZERO.search(line)]
    assert found == [], "take the port from servedeck.testing.ports.free_port():\n" + "\n".join(found)


def test_the_rule_sees_what_it_is_for():
    assert BIND_PORT_ZERO.search('        s.bind(("127.0.0.1", 0))')
    assert not BIND_PORT_ZERO.search('        s.bind(("127.0.0.1", port))')
