"""The door's modules import one way (issue 21): no cycle among them, counting every import a module
makes (at its top, inside functions, under TYPE_CHECKING), and no aiohttp: the front answers every
route itself."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import servedeck.door

DOOR = Path(servedeck.door.__file__).parent


def door_imports() -> dict[str, set[str]]:
    """door module name → the door modules it imports anywhere in its text."""
    mods = {p.stem for p in DOOR.glob("*.py") if p.stem != "__init__"}
    graph: dict[str, set[str]] = {}
    for m in mods:
        found: set[str] = set()
        for node in ast.walk(ast.parse((DOOR / f"{m}.py").read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                if node.module == "servedeck.door":
                    found.update(a.name for a in node.names if a.name in mods)
                elif node.module.startswith("servedeck.door."):
                    found.add(node.module.split(".")[2])
            elif isinstance(node, ast.Import):
                found.update(a.name.split(".")[2] for a in node.names if a.name.startswith("servedeck.door."))
        graph[m] = found - {m}
    return graph


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done

    def walk(m: str, path: list[str]) -> list[str] | None:
        state[m] = 1
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return path[path.index(n):] + [m, n] if n in path else [m, n]
            if n not in state and (found := walk(n, path + [m])):
                return found
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := walk(m, [])):
            return found
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert cycle_in({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_no_door_module_imports_one_that_imports_it_back():
    graph = door_imports()
    assert {"front", "server", "page", "policy"} <= set(graph)  # the walk saw the door's modules
    assert cycle_in(graph) is None, f"import cycle among door/: {' -> '.join(cycle_in(graph) or [])}"


def test_the_door_runs_without_aiohttp():
    code = "import sys, servedeck.door.serve; print('aiohttp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
