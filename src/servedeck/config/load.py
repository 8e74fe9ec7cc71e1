"""Read models.toml, validate it whole, and answer "which model is this name?".

The file is the user's: servedeck reads it and never rewrites it. Every problem is reported
with the file, the key path and what was expected; nothing is corrected silently.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from pydantic import ValidationError

from servedeck.config.schema import Model, ModelsToml
from servedeck.config.tomlfile import problems as validation_lines
from servedeck.config.tomlfile import read_toml
from servedeck.errors import ConfigError, UnknownModelError
from servedeck.paths import NAME_RULE, name_problem, suggested_name

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover
    pass


@dataclass(frozen=True)
class Group:
    """A models.toml entry with replicas = N: N independent servers NAME.r1 … NAME.rN (models of their
    own in `Config.models`) that one name, its aliases and the front door treat as one model."""

    name: str
    members: tuple[str, ...]
    aliases: tuple[str, ...]
    served_name: str
    slot: str
    ttl: float | None
    ttl_sleep: float | None = None


@dataclass(frozen=True)
class Config:
    path: Path
    deck: ModelsToml  # models: as servedeck runs them (a replicated entry already expanded into its replicas)
    groups: dict[str, Group] = field(default_factory=dict)

    @property
    def models(self) -> dict[str, Model]:
        return self.deck.models

    def group_named(self, name: str) -> Group | None:
        """The replicated entry called `name` (its name or an alias); None for anything else."""
        for g in self.groups.values():
            if name == g.name or name in g.aliases:
                return g
        return None

    def group_of(self, model: str) -> Group | None:
        """The replicated entry the model `model` is a replica of; None for a model of its own."""
        for g in self.groups.values():
            if model in g.members:
                return g
        return None

    def siblings(self, model: str) -> set[str]:
        """The other replicas of the entry `model` belongs to (they share its slot); empty for a model of its own."""
        g = self.group_of(model)
        return set(g.members) - {model} if g else set()

    def members(self, name: str) -> tuple[str, ...]:
        """A name or alias → the models it starts: a replicated entry's replicas, else the one model."""
        g = self.group_named(name)
        return g.members if g else (self.resolve(name),)

    def resolve(self, name: str) -> str:
        """A model name or any alias → the model's name. A replicated entry's name is refused here:
        commands that take one server name one replica (`members` answers for the whole entry)."""
        if name in self.deck.models:
            return name
        g = self.group_named(name)
        if g:
            raise UnknownModelError(
                f"{self.path}: {name!r} has replicas = {len(g.members)}, and this command takes one server",
                hint=f"name one replica: {', '.join(g.members)}")
        for mname, m in self.deck.models.items():
            if name in m.aliases or name == m.served_name:
                return mname
        known = ", ".join(sorted([*self.deck.models, *self.groups])) or "(none)"
        raise UnknownModelError(
            f"{self.path}: no model or alias named {name!r}",
            hint=f"models defined: {known}. Add [models.{name}] or use one of those.",
        )

    def model(self, name: str) -> Model:
        return self.deck.models[self.resolve(name)]

    def expand(self, value: str) -> str:
        """~, $VARS, and paths relative to the config file's folder."""
        v = os.path.expanduser(os.path.expandvars(value))
        if v.startswith(("./", "../")):
            v = str((self.path.parent / v).resolve())
        return v


Check = Callable[[ModelsToml], list[str]]  # more rules over the whole file (the engines' own: engines.check_deck)


def parse(text: str, path: Path, checks: Iterable[Check] = ()) -> Config:
    raw = read_toml(text, path)
    try:
        deck = ModelsToml.model_validate(raw)
    except ValidationError as e:
        lines = validation_lines(e, f"{path}: ", ModelsToml)
        raise ConfigError("\n".join(lines), hint="fix each key named above as its line says (`servedeck init "
                          "--dry-run` prints a models.toml that loads, for comparison)") from None
    deck, groups, problems = expand_replicas(deck)
    problems += cross_check(deck, groups)
    if not problems:  # engine rules assume the file hangs together (builds exist)
        for check in checks:
            problems += check(deck)
    if problems:
        raise ConfigError("\n".join(f"{path}: {p}" for p in problems), hint="each line names the key to fix")
    return Config(path=path, deck=deck, groups=groups)


def replica_name(name: str, r: int) -> str:
    return f"{name}.r{r}"


def expand_replicas(deck: ModelsToml) -> tuple[ModelsToml, dict[str, Group], list[str]]:
    """Each entry with replicas = N becomes N models NAME.r1 … NAME.rN: port + r - 1, the r-th gpus /
    cpus list, the entry's slot, served under the entry's served name, no aliases of their own (the
    group holds them). Everything else is the entry's."""
    models: dict[str, Model] = {}
    groups: dict[str, Group] = {}
    problems: list[str] = []
    for name, m in deck.models.items():
        if m.replicas == 1:
            models[name] = m
            continue
        members = []
        for r in range(1, m.replicas + 1):
            rname = replica_name(name, r)
            if rname in deck.models:
                problems.append(f"models.{name}.replicas: replica {r} would be named {rname!r}, "
                                f"which is already a model (models.{rname}); rename one of them")
                continue
            if m.port + r - 1 > 65535:
                problems.append(f"models.{name}.port: replica {r} would serve on port {m.port + r - 1}, "
                                "past 65535; pick a lower port")
                continue
            update = {"port": m.port + r - 1, "replicas": 1, "aliases": [], "ttl": None, "ttl_sleep": None,
                      "served_name": m.served_name or name,
                      "gpus": m.gpus[r - 1] if m.gpus else [], "cpus": m.cpus[r - 1] if m.cpus else [],
                      "cpu_mems": m.cpu_mems[r - 1] if m.cpu_mems else [],
                      "notes": (m.notes + " " if m.notes else "") + f"(replica {r} of {m.replicas} of {name})"}
            models[rname] = Model.model_validate({**m.model_dump(), **update})
            members.append(rname)
        groups[name] = Group(name, tuple(members), tuple(m.aliases), m.served_name or name, m.slot, m.ttl, m.ttl_sleep)
    if not groups:
        return deck, {}, problems
    return deck.model_copy(update={"models": models}), groups, problems


def _where(mname: str, groups: dict[str, Group], key: str = "") -> str:
    """The key path a user can find in the file: a replica's settings live in its entry."""
    for g in groups.values():
        if mname in g.members:
            return f"models.{g.name}{'.' + key if key else ''} (replica {g.members.index(mname) + 1})"
    return f"models.{mname}{'.' + key if key else ''}"


def _name_problems(name: str) -> list[str]:
    """A model's name becomes a file name under $SERVEDECK_HOME (paths.NAME_RULE): refuse one that cannot."""
    problem = name_problem(name)
    if not problem:
        return []
    better = suggested_name(name)
    return [f"models.{json.dumps(name)}: {name!r} cannot be a model's name: {problem} (a model's name becomes file names "
            f"under $SERVEDECK_HOME: {NAME_RULE}); name it [models.{better}] and keep "
            f"{name!r} as an alias, aliases = [{json.dumps(name)}], so that clients can still send it"]


def load(path: Path, checks: Iterable[Check] = ()) -> Config:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(
            f"{path}: no such file", hint="run `servedeck init` to write a starter models.toml, or pass --config"
        ) from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    return parse(text, path, checks)


def cross_check(deck: ModelsToml, groups: dict[str, Group] | None = None) -> list[str]:
    """Rules that span entries: builds exist, ports and names unique, enough GPUs for the layout."""
    groups = groups or {}
    problems: list[str] = []
    ports: dict[int, str] = {}
    names: dict[str, str] = {m: _where(m, groups) for m in deck.models}
    members = {m for g in groups.values() for m in g.members}
    for name in [*groups, *(m for m in deck.models if m not in members)]:
        problems += _name_problems(name)
    for g in groups.values():
        names[g.name] = f"models.{g.name}"
        for alias in g.aliases:
            if alias in names and names[alias] != f"models.{g.name}":
                problems.append(f"models.{g.name}.aliases: alias {alias!r} is already claimed by {names[alias]}")
            else:
                names[alias] = f"models.{g.name}"
    for mname, m in deck.models.items():
        def at(k: str) -> str:
            return _where(mname, groups, k)

        if m.build not in deck.builds:
            known = ", ".join(sorted(deck.builds)) or "(none)"
            problems.append(f"{at('build')}: build {m.build!r} does not exist (builds defined: {known})")
        if m.port in ports:
            problems.append(f"{at('port')}: port {m.port} is already used by {_where(ports[m.port], groups)}")
        else:
            ports[m.port] = mname
        for alias in m.aliases:
            if alias in deck.models and alias != mname:
                problems.append(f"{at('aliases')}: alias {alias!r} is the name of another model (models.{alias})")
            elif alias in names and names[alias] != f"models.{mname}":
                problems.append(f"{at('aliases')}: alias {alias!r} is already claimed by {names[alias]}")
            else:
                names[alias] = f"models.{mname}"
        build = deck.builds.get(m.build)
        if m.cpu_mems and build is not None and not build.image:
            problems.append(f"{at('cpus')}: memory nodes (mems) are given to a container (docker --cpuset-mems); "
                            f"build {m.build!r} runs a process, which servedeck pins to its CPUs only: remove mems")
        if m.gpus and m.tp * m.dp * m.pp > len(m.gpus):
            problems.append(
                f"{at('gpus')}: tp*dp*pp = {m.tp * m.dp * m.pp} GPUs needed but only {len(m.gpus)} listed ({m.gpus})"
            )
    for i, name in enumerate(deck.host.preload):
        if name not in names:
            known = ", ".join(sorted(names)) or "(none)"
            problems.append(f"host.preload[{i}]: no model or alias named {name!r} (known: {known})")
    return problems
