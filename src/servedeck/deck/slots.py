"""Pure decisions about slots: who must go for a model to start. No processes are touched here."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Running:
    model: str
    slot: str
    port: int


@dataclass(frozen=True)
class Decision:
    start: bool  # may start now without evicting anyone
    already_running: bool
    holders: tuple[str, ...]  # models holding the target's slot (to evict on switch, refuse on start)


def decide(target: str, slot: str, running: list[Running]) -> Decision:
    if any(r.model == target for r in running):
        return Decision(start=False, already_running=True, holders=())
    holders = tuple(sorted(r.model for r in running if r.slot == slot))
    return Decision(start=not holders, already_running=False, holders=holders)
