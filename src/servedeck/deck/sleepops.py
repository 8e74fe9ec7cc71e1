"""The deck's operations that involve sleeping models, run with the deck's lock held (`DeckOps` hands
them out): evicting a slot's holders by sleeping or stopping each, waking a target, making room by
stopping sleepers, a cold restart when a wake goes wrong, and `servedeck sleep`. The decisions are
deck/sleeping.py's; the engine calls and records, deck/sleep.py's; stopping and launching, DeckOps'.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional, Protocol

import psutil

from servedeck.deck import sleep as Z
from servedeck.deck import sleeping as D
from servedeck.deck import state as S
from servedeck.deck.records import LaunchState, LiveRecord, StartResult
from servedeck.errors import RefusedError, UsageError
from servedeck.gpu.nvml import GiB
from servedeck.supervisor import ready as R

if TYPE_CHECKING:
    from servedeck.config import Config


class DeckOps(Protocol):
    """What these operations use of deck.py's DeckOps (which calls them: this module may not import it)."""

    def running(self) -> dict[str, LiveRecord]: ...

    def stop(self, name: str, rec: LiveRecord, *, reason: str, grace_s: float | None = None) -> dict: ...

    def _launch(self, name: str, cfg: "Config", *, reason: str, settings: dict | None = None) -> LiveRecord: ...


def tell(on_step: Optional[Z.Step], word: str) -> None:
    if on_step is not None:
        on_step(word)


def once_each(on_step: Optional[Z.Step]) -> Optional[Z.Step]:
    """`on_step`, told a word only when it differs from the last one it was told."""
    if on_step is None:
        return None
    last: list[str] = []

    def told(word: str) -> None:
        if not last or last[-1] != word:
            last.append(word)
            on_step(word)

    return told


def sleep_key(cfg: "Config", name: str) -> Any:
    m = cfg.models.get(name)
    return m.sleep if m is not None else False


def holder_view(cfg: "Config", name: str, rec: LiveRecord, held: Optional[dict[int, int]] = None) -> D.Holder:
    """A slot holder as plan_switch sees it: its state (a ready one whose health check fails is
    "unhealthy"), its `sleep` key, what its launch can do and, when level 1 is possible, its weights."""
    key = sleep_key(cfg, name)
    can = tuple(rec.spec.get("sleep_levels") or ())
    state = rec.state.value
    if rec.state == LaunchState.READY and can and key is not False:
        ok, _ = R.health_ok(rec.probe_spec(), timeout_s=2.0)
        state = "ready" if ok else "unhealthy"
    weights = Z.weights_bytes(cfg, name) if (1 in can and key in ("auto", 1)) else None
    cannot = rec.spec.get("sleep_note") or ("its launch has no sleep mode" if key is not False else "")
    sleeper = D.Sleeper(name, rec.sleep_level or 1, rec.asleep_host_bytes or 0) if rec.state == LaunchState.ASLEEP else None
    residual = {int(g): int(b) for g, b in rec.asleep_gpu_bytes.items()} if rec.asleep_gpu_bytes else \
        {int(g): D.RESIDUAL_GUESS for g in (held or {})}
    return D.Holder(name, state, key, can, cannot, weights, sleeper, residual)


def gpu_room(cfg: "Config", target: str, target_rec: Optional[LiveRecord], holders: list[str]) -> Optional[D.GpuRoom]:
    """The target's need per GPU and what would be free were the holders stopped (NVML now); None on a
    host without GPUs, or when the need cannot be told."""
    from servedeck.gpu.fit import UNKNOWN, fit_now
    from servedeck.gpu.nvml import inventory

    inv = inventory()
    if not inv.available:
        return None
    if target_rec is not None and target_rec.state == LaunchState.ASLEEP:  # a wake needs back what it gave up
        held = Z.gpu_held_by(inv, holders)
        need = {int(g): b - target_rec.asleep_gpu_bytes.get(g, 0) for g, b in target_rec.awake_gpu_bytes.items()}
        free = {int(g): (inv.gpu(int(g)).memory_free if inv.gpu(int(g)) else 0) + held.get(int(g), 0) for g in need}
        return D.GpuRoom(need, free) if need else None
    rep = fit_now(cfg, target, releasing=holders, inv=inv)
    if rep.status == UNKNOWN or not rep.gpus:
        return None
    return D.GpuRoom({r.gpu: r.need for r in rep.gpus}, {r.gpu: r.free for r in rep.gpus})


def cold_word(cfg: "Config", step: D.Step) -> str:
    """What a waiting request is told while a holder is stopped: `switch`, and why not asleep when its
    entry asked to sleep."""
    return "switch" if sleep_key(cfg, step.model) is False else f"switch (cold: {step.why})"


def sleep_one(ops: DeckOps, name: str, rec: LiveRecord, cfg: "Config", level: int, why: str,
              reason: str) -> dict[str, Any]:
    """Put a ready launch to sleep; a sleep that fails stops it cold, and says so."""
    weights = Z.weights_bytes(cfg, name) if level == 1 else None
    try:
        return {"model": name, "outcome": "asleep", **Z.put_to_sleep(rec, level, why, weights)}
    except Z.SleepFailed as e:
        S.journal("sleep", name, "failed", detail=f"{e}; stopping it cold", launch_dir=rec.launch_dir, reason=reason)
        out = ops.stop(name, rec, reason=f"its sleep failed ({e}); stopped cold")
        return {**out, "sleep_failed": str(e)}


def evict(ops: DeckOps, target: str, holders: list[str], running: dict[str, LiveRecord], cfg: "Config",
          on_step: Optional[Z.Step]) -> tuple[list[str], dict[str, dict], dict[str, str]]:
    """Move a switch's slot holders out of the way: asleep where their entry and the host allow, else
    stopped (deck/sleeping.py plan_switch). Returns (evicted, slept {model: what}, stopped cold {model: why})."""
    target_rec = running.get(target)
    room = gpu_room(cfg, target, target_rec, holders)
    views = [holder_view(cfg, h, running[h], {int(g): b for g, b in Z.gpu_held(running[h]).items()} if room else None)
             for h in holders]
    steps = D.plan_switch(target, target_rec.state.value if target_rec else None, views, Z.host_memory(cfg),
                          Z.sleepers(running), room)
    evicted: list[str] = []
    slept: dict[str, dict] = {}
    cold: dict[str, str] = {}
    for st in steps[:-1]:
        rec = running[st.model]
        if st.act == D.SLEEP:
            tell(on_step, "sleep" if st.level == 1 else "sleep (level 2)")
            out = sleep_one(ops, st.model, rec, cfg, st.level or 1, st.why, reason=f"switch to {target}")
            if out["outcome"] == "asleep":
                slept[st.model] = {"level": st.level, "why": st.why, "took_s": out["took_s"],
                                   "gpu_asleep": out["gpu_asleep"], "host_bytes": out["host_bytes"]}
            else:
                cold[st.model] = f"its sleep failed: {out['sleep_failed']}"
            evicted.append(st.model)
        elif st.act == D.STOP:
            tell(on_step, cold_word(cfg, st))
            ops.stop(st.model, rec, reason=f"evicted by switch to {target} ({st.why})")
            if sleep_key(cfg, st.model) is not False:  # its entry asked to sleep: say why it did not
                cold[st.model] = st.why
            evicted.append(st.model)
    return evicted, slept, cold


def make_room(ops: DeckOps, name: str, cfg: "Config", waking: Optional[LiveRecord] = None) -> list[str]:
    """Stop sleeping models, longest asleep first, when `name` would not fit in what is free: GPU memory
    by NVML (a start's fit check; a wake needs back what it gave up), host memory when its entry sets
    host_ram_gib. Nothing on a host without GPUs unless host memory is short."""
    from servedeck.gpu.fit import NO_ROOM, fit_now
    from servedeck.gpu.nvml import inventory

    asleep = {m: r for m, r in ops.running().items() if r.state == LaunchState.ASLEEP and m != name}
    if not asleep:
        return []
    inv = inventory()
    short_gpu: dict[int, int] = {}
    if inv.available and waking is not None:
        for g, awake in waking.awake_gpu_bytes.items():
            gpu = inv.gpu(int(g))
            short_gpu[int(g)] = awake - waking.asleep_gpu_bytes.get(g, 0) - (gpu.memory_free if gpu else 0)
    elif inv.available:
        rep = fit_now(cfg, name, inv=inv)
        if rep.status == NO_ROOM:
            short_gpu = {r.gpu: r.need - r.free for r in rep.gpus if not r.fits}
    model = cfg.models.get(name)
    short_host = 0
    if model is not None and model.host_ram_gib:
        short_host = int(model.host_ram_gib * GiB) - int(psutil.virtual_memory().available)
    chosen = D.to_stop(short_gpu, short_host, Z.sleepers(asleep, measured=inv.available), keep=[name])
    for m in chosen:
        ops.stop(m, asleep[m], reason=f"asleep; stopped to make room for {name}")
    if chosen:
        S.journal("make-room", name, "stopped-sleepers", stopped=chosen,
                  short_gpu={str(g): b for g, b in short_gpu.items() if b > 0}, short_host=max(0, short_host))
    return chosen


def wake(ops: DeckOps, name: str, rec: LiveRecord, cfg: "Config", reason: str,
         on_step: Optional[Z.Step]) -> StartResult:
    """Wake an asleep launch whose slot no awake model holds (the caller saw to it). A wake that fails
    or times out, or a first wake whose answers differ from before the launch first slept, ends in a
    cold restart, recorded as such."""
    make_room(ops, name, cfg, waking=rec)
    level = rec.sleep_level or 1
    tell(on_step, "wake" if level == 1 else "wake (level 2)")
    try:
        out = Z.wake_up(rec)
    except Z.SleepFailed as e:
        S.journal("wake", name, "failed", detail=f"{e}; restarting it cold", launch_dir=rec.launch_dir, level=level)
        return cold_restart(ops, name, rec, cfg, f"its wake failed: {e}", on_step, {"level": level, "failed": str(e)})
    check = out.get("check") or {}
    if check.get("verdict") == "differs":
        rows = check.get("differing") or []
        S.journal("wake", name, "outputs-differ", launch_dir=rec.launch_dir, level=level, differing=rows,
                  detail=f"after its first wake, {len(rows)} of {check.get('prompts')} greedy answers differ from "
                         "the ones it gave before it first slept; restarting it cold")
        return cold_restart(ops, name, rec, cfg, "its answers after waking differ from before it slept", on_step,
                            {**out, "differing": rows})
    Z.woke_recorded(rec, out)
    return StartResult(rec, woke=out)


def cold_restart(ops: DeckOps, name: str, rec: LiveRecord, cfg: "Config", why: str, on_step: Optional[Z.Step],
                 woke: dict) -> StartResult:
    tell(on_step, f"cold restart ({why})")
    ops.stop(name, rec, reason=f"cold restart: {why}")
    make_room(ops, name, cfg)
    new = ops._launch(name, cfg, reason="cold restart")
    S.journal("wake", name, "cold-restarted", launch_dir=new.launch_dir, detail=why)
    return StartResult(new, woke={**woke, "cold_restart": why})


def sleep_named(ops: DeckOps, name: str, cfg: "Config", level: Optional[int], reason: str) -> dict[str, Any]:
    """`servedeck sleep NAME [--level N]`: a ready model to sleep, at the level asked or the one the host
    allows. Refused, never stopped, when it cannot sleep."""
    running = ops.running()
    rec = running.get(name)
    if rec is None:
        raise RefusedError(f"cannot put {name} to sleep: it is not running", hint=f"`servedeck start {name}` starts it")
    if rec.state == LaunchState.ASLEEP:
        return {"model": name, "outcome": "already-asleep", "level": rec.sleep_level}
    if rec.state != LaunchState.READY:
        raise RefusedError(f"cannot put {name} to sleep: it is {rec.state}", hint="wait until it is ready")
    can = tuple(rec.spec.get("sleep_levels") or ())
    if not can:
        why = rec.spec.get("sleep_note") or "its launch has no sleep mode (its entry had sleep = false when it started)"
        raise RefusedError(f"cannot put {name} to sleep: {why}",
                           hint=f"`servedeck stop {name}` frees its memory; to sleep it, set sleep = \"auto\" on an engine "
                                "and build that can, then start it again")
    key = sleep_key(cfg, name)
    ask = key if key is not False else "auto"  # launched able to sleep: an explicit request uses what it can
    if level is not None:
        if level not in can:
            raise UsageError(f"--level {level}: {name}'s launch sleeps at level {', '.join(map(str, can))} only")
        ask = level
    weights = Z.weights_bytes(cfg, name) if 1 in can else None
    choice = D.sleep_level(name, ask, can, "", weights, Z.host_memory(cfg), Z.sleepers(running))
    if choice.level is None:
        raise RefusedError(f"cannot put {name} to sleep: {choice.why}",
                           hint=(f"`servedeck sleep {name} --level 2` keeps nothing on the host; " if 2 in can else "")
                                + f"`servedeck stop {name}` frees its memory")
    return sleep_one(ops, name, rec, cfg, choice.level, choice.why, reason=reason)


def describe_asleep(rec: LiveRecord, gpu: dict[str, int] | None = None) -> str:
    """The status row's words for a sleeping model: level, since when, what it holds, what frees it."""
    return (f"asleep at level {rec.sleep_level}; {Z.holds_words(rec, gpu)}: `servedeck wake {rec.model}` "
            f"(or a request at the door) wakes it, `servedeck stop {rec.model}` frees it")


__all__ = ["cold_restart", "describe_asleep", "evict", "make_room", "sleep_named", "wake"]
