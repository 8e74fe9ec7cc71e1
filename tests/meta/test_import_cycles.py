"""No import cycle between servedeck's modules (issue 21). Every import counts, at the top of a module or
inside a function (an import moved into a function still ties the two modules: it only hides the cycle
until that function runs). `import a.b` is an edge to a.b, `from a import b` to a.b when it is a module,
else to a; relative imports are resolved against the importing module's package."""

from __future__ import annotations

import ast
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, name: str, modules: set[str]) -> set[str]:
    """The servedeck modules that `path` (module `name`) imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            for a in node.names:
                out.add(f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base)
    return {m for m in out if m in modules and m != name}


def import_graph() -> dict[str, set[str]]:
    files = {module_name(p): p for p in sorted((SRC / "servedeck").rglob("*.py"))}
    return {name: imports_of(path, name, set(files)) for name, path in files.items()}


def test_the_graph_sees_an_import_inside_a_function():
    # cli/campaigns.py imports cluster.dispatch inside a function only (Ray is optional)
    assert "servedeck.cluster.dispatch" in import_graph()["servedeck.cli.campaigns"]


def test_relative_imports_resolve_against_the_package(tmp_path):
    (tmp_path / "a.py").write_text("from . import b\nfrom ..c import d\nfrom .e import f\n")
    modules = {"p.s.a", "p.s.b", "p.c", "p.c.d", "p.s.e"}
    assert imports_of(tmp_path / "a.py", "p.s.a", modules) == {"p.s.b", "p.c.d", "p.s.e"}


def test_no_import_cycle_between_modules():
    try:
        TopologicalSorter(import_graph()).prepare()
    except CycleError as e:
        raise AssertionError("import cycle: " + " → ".join(e.args[1])) from None
