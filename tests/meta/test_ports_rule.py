"""Tests take the ports their servers will bind from tests/ports.py, never by binding port 0 (that
module says why: such a port lies in the ephemeral range and can become an outgoing connection's source
port before the engine binds it). Before issue 20 seven test helpers did; this keeps it from coming back."""

from __future__ import annotations

import re
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
BIND_PORT_ZERO = re.compile(r"""\.bind\(\(\s*["'][^"']*["']\s*,\s*0\s*\)\)""")


def test_no_test_helper_reserves_a_port_by_binding_port_zero():
    found = [f"{p.relative_to(TESTS)}:{n}" for p in sorted(TESTS.rglob("*.py")) if p.name != "ports.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if BIND_PORT_ZERO.search(line)]
    assert found == []
