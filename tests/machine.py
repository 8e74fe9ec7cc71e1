"""A user's machine laid out in a folder, for `servedeck init` to find (tests/discover/test_init_discovery.py,
and tests/setup/test_packaging.py from the wheel): the real llama-server on PATH, the real SmolLM2 GGUF in a
folder, its Hugging Face snapshot in a cache laid out as huggingface_hub lays it, an Ollama manifest and blob
and an LM Studio folder holding the same GGUF. Real files (links to set-up's cache), never imitations."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
REPO = "HuggingFaceTB/SmolLM2-135M-Instruct"


def link(src: Path, dst: Path) -> Path:
    """A second name for the same bytes (a file of its own for discovery, no 500 MB copy)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
    return dst


def bare_env(tmp: Path, path: str) -> dict[str, str]:
    """An environment that sees only what the test lays out: its own HOME, caches and PATH."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("HF_", "HUGGINGFACE_", "OLLAMA_", "XDG_", "SERVEDECK_CONFIG"))}
    (tmp / "home").mkdir(exist_ok=True)
    (tmp / "cache").mkdir(exist_ok=True)
    env.update(HOME=str(tmp / "home"), HF_HOME=str(tmp / "hf"), SERVEDECK_CACHE=str(tmp / "cache"), PATH=path)
    return env


def lay_out_machine(tmp: Path, loc: dict[str, str]) -> dict[str, Path]:
    gguf = Path(loc["smollm2_gguf"])
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "llama-server").symlink_to(loc["llama_server"])
    folder_gguf = tmp / "gguf" / GGUF_NAME
    folder_gguf.parent.mkdir()
    folder_gguf.symlink_to(gguf)

    # The Hugging Face cache as huggingface_hub writes it: blobs named by hash, snapshots/<rev>/ of
    # relative links to them, refs/main naming the revision.
    repo_dir = tmp / "hf" / "hub" / f"models--{REPO.replace('/', '--')}"
    rev = "0123456789abcdef0123456789abcdef01234567"
    snap = repo_dir / "snapshots" / rev
    snap.mkdir(parents=True)
    for f in sorted(Path(loc["smollm2_hf"]).iterdir()):
        if f.name.startswith("."):
            continue
        digest = hashlib.sha256(f.name.encode() + str(f.stat().st_size).encode()).hexdigest()
        link(f, repo_dir / "blobs" / digest)
        (snap / f.name).symlink_to(Path("../../blobs") / digest)
    (repo_dir / "refs").mkdir()
    (repo_dir / "refs" / "main").write_text(rev)

    # Ollama's store: a manifest per model:tag naming its layers; the model layer is the GGUF blob.
    store = tmp / "home" / ".ollama" / "models"
    digest = "sha256:" + "ab" * 32
    blob = link(gguf, store / "blobs" / digest.replace(":", "-"))
    manifest = store / "manifests" / "registry.ollama.ai" / "library" / "smollm2" / "135m"
    manifest.parent.mkdir(parents=True)
    manifest.write_text(json.dumps({"schemaVersion": 2, "layers": [
        {"mediaType": "application/vnd.ollama.image.model", "digest": digest, "size": blob.stat().st_size},
        {"mediaType": "application/vnd.ollama.image.template", "digest": "sha256:" + "cd" * 32, "size": 10}]}))
    lms = link(gguf, tmp / "home" / ".lmstudio" / "models" / "bartowski" / "SmolLM2-GGUF" / "smollm2-lms.Q4_1.gguf")
    return {"bin": bin_dir, "gguf_dir": folder_gguf.parent, "gguf": folder_gguf, "snapshot": snap,
            "ollama_blob": blob, "lmstudio": lms}


def free_ports(text: str) -> str:
    from ports import free_port

    return re.sub(r"^port = \d+$", lambda m: f"port = {free_port()}", text, flags=re.M)
