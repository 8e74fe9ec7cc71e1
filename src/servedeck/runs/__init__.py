"""Run folders: written as the work finishes, read back and listed from their files alone.

`runs.read` (the view of a run) is read on first use: it renders each workload kind's figures
(workloads/kinds.py), and the kinds write run folders (runs/folder.py), so loading it with the package
would tie every writer of a run folder to every kind."""

from typing import Any

from servedeck.runs.folder import RunFolder, ctx_label, run_name, runs_root

_READ = ("find_run", "list_runs", "load", "result_label")


def __getattr__(name: str) -> Any:
    if name in _READ:
        from servedeck.runs import read

        return getattr(read, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["RunFolder", "ctx_label", "find_run", "list_runs", "load", "result_label", "run_name", "runs_root"]
