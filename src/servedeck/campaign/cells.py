"""From a campaign to cells, and which cells run next. Pure: no process is started here.

A variant becomes one models.toml-like model entry per replica, derived from the base model:
`smollm2@p1` (one replica) or `smollm2@2x.r1`, `smollm2@2x.r2`, each on its own port and slot, so the
deck renders, launches, supervises and records them exactly like the user's own models. A cell is one
launch of a variant (variant × repeat); its GPU/CPU sets decide which cells may run side by side.

    derive(cfg, campaign)        → Derived (a Config holding the user's models plus the derived ones)
    cell_list(campaign, derived) → [Cell]   ("VARIANT#R", repeats round-robin so drift spreads evenly)
    next_cells(pending, running, parallel) → cells to start now
    to_run(state, ...)           → whether `campaign run` (re)does a cell
    CellState, moved(old, new)   → a cell's states and the moves between them (campaign.json keeps the values)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Iterable, Optional

from servedeck.campaign.file import Campaign, Variant
from servedeck.config import Config
from servedeck.config.load import cross_check, replica_name
from servedeck.config.schema import Model, ModelsToml as DeckModel
from servedeck.errors import ConfigError, ServedeckError


class CellState(str, Enum):
    """Where a cell stands; campaign.json keeps the value. The runner is the only one that moves a cell
    (CampaignFolder.move_cell checks each move against MOVES)."""

    PENDING = "pending"  # not begun, or interrupted (Ctrl-C): `campaign run --resume` does it
    RUNNING = "running"  # its engines are launched or being measured; found so by a later run: redone
    DONE = "done"  # every workload ran (a failed gate marks the figures but is not a failure)
    FAILED = "failed"  # a replica did not boot, a server died, a node was lost; --retry-failed redoes it
    TIMED_OUT = "timed-out"  # cell_timeout passed: its engines were stopped, what finished is kept
    SKIPPED = "skipped"  # left out by --only; a later run without it does it

    @property
    def finished(self) -> bool:
        """Counted as done by progress, ETA and `finished`: the campaign does not come back to it alone."""
        return self in FINISHED


FINISHED = frozenset({CellState.DONE, CellState.FAILED, CellState.TIMED_OUT})

_P, _R, _D, _F, _T, _S = CellState  # the table below, in short
MOVES: dict[CellState, frozenset[CellState]] = {
    _P: frozenset({_R, _S}),
    _S: frozenset({_R}),
    # a cell ends once, in one of four ways; RUNNING again: the servedeck that ran it is gone (a redo), or
    # another attempt at it begins (its Ray node was lost)
    _R: frozenset({_D, _F, _T, _P, _R}),
    _F: frozenset({_R}),  # --retry-failed
    _T: frozenset({_R}),  # --retry-failed
    _D: frozenset(),  # a done cell is never redone: a new campaign measures again
}


class CellMoveError(ValueError):
    """A move MOVES does not allow: a servedeck bug, never a user's mistake."""


def moved(old: str | CellState, new: str | CellState) -> CellState:
    """The state a cell moves to, or CellMoveError naming both ends when MOVES does not allow it."""
    try:
        a, b = CellState(old), CellState(new)
    except ValueError:
        raise CellMoveError(f"cell state {old!r} → {new!r}: not a cell state "
                            f"({', '.join(s.value for s in CellState)})") from None
    if b not in MOVES[a]:
        raise CellMoveError(f"cell state {a.value} → {b.value} is not a move a cell makes "
                            f"(from {a.value}: {', '.join(sorted(s.value for s in MOVES[a])) or 'none'})")
    return b


@dataclass(frozen=True)
class Ending:
    """How a cell's work ended, as its placement tells the runner (which records it: runner.py)."""

    state: CellState
    reason: Optional[str] = None
    signature: Optional[str] = None  # the failure's classified signature (a launch that never came up)
    fields: dict[str, Any] = field(default_factory=dict)  # the placement's own record fields (Ray: attempts)


def failed_by(e: Exception) -> Ending:
    """A cell's work that raised, as its end: a servedeck error's message, else the bug named (a servedeck
    bug in one cell must not lose the others)."""
    if isinstance(e, ServedeckError):
        return Ending(CellState.FAILED, e.message)
    return Ending(CellState.FAILED, f"servedeck failed: {type(e).__name__}: {e}")


@dataclass(frozen=True)
class Derived:
    cfg: Config  # the user's models.toml plus one entry per (variant, replica)
    models: dict[str, tuple[str, ...]]  # variant → its derived model names, one per replica
    base: str  # the base model's name in models.toml


def derived_name(base: str, variant: str, replica: int, replicas: int) -> str:
    """`smollm2@p1`, or per replica `smollm2@2x.r1` (named as models.toml's replicas are)."""
    return f"{base}@{variant}" if replicas == 1 else replica_name(f"{base}@{variant}", replica)


def _model_entry(base: Model, v: Variant, replica: int, port: int, name: str, served: str) -> dict[str, Any]:
    m = base.model_dump(mode="json")
    for key in ("build", "context", "tp", "dp", "pp", "gpu_memory_utilization"):
        value = getattr(v, key)
        if value is not None:
            m[key] = value
    m["args"] = {**base.args, **v.args}
    m["env"] = {**base.env, **v.env}
    if v.gpus:
        m["gpus"] = v.sets("gpus")[replica]
    if v.cpus:  # the variant's CPUs with its own memory nodes, never the base entry's for other CPUs
        m["cpus"] = v.sets("cpus")[replica]
        m["cpu_mems"] = v.sets("cpu_mems")[replica] if v.cpu_mems else []
    m.update(port=port, slot=name, aliases=[], served_name=served,
             notes=f"campaign variant {v.name}, replica {replica + 1} of {v.replicas}, derived from models.toml")
    return m


def derive(cfg: Config, camp: Campaign) -> Derived:
    """The derived model entries, validated as models.toml validates its own; ConfigError names the variant."""
    try:
        base_name = cfg.resolve(camp.head.model)
    except ConfigError as e:
        raise ConfigError(f"{camp.path}: campaign.model: {e.message}", hint=e.hint) from None
    base = cfg.models[base_name]
    served = base.served_name or base_name
    used = {m.port for m in cfg.models.values()}
    port = base.port + camp.head.port_offset
    models: dict[str, dict[str, Any]] = {}
    names: dict[str, tuple[str, ...]] = {}
    where: dict[str, str] = {}
    problems: list[str] = []
    for v in camp.variants:
        mine = []
        for r in range(v.replicas):
            port += 1
            while port in used:
                port += 1
            name = derived_name(base_name, v.name, r + 1, v.replicas)
            try:
                models[name] = Model.model_validate(_model_entry(base, v, r, port, name, served)).model_dump()
            except Exception as e:  # pydantic: a value the variant set is wrong for a model entry
                problems.append(f"variants.{v.name}: {str(e).splitlines()[-1].strip()}")
                continue
            where[name] = v.name
            mine.append(name)
        names[v.name] = tuple(mine)
    if problems:
        raise ConfigError("\n".join(f"{camp.path}: {p}" for p in problems), hint="fix the variant's overrides")
    deck = DeckModel(host=cfg.deck.host, builds=cfg.deck.builds,
                     models={**cfg.deck.models, **{n: Model(**m) for n, m in models.items()}})
    from servedeck.engines import check_deck

    found = cross_check(deck)
    if not found:  # the engines' own rules assume the entries hang together (builds exist)
        found = check_deck(deck)
    for p in found:
        key = p.split(":")[0]
        name = key.removeprefix("models.").split(".")[0] if key.startswith("models.") else ""
        # models.smollm2@p1.args.x → which variant wrote it; the user's own models were checked at load
        for n in sorted(where, key=len, reverse=True):
            if key.startswith(f"models.{n}"):
                problems.append(f"variants.{where[n]} ({p.replace(f'models.{n}', 'its entry ' + n, 1)})")
                break
        else:
            if name and name not in cfg.models:
                problems.append(p)
    if problems:
        raise ConfigError("\n".join(f"{camp.path}: {p}" for p in problems),
                          hint="each line names the variant and the key to fix")
    return Derived(Config(path=cfg.path, deck=deck), names, base_name)


@dataclass(frozen=True)
class Cell:
    id: str  # "VARIANT#R"
    variant: str
    repeat: int  # from 1
    models: tuple[str, ...]  # the derived model entries this launch starts, one per replica
    gpus: frozenset[int] = field(default_factory=frozenset)
    cpus: frozenset[int] = field(default_factory=frozenset)

    @property
    def pinned(self) -> bool:
        """Whether the cell says where it runs; an unpinned cell may share nothing with another."""
        return bool(self.gpus or self.cpus)


def cell_list(camp: Campaign, derived: Derived) -> list[Cell]:
    cells = []
    for r in range(1, camp.head.repeats + 1):
        for v in camp.variants:
            ms = [derived.cfg.models[n] for n in derived.models[v.name]]
            cells.append(Cell(f"{v.name}#{r}", v.name, r, derived.models[v.name],
                              frozenset(g for m in ms for g in m.gpus), frozenset(c for m in ms for c in m.cpus)))
    return cells


def conflicts(a: Cell, b: Cell) -> bool:
    """Two cells may run at once only when both are pinned and share no GPU and no CPU."""
    if not a.pinned or not b.pinned:
        return True
    return bool(a.gpus & b.gpus or a.cpus & b.cpus)


def next_cells(pending: Iterable[Cell], running: Iterable[Cell], parallel: bool) -> list[Cell]:
    """Cells to start now, in campaign order. Sequential: the first pending one when nothing runs.
    Parallel: every pending cell disjoint from what runs and from those picked before it (no
    overtaking past a cell that waits for resources a later one would also take)."""
    running = list(running)
    pending = list(pending)
    if not parallel:
        return pending[:1] if not running else []
    picked: list[Cell] = []
    for c in pending:
        if any(conflicts(c, o) for o in running + picked):
            if not running and not picked:
                return [c]
            continue
        picked.append(c)
    return picked


def to_run(state: str | CellState, variant: str, only: Optional[set[str]], retry_failed: bool) -> bool:
    """Whether this invocation (re)does a cell: pending/skipped/running ones (a `running` cell's
    servedeck was stopped mid-cell: redo it), failed and timed-out ones with --retry-failed."""
    if only is not None and variant not in only:
        return False
    state = CellState(state)
    if state in (CellState.PENDING, CellState.SKIPPED, CellState.RUNNING):
        return True
    return retry_failed and state in (CellState.FAILED, CellState.TIMED_OUT)


def holders_in_the_way(cell: Cell, running: dict[str, dict[str, Any]], ours: set[str]) -> list[str]:
    """Models the user runs (not this campaign's) that hold a GPU or CPU this cell needs."""
    out = []
    for name, rec in running.items():
        if name in ours:
            continue
        if set(rec.get("gpus") or []) & cell.gpus or set(rec.get("cpus") or []) & cell.cpus:
            out.append(name)
    return out


def eta_s(durations: list[float], remaining: int, parallel_width: int = 1) -> Optional[float]:
    """Remaining cells × the mean measured cell duration (divided among parallel lanes)."""
    if not durations or remaining <= 0:
        return None if remaining > 0 else 0.0
    return sum(durations) / len(durations) * remaining / max(1, parallel_width)
