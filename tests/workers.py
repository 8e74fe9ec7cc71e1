"""The suite's two workers (`bash scripts/test.sh`, by default: pytest-xdist, a process per core):
which tests share a worker, and what environment a worker gives the engines and CLI runs it starts."""

from __future__ import annotations

import ast
import os
from pathlib import Path

from servedeck.testing.ports import worker_index  # one reading of xdist's worker name, shared with the ports

TESTS = Path(__file__).parent


def as_a_worker(env) -> None:
    """A worker's environment, which its engines and CLI runs inherit. Each engine keeps to its share of the
    cores unless its models.toml says otherwise.
    Left alone, every llama-server runs one thread per core and spins at its barriers while another worker's
    engine holds a core, and every vLLM binds its OpenMP thread to core 0: a two-worker run at those defaults
    took longer than one worker (2026-12-04, killed at 72% after 33 min)."""
    n = worker_index(env)
    if n is None:
        return
    # A worker starts with COLUMNS=80 and LINES=24 in its environment, which a one-process run does not have:
    # the CLI's console reads them once, at import, and a test's own COLUMNS would then be ignored.
    for name in ("COLUMNS", "LINES"):
        env.pop(name, None)
    env.setdefault("LLAMA_ARG_THREADS", "1")  # llama-server's own variable for --threads; a flag in args wins
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(n % (os.cpu_count() or 1)))


# A group of tests runs whole on one worker, so its fixtures are set up once. Each test file is a group (its
# module fixtures: a door, a matrix's launches, a Ray cluster), and so is each directory whose conftest.py
# holds session fixtures (the report's five launches, the capacity campaign). This directory's own session
# fixtures, the shared servers (tests/shared_servers.py), are the exception: each worker boots its own, which
# costs less than keeping every test that reads them on one worker.
# Hand-written rather than xdist's `--dist loadgroup`: that one renames the node ids through an attribute that
# pytest 9 no longer reads, so its groups are ignored and a file's tests run on both workers.


def session_fixture_dirs(root: Path = TESTS) -> tuple[str, ...]:
    """Directories below `root` whose conftest.py defines a session-scoped fixture, as node-id prefixes."""
    found = []
    for conftest in sorted(root.rglob("conftest.py")):
        if conftest.parent == root:
            continue
        for node in ast.walk(ast.parse(conftest.read_text())):
            if isinstance(node, ast.keyword) and node.arg == "scope" and getattr(node.value, "value", None) == "session":
                found.append(conftest.parent.relative_to(root.parent).as_posix() + "/")
                break
    return tuple(found)


def group_of(nodeid: str, dirs: tuple[str, ...]) -> str:
    path = nodeid.split("::")[0]
    return next((d for d in dirs if path.startswith(d)), path)


def by_group(config, log):
    """xdist's scheduler for the groups above (tests/conftest.py's pytest_xdist_make_scheduler)."""
    from xdist.scheduler import LoadScopeScheduling

    dirs = session_fixture_dirs()

    class ByGroup(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid, dirs)

    return ByGroup(config, log)
