"""What `servedeck --version` says: servedeck's version, the Python running it, and the engines this machine
has without a models.toml (a llama-server on PATH; vLLM or SGLang importable by this Python).

Read without starting anything heavy: a package's version comes from its metadata (importing vLLM takes
seconds), and llama-server is asked for its own `--version` with a short time limit."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shutil
import subprocess
import sys
from typing import Optional

from servedeck import __version__

LLAMA_VERSION_TIMEOUT_S = 5.0


def _llama_server_version(exe: str) -> Optional[str]:
    """llama-server's own `--version` line ("version: 7000 (1a2b3c4)"), or None when it cannot say."""
    try:
        done = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=LLAMA_VERSION_TIMEOUT_S,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    for line in (done.stdout + done.stderr).splitlines():
        if line.startswith("version:"):
            return line.split(":", 1)[1].strip()
    return None


def _python_package(name: str) -> Optional[str]:
    """The version of `name` when this Python can import it, else None."""
    if importlib.util.find_spec(name) is None:
        return None
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "version unknown"


def engines_found() -> list[str]:
    """One line per engine found: what it is and where."""
    found = []
    exe = shutil.which("llama-server")
    if exe:
        v = _llama_server_version(exe)
        found.append(f"llama.cpp: {exe}" + (f" (version {v})" if v else ""))
    for name, label in (("vllm", "vLLM"), ("sglang", "SGLang")):
        v = _python_package(name)
        if v:
            found.append(f"{label} {v}: importable by this Python")
    return found


def version_text() -> str:
    lines = [f"servedeck {__version__}", f"Python {sys.version.split()[0]} ({sys.executable})"]
    engines = engines_found()
    if engines:
        lines += ["engines:"] + [f"  {e}" for e in engines]
    else:
        lines.append("engines: none found (no llama-server on PATH; neither vLLM nor SGLang importable by this "
                     "Python): put llama.cpp's llama-server on PATH, or `pip install vllm` into this Python's environment")
    return "\n".join(lines)
