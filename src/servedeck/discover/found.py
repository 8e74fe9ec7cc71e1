"""What discovery finds, and the roots it looks in: the types the finders (engines.py, models.py) fill and
servedeck.discover returns. Their own module so that the finders need not import the package that imports
them (tests/meta/test_import_cycles.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class Engine:
    """An engine install, as [builds.NAME] holds it."""

    engine: str  # a registered engine: llamacpp, vllm, sglang
    kind: str  # binary | python | image (Build's keys)
    where: str  # the executable, the interpreter, or the image reference
    found: str  # how: "--llama-server", "on PATH", "servedeck's cache", "docker images", ...
    version: str = ""
    docker: str = ""  # the container client that holds the image
    serves: tuple[str, ...] = ()  # the architectures it names (vLLM's model registry); empty: not known


@dataclass(frozen=True)
class Model:
    """A model's weights on disk, as [models.NAME] source holds them."""

    source: str  # a .gguf file or a folder in Hugging Face layout (config.json beside the weights)
    format: str  # gguf | hf
    name: str  # a suggested name for models.toml
    found: str  # "Hugging Face cache", "Ollama", "LM Studio", "--models-dir DIR", "servedeck's cache"
    architecture: str = ""
    context: int | None = None  # what the model was trained for (config.json or the GGUF header)
    embeddings: bool = False
    repo_id: str = ""  # a Hugging Face repo id, when the cache says it


@dataclass(frozen=True)
class LeftOut:
    what: str
    why: str


@dataclass(frozen=True)
class Roots:
    """Where to look besides the usual places (PATH, this interpreter, the caches of Hugging Face, Ollama and
    LM Studio). `cache` is servedeck's own: engines `servedeck install` builds and the repository's models."""

    home: Path
    cache: Path
    llama_servers: tuple[Path, ...] = ()  # --llama-server
    vllm_pythons: tuple[Path, ...] = ()  # --vllm-python
    models_dirs: tuple[Path, ...] = ()  # --models-dir
    images: bool = True  # ask docker/podman for the images already pulled


@dataclass
class Found:
    engines: list[Engine] = field(default_factory=list)
    models: list[Model] = field(default_factory=list)
    left_out: list[LeftOut] = field(default_factory=list)
