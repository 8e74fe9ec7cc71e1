"""Which event loop runs servedeck's async code, the client's and the door's: uvloop when it is
installed (`pip install servedeck[fast]`), else asyncio's own. This is the one place that chooses it;
every run records the loop it ran on (LoadResult.loop, the self-check).

uvloop's callbacks cost about a third less than asyncio's at the same load (docs/loadgen.md, "how much
one client core takes"), which is headroom the client's timestamps need on a busy host.
SERVEDECK_LOOP=asyncio forces asyncio's loop (to compare the two, or when uvloop misbehaves);
SERVEDECK_LOOP=uvloop insists on uvloop.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Coroutine
from typing import Any, Literal, TypeVar

from servedeck.errors import UsageError

T = TypeVar("T")
LoopName = Literal["uvloop", "asyncio"]


def preferred() -> LoopName:
    """The loop `run` would use now."""
    choice = os.environ.get("SERVEDECK_LOOP", "auto")
    if choice not in ("auto", "uvloop", "asyncio"):
        raise UsageError(f"SERVEDECK_LOOP={choice!r}: expected auto, uvloop or asyncio",
                         hint="unset SERVEDECK_LOOP to run on uvloop when it is installed")
    if choice == "asyncio":
        return "asyncio"
    try:
        import uvloop  # noqa: F401
    except ImportError:
        if choice == "uvloop":
            raise UsageError("SERVEDECK_LOOP=uvloop but uvloop is not installed",
                             hint="pip install 'servedeck[fast]', or unset SERVEDECK_LOOP") from None
        return "asyncio"
    return "uvloop"


def run(main: Coroutine[Any, Any, T], loop: LoopName | None = None) -> T:
    """`asyncio.run(main)` on the preferred loop (or the one named)."""
    if (loop or preferred()) == "uvloop":
        import uvloop

        return uvloop.run(main)
    return asyncio.run(main)


def current() -> str:
    """The name of the running loop: "uvloop", "asyncio", or the loop's module for any other."""
    mod = type(asyncio.get_running_loop()).__module__
    if mod.startswith("uvloop"):
        return "uvloop"
    return "asyncio" if mod.startswith("asyncio") else mod
