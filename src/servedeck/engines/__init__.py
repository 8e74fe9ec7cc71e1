"""Engine adapters. The three built-ins register through the `servedeck.engines` entry-point group,
exactly as an outside package would add a fourth."""

from __future__ import annotations

from importlib.metadata import entry_points

from typing import TYPE_CHECKING

from servedeck.engines.base import Engine, LaunchSpec, MemoryModel, render_args
from servedeck.errors import ConfigError

if TYPE_CHECKING:
    from servedeck.config.schema import ModelsToml

_BUILTIN = {
    "llamacpp": "servedeck.engines.llamacpp:ENGINE",
    "vllm": "servedeck.engines.vllm:ENGINE",
    "sglang": "servedeck.engines.sglang:ENGINE",
}
_registry: dict[str, Engine] = {}


def _load() -> dict[str, Engine]:
    if _registry:
        return _registry
    eps = {ep.name: ep for ep in entry_points(group="servedeck.engines")}
    for name, ref in _BUILTIN.items():  # running from a source tree without the package metadata
        if name not in eps:
            mod, _, attr = ref.partition(":")
            _registry[name] = getattr(__import__(mod, fromlist=[attr]), attr)
    for name, ep in eps.items():
        _registry[name] = ep.load()
    return _registry


def get_engine(name: str) -> Engine:
    engines = _load()
    if name not in engines:
        raise ConfigError(f"unknown engine {name!r}", hint=f"engines installed: {', '.join(sorted(engines))}")
    return engines[name]


def all_engines() -> dict[str, Engine]:
    return dict(_load())


def check_deck(deck: "ModelsToml") -> list[str]:
    """The models.toml checks that need an engine: the build's engine is registered, and each model's
    args and keys make sense to that engine. `servedeck.modelsfile` composes them with config's own."""
    engines = _load()
    problems: list[str] = []
    for bname, b in deck.builds.items():
        if b.engine not in engines:
            problems.append(f"builds.{bname}.engine: unknown engine {b.engine!r} "
                            f"(engines registered: {', '.join(sorted(engines))})")
    for mname, m in deck.models.items():
        b = deck.builds.get(m.build)
        if b is not None and b.engine in engines:
            problems += engines[b.engine].check_model(f"models.{mname}", m)
            problems += engines[b.engine].check_sleep(f"models.{mname}", m, b)  # the install is looked at by render
    return problems


__all__ = ["Engine", "LaunchSpec", "MemoryModel", "all_engines", "check_deck", "get_engine", "render_args"]
