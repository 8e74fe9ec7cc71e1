"""The typed records that travel between the deck and everything that uses it: a launch's state, the
live record of an engine servedeck started, and the endpoint a client talks to.

States of a launch (launch.json "state", mirrored in the live record):
    starting  being spawned (recorded before the spawn: no pid yet) or spawned; not yet healthy-and-answering
    ready     alive, healthy, and one real completion was answered
    asleep    alive, its GPU memory given back (weights in host memory at level 1, discarded at 2);
              answers nothing until the deck wakes it (recorded before the engine is told to sleep,
              so a servedeck killed mid-sleep leaves it asleep to every reader, and waking is idempotent)
    stopping  a stop is under way (SIGTERM sent to the group)
    stopped   ended by `stop` or `switch`          (terminal)
    failed    died or timed out while starting    (terminal)
    crashed   found dead after being ready         (terminal)
Only the deck (deck/deck.py) moves a launch between states.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields
from enum import Enum
from typing import Any, Optional

from servedeck.engines.base import Endpoint, LaunchSpec


class LaunchState(str, Enum):
    STARTING = "starting"
    READY = "ready"
    ASLEEP = "asleep"
    STOPPING = "stopping"
    STOPPED = "stopped"
    FAILED = "failed"
    CRASHED = "crashed"

    @property
    def terminal(self) -> bool:
        return self in (LaunchState.STOPPED, LaunchState.FAILED, LaunchState.CRASHED)

    def __str__(self) -> str:  # "ready", not "LaunchState.READY", in messages and f-strings
        return self.value

    @classmethod
    def after_death(cls, was: "LaunchState") -> "LaunchState":
        """What a launch whose process is found gone has become: a stop finished, a start failed,
        anything else crashed."""
        if was == cls.STOPPING:
            return cls.STOPPED
        if was == cls.STARTING:
            return cls.FAILED
        return cls.CRASHED


@dataclass
class LiveRecord:
    """One engine servedeck started and has not yet seen end: live/<model>.json.

    Written atomically by the deck just before the spawn (pid, pgid and create_time still None, so
    that a servedeck killed mid-spawn leaves a record the next one reaps by its launch folder), at
    spawn, at ready and at stopping; read by everyone else."""

    model: str
    engine: str
    build: str
    slot: str
    port: int
    launch_dir: str
    pid: Optional[int]  # the shim, leader of the engine's process group; None until it is spawned
    pgid: Optional[int]
    create_time: Optional[float]  # with pid: tells a reused pid from ours
    owner_pid: int  # the servedeck process that started it
    state: LaunchState = LaunchState.STARTING
    host: str = "127.0.0.1"
    served_name: str = ""
    base_url: str = ""
    health_path: str = "/health"
    stop_timeout_s: float = 120.0
    gpus: list[int] = field(default_factory=list)
    cpus: list[int] = field(default_factory=list)  # the CPU set it was pinned to (models.toml cpus)
    image: Optional[str] = None
    docker: Optional[str] = None
    config_path: str = ""
    reason: str = "start"
    started_at: str = ""
    ready_at: Optional[str] = None
    ready_t: Optional[float] = None  # wall time it became ready (for uptime)
    engine_pid: Optional[int] = None
    boot: dict[str, Any] = field(default_factory=dict)
    readiness: dict[str, Any] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)  # the rendered LaunchSpec (redacted)
    owner_create_time: Optional[float] = None  # with owner_pid: tells a reused pid from the owner
    # sleep (deck/sleep.py): the level it sleeps at now, since when (wall clock), how often this launch
    # slept; what its processes held per GPU ("0": bytes) just before and just after sleeping, and the
    # host memory it pins asleep (its weights at level 1); the first wake's output check
    sleep_level: Optional[int] = None
    asleep_since: Optional[float] = None
    sleeps: int = 0
    awake_gpu_bytes: dict[str, int] = field(default_factory=dict)
    asleep_gpu_bytes: dict[str, int] = field(default_factory=dict)
    asleep_host_bytes: Optional[int] = None
    wake_check: Optional[str] = None  # identical | differs | not comparable: (why) | None before the first wake
    schema: int = 1

    @property
    def endpoint(self) -> Endpoint:
        return Endpoint(self.model, self.engine, self.base_url, self.served_name or self.model, self.health_path,
                        request=dict(self.spec.get("request") or {}))

    def probe_spec(self) -> LaunchSpec:
        """Enough of a LaunchSpec to probe the running engine (health, one completion)."""
        return LaunchSpec(model=self.model, engine=self.engine, argv=[], env={}, host=self.host, port=self.port,
                          served_name=self.served_name or self.model, health_path=self.health_path, slot=self.slot,
                          stop_timeout_s=self.stop_timeout_s, ready_timeout_s=0,
                          request=dict(self.spec.get("request") or {}),
                          embeddings=bool(self.spec.get("embeddings")))

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["state"] = self.state.value
        return d

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "LiveRecord":
        """From live/<model>.json; keys this version does not know are ignored (a newer writer)."""
        known = {f.name for f in fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        kw["state"] = LaunchState(d.get("state", "starting"))
        if "health_path" not in d and isinstance(d.get("spec"), dict):
            kw["health_path"] = d["spec"].get("health_path", "/health")
        return cls(**kw)


@dataclass
class StartResult:
    """What `Deck.start` / `switch` did: the model's live record, and who was stopped for it."""

    record: LiveRecord
    already_running: bool = False
    evicted: list[str] = field(default_factory=list)
    waited_for_memory_s: Optional[float] = None  # a switch that waited for the GPU to free the old model's memory
    replicas: list[LiveRecord] = field(default_factory=list)  # a replicated entry: replicas 2…N (`record` is 1)
    slept: dict[str, dict] = field(default_factory=dict)  # holders put to sleep instead of stopped: {model: what}
    stopped_cold: dict[str, str] = field(default_factory=dict)  # holders stopped: {model: why not asleep}
    woke: Optional[dict] = None  # the target was asleep and was woken (level, took_s, check), or restarted cold

    @property
    def records(self) -> list[LiveRecord]:
        return [self.record, *self.replicas]

    def to_json(self) -> dict[str, Any]:
        out = {**self.record.to_json(), "already_running": self.already_running, "evicted": self.evicted,
               "waited_for_memory_s": self.waited_for_memory_s, "slept": self.slept,
               "stopped_cold": self.stopped_cold, "woke": self.woke}
        if self.replicas:
            out["replicas"] = [r.to_json() for r in self.records]
        return out
