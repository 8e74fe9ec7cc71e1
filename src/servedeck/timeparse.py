"""Durations as people type them: 90, 90s, 5m, 1h30m, 8h."""

from __future__ import annotations

import re

from servedeck.errors import UsageError

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)?")
_UNIT = {"ms": 0.001, "s": 1, None: 1, "m": 60, "h": 3600, "d": 86400}


def seconds(text: str, what: str = "duration") -> float:
    s = text.strip().lower().replace(" ", "")
    pos, total = 0, 0.0
    while pos < len(s):
        m = _PART.match(s, pos)
        if not m:
            raise UsageError(f"{what}: {text!r} is not a duration", hint="write it like 90, 90s, 5m, 1h30m or 8h")
        total += float(m.group(1)) * _UNIT[m.group(2)]
        pos = m.end()
    if not s:
        raise UsageError(f"{what}: empty duration", hint="write it like 90s, 5m or 8h")
    return total
