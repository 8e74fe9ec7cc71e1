"""What `servedeck init` finds on a machine: engines and models, each with where it was found, and what it
left out and why. Finders only look (read files and manifests, ask a container client for its image list);
servedeck.init decides what goes into models.toml.

Each finder is one function in FINDERS (engines.py and models.py): a new place to look is one function
and one line there.
"""

from __future__ import annotations

from pathlib import Path

from servedeck.discover.found import Engine, Found, LeftOut, Model, Roots

__all__ = ["Engine", "Found", "LeftOut", "Model", "Roots", "discover"]


def discover(roots: Roots) -> Found:
    from servedeck.discover import engines, models

    found = Found()
    for finder in engines.FINDERS + models.FINDERS:
        finder(roots, found)
    # The same file reached twice (a folder named with --models-dir that is also servedeck's cache, a
    # llama-server on PATH that is the cached build) is listed once, where it was found first.
    found.engines = _unique(found.engines, lambda e: _real(e.where) if e.kind != "image" else e.where)
    found.models = _unique(found.models, lambda m: _real(m.source))
    return found


def _real(p: str) -> str:
    try:
        return str(Path(p).resolve())
    except OSError:
        return p


def _unique(items, key):
    seen, out = set(), []
    for it in items:
        k = key(it)
        if k not in seen:
            seen.add(k)
            out.append(it)
    return out
