"""The instrument in a subprocess of its own process group, killed by group when the tests end."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from servedeck.testing.instrument_process import InstrumentProcess


InstrumentProc = InstrumentProcess  # the tests' name for it


@pytest.fixture(scope="module")
def instrument_factory() -> Iterator[Callable[..., InstrumentProc]]:
    """instrument_factory("--ttft-ms", "50", ...) -> a running instrument, shared per argument list."""
    started: dict[tuple[str, ...], InstrumentProc] = {}

    def get(*args: str) -> InstrumentProc:
        if args not in started:
            started[args] = InstrumentProc(*args)
        inst = started[args]
        inst.clear()
        return inst

    yield get
    for inst in started.values():
        inst.stop()


@pytest.fixture
def instrument(instrument_factory: Callable[..., InstrumentProc]) -> InstrumentProc:
    return instrument_factory("--ttft-ms", "50", "--itl-ms", "20", "--tokens", "100")
