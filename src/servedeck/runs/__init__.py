"""Run folders: written as the work finishes, read back and listed from their files alone."""

from servedeck.runs.folder import RunFolder, ctx_label, run_name, runs_root
from servedeck.runs.read import find_run, list_runs, load, result_label

__all__ = ["RunFolder", "ctx_label", "find_run", "list_runs", "load", "result_label", "run_name", "runs_root"]
