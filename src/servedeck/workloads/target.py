"""The server a gate or benchmark measures: one the deck runs already, or one started for the run.

States: open (the engine answers; `launched` says whether this run started it) → closed (a
launched engine stopped through the deck; an adopted one left running). `death()` tells whether
the engine has gone, and what the shim recorded about how.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Optional

from servedeck.config import Config, Model
from servedeck.deck import Deck
from servedeck.deck.deck import describe_exit
from servedeck.engines import get_engine
from servedeck.deck.records import LaunchState, LiveRecord
from servedeck.engines.base import Endpoint
from servedeck.errors import RunError, UsageError
from servedeck.gates.server import server_context
from servedeck.loadgen.api import ApiClient
from servedeck.runs import inventory
from servedeck.supervisor import process as P
from servedeck.supervisor import ready as R


@dataclass
class Target:
    name: str
    cfg: Config
    record: LiveRecord  # the deck's live record
    launched: bool  # this run started it, so this run stops it
    # A campaign's launch: run folders are named after the base model with the variant as layout
    # label, the summary carries `extra` (campaign, replicas, gpus_used), and `peers` are the other
    # replicas of the same launch, which the load generator spreads requests across.
    run_model: Optional[str] = None
    run_layout: Optional[str] = None
    extra: dict[str, Any] = field(default_factory=dict)
    peers: list["Target"] = field(default_factory=list)

    @property
    def replicas(self) -> list["Target"]:
        return [self, *self.peers]

    @property
    def model_label(self) -> str:
        return self.run_model or self.name

    @property
    def layout_label(self) -> str:
        return self.run_layout or self.cfg.models[self.name].layout

    @property
    def engine(self) -> str:
        return self.record.engine

    @property
    def base_url(self) -> str:
        return self.record.base_url

    @property
    def served_name(self) -> str:
        return self.record.served_name or self.name

    @property
    def launch_dir(self) -> Optional[str]:
        return self.record.launch_dir

    @property
    def speculation(self) -> Optional[dict[str, Any]]:
        """How this launch speculates (from its argv, read by the engine's adapter); None if it does not."""
        argv = self.record.spec.get("argv") or []
        return get_engine(self.engine).speculation(list(argv))

    @property
    def cache_block(self) -> int:
        """The engine's prefix-cache unit in tokens: its KV block (the CPU backend's where the launch's
        KV cache lives on the CPU, as its boot log said), 1 for token-granular caches."""
        mem = get_engine(self.engine).memory
        on_cpu = str((self.record.boot or {}).get("kv_device", "")).upper() == "CPU"
        return max(1, (mem.cpu_block_size or mem.block_size) if on_cpu else mem.block_size)

    @property
    def request(self) -> dict[str, Any]:
        """models.toml `request`: merged into the body of every request servedeck sends."""
        return dict(self.cfg.models[self.name].request)

    @property
    def server(self) -> Endpoint:
        return replace(self.record.endpoint, request=self.request)

    async def served_context(self) -> int:
        """The context one request may fill: what the server reports, else models.toml."""
        async with ApiClient(self.base_url) as api:
            served = await server_context(api)
        ctx = served or self.cfg.models[self.name].context
        if ctx is None:
            raise RunError(f"the server does not report its context and models.{self.name}.context is unset",
                           hint=f"set models.{self.name}.context in models.toml")
        return ctx

    def check_output_cap(self, asked: int, flag: str) -> None:
        """A run that asks for more output than the model's max_output_tokens is refused, not cut short:
        its figures would describe requests it did not make."""
        cap = self.cfg.models[self.name].max_output_tokens
        if cap and asked > cap:
            raise UsageError(f"{flag} {asked} is above models.{self.name}.max_output_tokens ({cap})",
                             hint=f"ask for {cap} or fewer ({flag} {cap}), or raise max_output_tokens in models.toml")

    def death(self) -> Optional[str]:
        """None while the engine (every replica) lives; otherwise how one ended, as its launch folder records it."""
        for peer in self.peers:
            why = peer.death()
            if why is not None:
                return why
        if P.alive(self.record.pid, self.record.create_time):
            eng = self.record.engine_pid
            if not eng or eng == self.record.pid or P.alive(eng):
                return None
            # The engine is gone while its shim still lives: the shim writes exit.json, then ends. A request
            # that failed in between (a busy box: CI saw a SIGKILLed engine's point end as "requests failed",
            # exit 0) must still be told a death, so give the shim a moment to say how it ended.
            exit_info = R.wait_exit(Path(self.launch_dir), 5.0) if self.launch_dir else None
            how = describe_exit(exit_info) if exit_info else f"its process (pid {eng}) is gone"
            return f"the {self.engine} server died: {how}"
        exit_info = R.read_exit(Path(self.launch_dir)) if self.launch_dir else None
        return f"the {self.engine} server died: {describe_exit(exit_info)}"


def layout_facts(ms: list[Model]) -> dict[str, Any]:
    """What a launch of these servers (one per replica) holds, as run summaries record it: GPUs are
    tp × pp × dp per replica, or the GPUs each is given when more (llama.cpp splits by layer or tensor
    over every GPU it sees, with tp = 1); 0 on a host without GPUs."""
    m = ms[0]
    on_gpu = bool(m.gpus) or inventory.gpus().get("available", False) is True
    return {"replicas": len(ms), "gpus_used": max(m.tp * m.pp * m.dp, len(m.gpus)) * len(ms) if on_gpu else 0,
            "cpus": [list(x.cpus) for x in ms]}


def open_target(cfg: Config, model: str, launch: bool) -> Target:
    """The running model named `model`; with `launch`, start it first (through the deck) if it is not up.
    A replicated entry (models.toml `replicas`) opens as one target whose peers are its other replicas:
    the load generator spreads requests over all of them."""
    group = cfg.group_named(model)
    if group is None:
        return _open_one(cfg, cfg.resolve(model), launch)
    deck = Deck(cfg)
    running = deck.running()
    missing = [m for m in group.members if m not in running]
    not_ready = [m for m in group.members if m in running and running[m].state != LaunchState.READY]
    if not_ready:
        raise RunError(f"{group.name}: replica {not_ready[0]} is {running[not_ready[0]].state}, not ready",
                       hint=f"wait for it (`servedeck status`), or `servedeck stop {group.name}` and try again")
    if missing and not launch:
        raise RunError(f"{group.name}: {', '.join(missing)} not running",
                       hint=f"start it with `servedeck start {group.name}`, or pass --launch to start it for "
                            "this run and stop it afterwards")
    if missing:
        res = deck.start(group.name, reason="campaign")
        recs = {r.model: r for r in res.records}
        launched = set(missing)
    else:
        recs, launched = {m: running[m] for m in group.members}, set()
    layout = f"{len(group.members)}x{cfg.models[group.members[0]].layout}"
    facts = layout_facts([cfg.models[m] for m in group.members])  # one NVML read, not one per replica
    targets = [Target(m, cfg, recs[m], launched=m in launched, run_model=group.name, run_layout=layout,
                      extra=dict(facts)) for m in group.members]
    targets[0].peers = targets[1:]
    return targets[0]


def _open_one(cfg: Config, name: str, launch: bool) -> Target:
    deck = Deck(cfg)
    running = deck.running()
    if name in running and running[name].state == LaunchState.READY:
        return Target(name, cfg, running[name], launched=False)
    if name in running:
        asleep = running[name].state == LaunchState.ASLEEP
        raise RunError(f"{name} is {running[name].state}, not ready",
                       hint=f"`servedeck wake {name}` wakes it" if asleep else
                       f"wait for it (`servedeck status`), or `servedeck stop {name}` and try again")
    if not launch:
        raise RunError(f"{name} is not running",
                       hint=f"start it with `servedeck start {name}`, or pass --launch to start it for this run "
                            "and stop it afterwards")
    res = deck.start(name, reason="campaign")
    return Target(name, cfg, res.record, launched=not res.already_running)


def close_target(target: Target) -> Optional[dict[str, Any]]:
    """Stop the engines this run started (SIGTERM to each group, grace, SIGKILL); leave adopted ones.
    Returns the first stopped engine's outcome."""
    started = [t.name for t in target.replicas if t.launched]
    if not started:
        return None
    out = Deck(target.cfg).stop(started)
    return out[0] if out else None
