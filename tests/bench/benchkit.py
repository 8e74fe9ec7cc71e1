"""What the bench tests share: a models.toml with one llama.cpp entry of two replicas, each on a core of its own."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))  # the bench's modules import each other by name, as the scripts run


def pair_toml(engines: dict[str, str], port: int, context: int = 1024) -> str:
    return f"""
[builds.llamacpp]
engine = "llamacpp"
binary = "{engines['llama_server']}"

[models.smol]
source = "{engines['smollm2_gguf']}"
build = "llamacpp"
port = {port}
replicas = 2
cpus = [[0], [1]]
context = {context}
args = {{ parallel = 2, threads = 1, threads-batch = 1 }}
"""
