"""The weights row: can the engine load this model with the hub offline, from what is on disk now?

HF repo ids are read with huggingface_hub's cache scanner (`scan_cache_dir`), in the cache the engine's env
points at: which commit refs/main names, whether that snapshot holds weight files, their size, and sibling
snapshots without weights (seed 004: a snapshot with no weights next to the good one means a moved ref
fails the launch fast). Local directories and .gguf files are checked on disk.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servedeck.gpu.gguf_header import GGUFError, is_gguf, read_header
from servedeck.gpu.nvml import gib
from servedeck.gpu.source import hf_cache_dir, is_weight_file, looks_like_repo_id

OK, WARN, FAIL, SKIP = "OK", "WARN", "FAIL", "SKIP"


@dataclass
class WeightsResult:
    status: str
    saw: str
    action: str = ""
    data: dict[str, Any] = field(default_factory=dict)


def _index_missing(files: dict[str, Path]) -> list[str]:
    """Shards the safetensors index names that the snapshot/dir does not have."""
    idx = files.get("model.safetensors.index.json")
    if idx is None:
        return []
    try:
        shards = set(json.loads(idx.read_text()).get("weight_map", {}).values())
    except (OSError, ValueError, AttributeError):
        return ["(model.safetensors.index.json unreadable)"]
    return sorted(s for s in shards if s not in files or not files[s].exists())


def check_hf(repo_id: str, env: dict[str, str] | None = None, revision: str | None = None) -> WeightsResult:
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.errors import CacheNotFound, CorruptedCacheException

    cache = hf_cache_dir(env)
    fetch = f"download it while online: `hf download {repo_id}` (HF_HOME as the build sets it)"
    try:
        info = scan_cache_dir(cache)
    except CacheNotFound:
        return WeightsResult(FAIL, f"no HF cache at {cache}: with the hub offline the launch cannot resolve {repo_id}", fetch)
    except CorruptedCacheException as e:
        return WeightsResult(FAIL, f"HF cache at {cache} is corrupted: {e}", "repair or remove the damaged entry")
    repo = next((r for r in info.repos if r.repo_id == repo_id and r.repo_type == "model"), None)
    if repo is None:
        return WeightsResult(FAIL, f"{repo_id} is not in the HF cache at {cache}: an offline launch fails", fetch)
    ref = revision or "main"
    rev = repo.refs.get(ref) or next((r for r in repo.revisions if r.commit_hash.startswith(ref)), None)
    with_weights = {r.commit_hash: [f for f in r.files if is_weight_file(f.file_name)] for r in repo.revisions}
    empty = sorted(c[:8] for c, w in with_weights.items() if not w)
    data: dict[str, Any] = {"cache": str(cache), "repo": repo_id, "ref": ref, "snapshots": len(repo.revisions),
                            "snapshots_without_weights": empty}
    if rev is None:
        have = ", ".join(sorted(repo.refs)) or "none"
        return WeightsResult(FAIL, f"{repo_id}: no refs/{ref} in the cache (refs: {have}; "
                                   f"{len(repo.revisions)} snapshots)", fetch, data)
    files = {str(f.file_path.relative_to(rev.snapshot_path)): f.file_path for f in rev.files}
    weights = with_weights[rev.commit_hash]
    size = sum(f.size_on_disk for f in weights)
    data.update(commit=rev.commit_hash, files=len(files), weight_files=len(weights), weights_bytes=size)
    incomplete = list((repo.repo_path / "blobs").glob("*.incomplete"))
    head = f"refs/{ref} -> {rev.commit_hash[:8]}"
    if not weights:
        good = [c[:8] for c, w in with_weights.items() if w]
        fix = (f"snapshot {', '.join(good)} holds weights: point refs/{ref} at it or re-download"
               if good else fetch)
        return WeightsResult(FAIL, f"{repo_id}: {head} holds no weight files ({len(files)} files): "
                                   "an offline launch fails fast", fix, data)
    missing = _index_missing(files)
    if missing:
        return WeightsResult(FAIL, f"{repo_id}: {head} lacks {len(missing)} shard(s) its index names "
                                   f"({', '.join(missing[:3])})", fetch, data)
    if "config.json" not in files:
        return WeightsResult(FAIL, f"{repo_id}: {head} has weights but no config.json", fetch, data)
    saw = f"{head}: {len(files)} files, {len(weights)} weight file{'' if len(weights) == 1 else 's'}, {gib(size)}"
    others = [c for c in empty if c != rev.commit_hash[:8]]
    if others:
        saw += f"; sibling snapshot(s) without weights: {', '.join(others)}"
    if incomplete:
        return WeightsResult(WARN, saw + f"; {len(incomplete)} unfinished download(s) in blobs/",
                             "let the download finish or remove the .incomplete blobs", data)
    action = f"harmless while refs/{ref} stays at {rev.commit_hash[:8]}" if others else ""
    return WeightsResult(OK, saw, action, data)


def check_local(path: Path) -> WeightsResult:
    if is_gguf(path):
        if not path.is_file():
            return WeightsResult(FAIL, f"{path} does not exist", "fix `source`, or run `servedeck init` to find the models on this machine")
        size = path.stat().st_size
        try:
            h = read_header(path)
        except (GGUFError, OSError) as e:
            return WeightsResult(FAIL, f"{path}: {gib(size)}, header unreadable: {e}",
                                 "re-download the file (truncated or not a GGUF)")
        return WeightsResult(OK, f"{path.name}: {gib(size)}, GGUF v{h.version} {h.architecture}, "
                                 f"{h.tensor_count} tensors, {h.arch_key('block_count')} layers",
                             data={"bytes": size, "architecture": h.architecture, "tensors": h.tensor_count})
    if not path.exists():
        return WeightsResult(FAIL, f"{path} does not exist", "fix `source` in models.toml")
    if not path.is_dir():
        return WeightsResult(FAIL, f"{path} is neither a directory nor a .gguf file", "fix `source` in models.toml")
    files = {str(p.relative_to(path)): p for p in path.rglob("*") if p.is_file()}
    weights = [p for n, p in files.items() if is_weight_file(n)]
    size = sum(p.stat().st_size for p in weights)
    cfg = path / "config.json"
    if not weights:
        return WeightsResult(FAIL, f"{path}: no weight files ({len(files)} files)", "put the checkpoint there")
    if not cfg.is_file() and not any(p.suffix == ".gguf" for p in weights):
        return WeightsResult(FAIL, f"{path}: weights but no config.json", "copy the checkpoint's config.json too")
    if cfg.is_file():
        try:
            json.loads(cfg.read_text())
        except ValueError as e:
            return WeightsResult(FAIL, f"{cfg} is not valid JSON: {e}", "restore the checkpoint's config.json")
    missing = _index_missing(files)
    if missing:
        return WeightsResult(FAIL, f"{path}: {len(missing)} shard(s) named by the index are missing "
                                   f"({', '.join(missing[:3])})", "copy the missing shards")
    return WeightsResult(OK, f"{path}: {len(weights)} weight file{'' if len(weights) == 1 else 's'}, {gib(size)}",
                         data={"bytes": size, "weight_files": len(weights)})


def check_source(source: str, env: dict[str, str] | None = None, revision: str | None = None,
                 base: Path | None = None) -> WeightsResult:
    """`source` as the model's entry gives it (already expanded for local paths)."""
    p = Path(source).expanduser()
    if not p.is_absolute() and base is not None and not looks_like_repo_id(source):
        p = base / p
    if p.exists() or source.endswith(".gguf") or not looks_like_repo_id(source):
        return check_local(p)
    return check_hf(source, env, revision)
