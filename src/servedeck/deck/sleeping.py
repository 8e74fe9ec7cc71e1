"""Pure decisions about sleeping models: no processes, no files, no clocks read here. The deck
(deck/sleep.py, deck/deck.py) reads memory and records, asks these, and carries the answers out.

    sleep_level  at what level a model goes to sleep: 1 only while the host's memory holds its weights
                 with a margin (every model asleep at level 1 counted), else 2, else none (a cold stop)
    plan_switch  what a switch does with each model holding the target's slot, by the holder's state,
                 and how the target comes up (woken, or started)
    to_stop      which sleeping models to stop when a start or a wake finds memory short

A model asleep still holds GPU memory (its CUDA context, allocator pools) and, at level 1, its
weights' worth of pinned host memory; `Sleeper` carries both.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Mapping, Optional, Sequence

from servedeck.engines.sleepmode import sleep_key_text as sleep_text
from servedeck.gpu.nvml import gib

# What a switch does with one model (Step.act).
SLEEP = "sleep"  # put it to sleep at `level`
STOP = "stop"  # stop it cold
KEEP = "keep"  # leave it as it is (already asleep: it holds no slot)
WAKE = "wake"  # the target is asleep: wake it
START = "start"  # the target is not running: start it
NOTHING = "nothing"  # the target is already up


@dataclass(frozen=True)
class HostMemory:
    """What level 1 may pin on the host. `available`: bytes the host has available now (already net of
    what sleeping models pin); `cap`: [host] sleep_ram_gib, the most that models asleep at level 1 may
    hold together; `margin`: [host] sleep_ram_margin_gib, left free whatever sleeps."""

    available: Optional[int]
    cap: Optional[int] = None
    margin: int = 4 * 2**30

    def pinned(self, nbytes: int) -> "HostMemory":
        """The same host after something pinned `nbytes` more."""
        return replace(self, available=None if self.available is None else self.available - nbytes)


@dataclass(frozen=True)
class Sleeper:
    """A model asleep now: its level, the pinned host memory it holds, what it still holds per GPU,
    and since when it sleeps (seconds, any one clock)."""

    model: str
    level: int
    host_bytes: int = 0
    gpu_bytes: Mapping[int, int] = field(default_factory=dict)
    since: float = 0.0


@dataclass(frozen=True)
class Level:
    level: Optional[int]  # 1, 2, or None: stop it cold
    why: str


def host_room(host: HostMemory, sleepers: Sequence[Sleeper]) -> tuple[Optional[int], str]:
    """(bytes level 1 may still pin, the sums behind it in words)."""
    if host.available is None:
        return None, "how much host memory is available is not known"
    held = sum(s.host_bytes for s in sleepers if s.level == 1)
    room = host.available - host.margin
    words = f"{gib(host.available)} available, {gib(host.margin)} kept free"
    if held:
        names = ", ".join(f"{s.model} {gib(s.host_bytes)}" for s in sleepers if s.level == 1 and s.host_bytes)
        words += f"; asleep at level 1: {names}"
    if host.cap is not None:
        room = min(room, host.cap - held)
        words += f"; sleep_ram_gib {gib(host.cap)} for every level-1 sleeper together"
    return room, words


def sleep_level(model: str, key: Any, can: Sequence[int], cannot: str, weights_bytes: Optional[int],
                host: HostMemory, sleepers: Sequence[Sleeper] = ()) -> Level:
    """At what level `model` goes to sleep rather than being stopped. `key`: its models.toml `sleep`;
    `can`: the levels its launch can sleep at (empty: `cannot` says why); `weights_bytes`: what level 1
    pins on the host (the planner's weights size; None when unknown)."""
    if key is False:
        return Level(None, f"{model} has sleep = false")
    if not can:
        return Level(None, f"{model} cannot sleep: {cannot or 'its launch has no sleep mode'}")
    why1 = ""
    if key in ("auto", 1) and 1 in can:
        room, words = host_room(host, sleepers)
        if weights_bytes is None:
            why1 = "the size of its weights is not known (the planner cannot read them)"
        elif room is None:
            why1 = words
        elif weights_bytes <= room:
            return Level(1, f"its weights ({gib(weights_bytes)}) fit in host memory ({words})")
        else:
            why1 = f"its weights ({gib(weights_bytes)}) do not fit in host memory ({words})"
    if key in ("auto", 2) and 2 in can:
        return Level(2, f"{why1}: level 2, its weights reloaded from disk when it wakes" if why1 else "sleep = 2")
    if not why1:  # sleep = 2 on a launch that sleeps at level 1 only (refused at render; kept safe here)
        return Level(None, f"{model} has {sleep_text(key)}, and its launch sleeps at level "
                           f"{', '.join(str(lv) for lv in can)} only")
    return Level(None, f"{model} cannot sleep at level 1: {why1}; {sleep_text(key)} allows no level 2")


# What a model asleep is taken to keep on each GPU it uses before it has slept once (its CUDA context and
# allocator pools): issue 33's bound. After its first sleep, what NVML measured then is used instead.
RESIDUAL_GUESS = 3 * 2**30


@dataclass(frozen=True)
class Holder:
    """One model in the target's slot, as a switch finds it. `state`: its live record's state
    (ready, asleep, starting), or "unhealthy" (ready, its health check failing). `residual`: what it
    would keep per GPU asleep (measured at its last sleep; else RESIDUAL_GUESS on each GPU it holds)."""

    model: str
    state: str
    key: Any = False  # models.toml `sleep`
    can: tuple[int, ...] = ()  # the levels its launch can sleep at
    cannot: str = ""  # why it cannot, when its entry asked
    weights_bytes: Optional[int] = None
    sleeper: Optional[Sleeper] = None  # when asleep: what it holds
    residual: Mapping[int, int] = field(default_factory=dict)


@dataclass(frozen=True)
class GpuRoom:
    """The target's need per GPU, and what would be free on each were every holder of the slot stopped
    (free now plus what the holders hold). None in plan_switch: no GPU to count (a CPU host)."""

    need: Mapping[int, int]
    free_if_stopped: Mapping[int, int]


@dataclass(frozen=True)
class Step:
    act: str  # SLEEP, STOP, KEEP for a holder; WAKE, START, NOTHING for the target
    model: str
    level: Optional[int] = None
    why: str = ""


def plan_switch(target: str, target_state: Optional[str], holders: Sequence[Holder], host: HostMemory,
                sleepers: Sequence[Sleeper] = (), gpu: Optional[GpuRoom] = None) -> list[Step]:
    """What a switch to `target` does: one step per holder, in order, then one for the target
    (`target_state`: its live record's state, None when it is not running). A holder put to sleep at
    level 1 counts, for the holders after it, as pinning its weights (a replicated entry's replicas
    are decided one by one, each seeing the others). With `gpu`, a holder whose residual would leave
    the target short of its need on a GPU is stopped instead: its sleep would not make room."""
    steps: list[Step] = []
    asleep = list(sleepers)
    room = dict(gpu.free_if_stopped) if gpu else {}
    for h in holders:
        if h.state == "asleep":
            steps.append(Step(KEEP, h.model, h.sleeper.level if h.sleeper else None, "already asleep"))
            continue
        if h.state == "starting":
            steps.append(Step(STOP, h.model, why=f"{h.model} was still starting: only a ready model is put to sleep"))
            continue
        if h.state == "unhealthy":
            steps.append(Step(STOP, h.model, why=f"{h.model} fails its health check: a sick engine is stopped, "
                                                 "not put to sleep"))
            continue
        choice = sleep_level(h.model, h.key, h.can, h.cannot, h.weights_bytes, host, asleep)
        if choice.level is None:
            steps.append(Step(STOP, h.model, why=choice.why))
            continue
        short = [g for g, need in (gpu.need.items() if gpu else ()) if room.get(g, 0) - h.residual.get(g, 0) < need]
        if short:
            g = short[0]
            steps.append(Step(STOP, h.model, why=f"asleep, {h.model} would keep {gib(h.residual.get(g, 0))} of GPU {g}, "
                                                 f"and {target} needs {gib(gpu.need[g])} of the {gib(room.get(g, 0))} "
                                                 "that would be free"))
            continue
        for g, b in h.residual.items():
            room[g] = room.get(g, 0) - b
        steps.append(Step(SLEEP, h.model, choice.level, choice.why))
        if choice.level == 1 and h.weights_bytes:
            asleep.append(Sleeper(h.model, 1, h.weights_bytes))
            host = host.pinned(h.weights_bytes)
    if target_state == "asleep":
        steps.append(Step(WAKE, target, why=f"{target} is asleep"))
    elif target_state in ("ready",):
        steps.append(Step(NOTHING, target, why=f"{target} is already up"))
    else:
        steps.append(Step(START, target, why=f"{target} is not running"))
    return steps


def to_stop(short_gpu: Mapping[int, int], short_host: int, sleepers: Sequence[Sleeper],
            keep: Sequence[str] = ()) -> list[str]:
    """The sleeping models to stop so that `short_gpu` (bytes missing per GPU) and `short_host` (bytes
    of host memory missing) are covered: the longest asleep first, skipping any that holds none of what
    is still missing, never one in `keep`. [] when stopping all of them would not cover it: they would
    lose their fast wake for nothing (the start is then refused, naming them)."""
    gpu = {g: b for g, b in short_gpu.items() if b > 0}
    host = max(0, short_host)
    if not gpu and not host:
        return []
    chosen: list[str] = []
    for s in sorted((s for s in sleepers if s.model not in keep), key=lambda s: (s.since, s.model)):
        helps = any(s.gpu_bytes.get(g, 0) > 0 for g in gpu) or (host > 0 and s.host_bytes > 0)
        if not helps:
            continue
        chosen.append(s.model)
        for g in list(gpu):
            gpu[g] -= s.gpu_bytes.get(g, 0)
            if gpu[g] <= 0:
                del gpu[g]
        host = max(0, host - s.host_bytes)
        if not gpu and not host:
            return chosen
    return []
