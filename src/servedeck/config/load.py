"""Read models.toml, validate it whole, and answer "which model is this name?".

The file is the user's: servedeck reads it and never rewrites it. Every problem is reported
with the file, the key path and what was expected; nothing is corrected silently.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from pydantic import ValidationError

from servedeck.config.schema import Deck, Model
from servedeck.config.tomlfile import problems as validation_lines
from servedeck.config.tomlfile import read_toml
from servedeck.errors import ConfigError, UnknownModelError

if sys.version_info >= (3, 11):
    pass
else:  # pragma: no cover
    pass


@dataclass(frozen=True)
class Config:
    path: Path
    deck: Deck

    @property
    def models(self) -> dict[str, Model]:
        return self.deck.models

    def resolve(self, name: str) -> str:
        """A model name or any alias → the model's name."""
        if name in self.deck.models:
            return name
        for mname, m in self.deck.models.items():
            if name in m.aliases or name == m.served_name:
                return mname
        known = ", ".join(sorted(self.deck.models)) or "(none)"
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


Check = Callable[[Deck], list[str]]  # more rules over the whole file (the engines' own: engines.check_deck)


def parse(text: str, path: Path, checks: Iterable[Check] = ()) -> Config:
    raw = read_toml(text, path)
    try:
        deck = Deck.model_validate(raw)
    except ValidationError as e:
        lines = validation_lines(e, f"{path}: ", "docs/config.md")
        raise ConfigError("\n".join(lines), hint="see docs/config.md for every key and its type") from None
    problems = cross_check(deck)
    if not problems:  # engine rules assume the file hangs together (builds exist)
        for check in checks:
            problems += check(deck)
    if problems:
        raise ConfigError("\n".join(f"{path}: {p}" for p in problems), hint="each line names the key to fix")
    return Config(path=path, deck=deck)


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


def cross_check(deck: Deck) -> list[str]:
    """Rules that span entries: builds exist, ports and names unique, enough GPUs for the layout."""
    problems: list[str] = []
    ports: dict[int, str] = {}
    names: dict[str, str] = {m: f"models.{m}" for m in deck.models}
    for mname, m in deck.models.items():
        key = f"models.{mname}"
        if m.build not in deck.builds:
            known = ", ".join(sorted(deck.builds)) or "(none)"
            problems.append(f"{key}.build: build {m.build!r} does not exist (builds defined: {known})")
        if m.port in ports:
            problems.append(f"{key}.port: port {m.port} is already used by models.{ports[m.port]}")
        else:
            ports[m.port] = mname
        for alias in m.aliases:
            if alias in deck.models and alias != mname:
                problems.append(f"{key}.aliases: alias {alias!r} is the name of another model (models.{alias})")
            elif alias in names and names[alias] != key:
                problems.append(f"{key}.aliases: alias {alias!r} is already claimed by {names[alias]}")
            else:
                names[alias] = key
        if m.gpus and m.tp * m.dp * m.pp > len(m.gpus):
            problems.append(
                f"{key}.gpus: tp*dp*pp = {m.tp * m.dp * m.pp} GPUs needed but only {len(m.gpus)} listed ({m.gpus})"
            )
    for i, name in enumerate(deck.host.preload):
        if name not in names:
            known = ", ".join(sorted(names)) or "(none)"
            problems.append(f"host.preload[{i}]: no model or alias named {name!r} (known: {known})")
    return problems
