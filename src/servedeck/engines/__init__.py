"""Engine adapters. The three built-ins register through the `servedeck.engines` entry-point group,
exactly as an outside package would add a fourth."""

from __future__ import annotations

from importlib.metadata import entry_points

from servedeck.engines.base import Engine, LaunchSpec, render_args
from servedeck.errors import ConfigError

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


__all__ = ["Engine", "LaunchSpec", "all_engines", "get_engine", "render_args"]
