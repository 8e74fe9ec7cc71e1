"""The workload kinds: what a measured server can be sent. One module each, one line each here:

    chat            --input-tokens/--output-tokens per request, one point per load (chat.py; points.py's machinery)
    long-prompt     a prompt near the context (long_prompt.py)
    decode          one fixed prompt: TPOT and decode tok/s only (decode.py)
    ramp            one conversation grown turn by turn to its cut-off (ramp.py)
    conversations   many users, each a multi-turn conversation (conversations.py)
    shared-prefix   groups of requests sharing a prefix (shared_prefix.py)
    trace           a recorded trace replayed on its own schedule (trace.py)
    capacity        the most load within an SLO, each step a load point (capacity.py, search.py)

Each is a `Kind` (workloads/shape.py says its fields). `servedeck bench --workload NAME`, a campaign file's
`kind = "NAME"`, a campaign cell's workload step, `campaign plan`, and the run's figures in every report
find a kind here and nowhere else. A kind from an outside package registers through the `servedeck.workloads`
entry point (`name = "its_module:KIND"`), exactly as a built-in is listed below.
"""

from __future__ import annotations

from enum import Enum
from importlib.metadata import entry_points
from typing import Any, Mapping, Optional

from servedeck.errors import UsageError
from servedeck.workloads import capacity, chat, conversations, decode, long_prompt, ramp, shared_prefix, trace
from servedeck.workloads.shape import Key, Kind, Option

KINDS: dict[str, Kind] = {
    "chat": chat.KIND,
    "long-prompt": long_prompt.KIND,
    "decode": decode.KIND,
    "ramp": ramp.KIND,
    "conversations": conversations.KIND,
    "shared-prefix": shared_prefix.KIND,
    "trace": trace.KIND,
    "capacity": capacity.KIND,
}
DEFAULT = "chat"  # what `servedeck bench` sends without --workload
ENTRY_POINTS = "servedeck.workloads"


def _outside() -> dict[str, Kind]:
    """Kinds of installed packages, by their `servedeck.workloads` entry points."""
    found: dict[str, Kind] = {}
    for ep in entry_points(group=ENTRY_POINTS):
        kind = ep.load()
        if not isinstance(kind, Kind) or kind.name != ep.name:
            raise UsageError(f"the {ENTRY_POINTS} entry point {ep.name!r} ({ep.value}) is not a workload Kind named "
                             f"{ep.name!r}", hint="point it at a module's KIND = Kind(name=..., ...) "
                                                  "named as the entry point")
        found.setdefault(ep.name, kind)
    return found


KINDS.update({name: k for name, k in _outside().items() if name not in KINDS})


def kind(name: str) -> Kind:
    if name not in KINDS:
        raise UsageError(f"no workload kind {name!r}", hint=f"kinds: {', '.join(KINDS)}")
    return KINDS[name]


def of_spec(spec: Any) -> Kind:
    """The kind a spec (what one run sends) is of."""
    return kind(spec.kind)


def kind_of(summary: Mapping[str, Any]) -> Optional[Kind]:
    """The kind a run (its summary.json, or its view) ran, from its workload entry; None for a gate's run or one
    of a kind no longer known."""
    workload = summary.get("workload") or {}
    if not isinstance(workload, Mapping):
        return None
    for k in KINDS.values():
        if k.owns is not None and k.owns(workload):
            return k
    return KINDS.get(str(workload.get("workload")))


def curve_of(summary: Mapping[str, Any]) -> Optional[str]:
    """Where a run's points go in the cross-run report: "load" or "length" (shape.py `Kind.curve`); a run of a
    kind no longer known goes against load, as every kind's did before kinds said where."""
    k = kind_of(summary)
    if k is not None and k.curve is None:  # as the kind its points are (a capacity search's steps)
        k = KINDS.get(str((summary.get("workload") or {}).get("workload")))
    return k.curve if k is not None and k.curve is not None else "load"


# `servedeck bench --workload`: the choices, in the order above
WorkloadChoice = Enum("WorkloadChoice", {n.replace("-", "_"): n for n in KINDS}, type=str)  # type: ignore[misc]


def options() -> list[Option]:
    """Every kind's `servedeck bench` options, once each, in the order the kinds list them. Two kinds declaring
    one flag must agree on its parameter, type and default (they share the Option, workloads/options.py)."""
    seen: dict[str, Option] = {}
    for k in KINDS.values():
        for o in k.options:
            have = seen.get(o.flags[0])
            if have is None:
                seen[o.flags[0]] = o
            elif (have.param, have.type, have.default) != (o.param, o.type, o.default):
                raise AssertionError(f"{o.flags[0]}: kinds {k.name!r} and an earlier one declare it differently")
    return list(seen.values())


def keys() -> dict[str, Key]:
    """Every kind's own campaign-file keys, once each (shared keys must agree on their type and default)."""
    seen: dict[str, Key] = {}
    for k in KINDS.values():
        for key in k.keys:
            have = seen.setdefault(key.name, key)
            if (have.type, have.default) != (key.type, key.default):
                raise AssertionError(f"campaign key {key.name}: kind {k.name!r} and an earlier one declare it differently")
    return seen


def owners(key: str) -> list[str]:
    """The kinds that take campaign-file key `key`, in registry order."""
    return [k.name for k in KINDS.values() if any(x.name == key for x in k.keys)]


def misplaced(entry: Any) -> Optional[str]:
    """A [[workloads]] entry giving keys of another kind: what to say (None when none). Keys one kind alone takes
    are named first, with every key of that kind; keys several kinds share after."""
    mine = {x.name for x in KINDS[entry.kind].keys}
    given = [name for name in keys() if name not in mine and getattr(entry, name) not in (None, [])]
    if not given:
        return None
    for k in KINDS.values():  # keys only one kind takes, that kind first
        alone = [g for g in given if owners(g) == [k.name]]
        if alone:
            return f"{', '.join(alone)}: only a kind = \"{k.name}\" workload takes {', '.join(x.name for x in k.keys)}"
    same = [g for g in given if owners(g) == owners(given[0])]
    by = " or ".join(f'kind = "{n}"' for n in owners(given[0]))
    return f"{', '.join(same)}: only a {by} workload takes {'it' if len(same) == 1 else 'them'}"
