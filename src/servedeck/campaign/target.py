"""The server a gate or benchmark measures: one the deck runs already, or one started for the run.

States: open (the engine answers; `launched` says whether this run started it) → closed (a
launched engine stopped through the deck; an adopted one left running). `death()` tells whether
the engine has gone, and what the shim recorded about how.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from servedeck.config import Config
from servedeck.deck import Deck
from servedeck.deck.deck import describe_exit
from servedeck.deck.records import LaunchState, LiveRecord
from servedeck.engines.base import Endpoint
from servedeck.errors import RunError
from servedeck.supervisor import process as P
from servedeck.supervisor import ready as R


@dataclass
class Target:
    name: str
    cfg: Config
    record: LiveRecord  # the deck's live record
    launched: bool  # this run started it, so this run stops it

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
    def server(self) -> Endpoint:
        return self.record.endpoint

    def death(self) -> Optional[str]:
        """None while the engine lives; otherwise how it ended, as its launch folder records it."""
        if P.alive(self.record.pid, self.record.create_time):
            return None
        exit_info = R.read_exit(Path(self.launch_dir)) if self.launch_dir else None
        return f"the {self.engine} server died: {describe_exit(exit_info)}"


def open_target(cfg: Config, model: str, launch: bool) -> Target:
    """The running model named `model`; with `launch`, start it first (through the deck) if it is not up."""
    name = cfg.resolve(model)
    deck = Deck(cfg)
    running = deck.running()
    if name in running and running[name].state == LaunchState.READY:
        return Target(name, cfg, running[name], launched=False)
    if name in running:
        raise RunError(f"{name} is {running[name].state}, not ready",
                       hint=f"wait for it (`servedeck status`), or `servedeck stop {name}` and try again")
    if not launch:
        raise RunError(f"{name} is not running",
                       hint=f"start it with `servedeck start {name}`, or pass --launch to start it for this run "
                            "and stop it afterwards")
    res = deck.start(name, reason="campaign")
    return Target(name, cfg, res.record, launched=not res.already_running)


def close_target(target: Target) -> Optional[dict[str, Any]]:
    """Stop the engine if this run started it (SIGTERM to its group, grace, SIGKILL); else leave it."""
    if not target.launched:
        return None
    out = Deck(target.cfg).stop([target.name])
    return out[0] if out else None
