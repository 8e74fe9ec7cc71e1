"""Where a model's files are: a local HF-layout directory, a .gguf file, or an HF repo id in the hub cache.

The HF cache is read with huggingface_hub's own cache API, offline, in the cache the *engine* will use:
HF_HUB_CACHE / HF_HOME from the build's and the model's env win over servedeck's own environment,
because a build that sets HF_HOME loads from there, not from ~/.cache/huggingface.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from servedeck.gpu.gguf_header import is_gguf

WEIGHT_SUFFIXES = (".safetensors", ".gguf", ".pt", ".pth")
_REPO_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


def is_weight_file(name: str) -> bool:
    base = os.path.basename(name)
    if base.endswith(WEIGHT_SUFFIXES):
        return True
    return base.endswith(".bin") and ("model" in base or "pytorch" in base)  # not tokenizer/optimizer .bin


def hf_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """The hub cache as the engine would compute it from its environment."""
    e = {**os.environ, **(env or {})}
    for key in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if e.get(key):
            return Path(os.path.expanduser(e[key]))
    if e.get("HF_HOME"):
        return Path(os.path.expanduser(e["HF_HOME"])) / "hub"
    xdg = e.get("XDG_CACHE_HOME")
    base = Path(os.path.expanduser(xdg)) if xdg else Path.home() / ".cache"
    return base / "huggingface" / "hub"


def looks_like_repo_id(source: str) -> bool:
    return bool(_REPO_ID.match(source)) and not source.startswith((".", "~", "/"))


@dataclass
class SourceFiles:
    kind: str  # "hf" | "dir" | "gguf"
    source: str
    path: Path | None = None  # the directory, the .gguf, or the snapshot the ref points at
    config_path: Path | None = None
    weight_files: list[Path] = field(default_factory=list)
    weights_bytes: int | None = None
    repo_id: str | None = None
    revision: str | None = None  # the ref or commit asked for
    commit: str | None = None  # the snapshot's commit
    problem: str | None = None  # why it cannot be used; None when fine

    def describe(self) -> str:
        if self.kind == "hf":
            at = f"@{self.commit[:8]}" if self.commit else ""
            return f"{self.repo_id}{at}"
        return str(self.path)


def _sizes(files: list[Path]) -> int:
    total = 0
    for f in files:
        try:
            total += f.stat().st_size  # follows the cache's symlinks to the blobs
        except OSError:
            pass
    return total


def _weights_in(d: Path) -> list[Path]:
    return sorted(p for p in d.rglob("*") if is_weight_file(p.name) and (p.is_file()))


def resolve(source: str, env: Mapping[str, str] | None = None, revision: str | None = None,
            base: Path | None = None) -> SourceFiles:
    """Find config + weights for a model's `source` (already expanded by Config.expand for local paths)."""
    p = Path(os.path.expanduser(source))
    if not p.is_absolute() and base is not None and not looks_like_repo_id(source):
        p = base / p
    if source.endswith(".gguf") or (p.is_file() and is_gguf(p)):
        sf = SourceFiles(kind="gguf", source=source, path=p)
        if not p.is_file():
            sf.problem = f"{p} does not exist"
        else:
            sf.weight_files, sf.weights_bytes = [p], p.stat().st_size
        return sf
    if p.is_dir() or not looks_like_repo_id(source):
        sf = SourceFiles(kind="dir", source=source, path=p)
        if not p.is_dir():
            sf.problem = f"{p} does not exist"
            return sf
        cfgp = p / "config.json"
        sf.config_path = cfgp if cfgp.is_file() else None
        sf.weight_files = _weights_in(p)
        sf.weights_bytes = _sizes(sf.weight_files) if sf.weight_files else None
        if sf.config_path is None:
            ggufs = [w for w in sf.weight_files if w.suffix == ".gguf"]
            sf.problem = None if ggufs else f"{p} has no config.json"
        return sf
    return resolve_hf(source, env, revision)


def resolve_hf(repo_id: str, env: Mapping[str, str] | None = None, revision: str | None = None) -> SourceFiles:
    """Offline: what refs/<revision> points at in the cache, and that snapshot's files."""
    from huggingface_hub import try_to_load_from_cache

    cache = hf_cache_dir(env)
    rev = revision or "main"
    sf = SourceFiles(kind="hf", source=repo_id, repo_id=repo_id, revision=rev)
    found = try_to_load_from_cache(repo_id, "config.json", cache_dir=str(cache), revision=rev)
    if not isinstance(found, str):
        sf.problem = f"{repo_id} (revision {rev}) has no config.json in the HF cache at {cache}"
        return sf
    snap = Path(found).parent
    sf.path, sf.config_path, sf.commit = snap, Path(found), snap.name
    sf.weight_files = _weights_in(snap)
    sf.weights_bytes = _sizes(sf.weight_files) if sf.weight_files else None
    return sf


def read_json(path: Path | None) -> dict[str, Any] | None:
    if path is None:
        return None
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def safetensors_total(sf: SourceFiles) -> int | None:
    """The index's metadata.total_size (exact tensor bytes) when a sharded checkpoint has one."""
    if sf.path is None or sf.kind == "gguf":
        return None
    idx = read_json(sf.path / "model.safetensors.index.json")
    try:
        return int(idx["metadata"]["total_size"]) if idx else None
    except (KeyError, TypeError, ValueError):
        return None
