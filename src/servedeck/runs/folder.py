"""A run folder, written as the work finishes, so that whatever stops a run leaves its evidence.

    results/runs/<model>__<layout>__<ctx>__<engine>__<MMDD-HHMMSS>/
        cmd.sh          the launch, as the deck wrote it (shell-quoted, secrets redacted)
        boot.json       facts parsed from the boot log
        server.log      the engine's output (the whole launch log, or boot + the slice since the run began),
                        secrets redacted
        niah.log        one JSON line per gate probe, then `GATE niah score= S` (the seed's format)
        requests.jsonl  one line per request, appended the moment it finishes
        summary.json    what ran, where, with what, and the figures; status running | ok | failed
        summary.md      the same for a person (rendered from the files above)

States of a folder (summary.json "status"): running (opened; `pid` is the servedeck process
writing it) → ok | failed (with `reason`). Only RunFolder moves it; `finish` is idempotent. A folder
whose writer is gone (a Ray node lost mid-run; its files were sent to the head) is closed by
`RunFolder.open(path).finish(...)` in the process that holds the copy.
"""

from __future__ import annotations

import json
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, Callable

from servedeck import paths
from servedeck.deck.state import now_iso
from servedeck.errors import RunError
from servedeck.fsio import append_jsonl, atomic_write_json, atomic_write_text, unique_dir
from servedeck.redact import redact_text

SUMMARY_SCHEMA = 1
FULL_LOG_MAX = 32 * 2**20  # copy a launch log whole up to this size
HEAD_BYTES = 2**20  # otherwise its first MiB (the boot) plus the run's slice


def runs_root(configured: str | None) -> Path:
    """Run folders live in <results>/runs; results = $SERVEDECK_RESULTS, [host] results_dir, ./results."""
    return paths.results_dir(configured) / "runs"


def ctx_label(ctx: int | None) -> str:
    """262144 → 256k, 1048576 → 1m, 2000 → 2000 (as the seed names its folders)."""
    if not ctx:
        return "ctx"
    if ctx % 2**20 == 0:
        return f"{ctx // 2**20}m"
    if ctx % 1024 == 0:
        return f"{ctx // 1024}k"
    return str(ctx)


def run_name(model: str, layout: str, ctx: int | None, engine: str, when: datetime) -> str:
    # one folder below runs/: the model's and the layout's names are checked as models.toml checks names
    return (f"{paths.component(model)}__{paths.component(layout, 'layout')}__{ctx_label(ctx)}__{engine}__"
            f"{when.strftime('%m%d-%H%M%S')}")


class RunFolder:
    def __init__(self, path: Path, summary: dict[str, Any]):
        self.path = path
        self.summary = summary
        self._log_src: Path | None = None
        self._log_offset = 0
        self._log_whole = False
        # server.log is the engine's own output, which may echo its argv (vLLM prints its non-default
        # args): every line passes through this before it reaches the run folder.
        self.scrub: Callable[[str], str] = redact_text

    # --- opening ------------------------------------------------------------------------------
    @classmethod
    def create(cls, root: Path, model: str, layout: str, ctx: int | None, engine: str,
               summary: dict[str, Any]) -> "RunFolder":
        now = datetime.now()
        base = run_name(model, layout, ctx, engine, now)
        try:
            path = unique_dir(root, base)
        except OSError as e:
            raise RunError(f"cannot create a run folder under {root}: {e.strerror}",
                           hint="set [host] results_dir in models.toml or SERVEDECK_RESULTS to a writable place") from None
        doc = {"schema": SUMMARY_SCHEMA, "run": path.name, "status": "running", "reason": None,
               "pid": os.getpid(), "created_at": now_iso(), "finished_at": None, **summary}
        folder = cls(path, doc)
        folder._write_summary()
        return folder

    @classmethod
    def open(cls, path: Path) -> "RunFolder | None":
        """A folder written before, to close it from here; None when it has no readable summary.json."""
        try:
            summary = json.loads((path / "summary.json").read_text())
        except (OSError, ValueError):
            return None
        return cls(path, summary) if isinstance(summary, dict) else None

    def attach_launch(self, launch_dir: str | None, whole_log: bool) -> None:
        """Copy the launch's cmd.sh and boot.json now; remember where its log stands for server.log."""
        if not launch_dir:
            return
        d = Path(launch_dir)
        for name in ("cmd.sh", "boot.json"):
            if (d / name).exists():
                shutil.copy2(d / name, self.path / name)
        self._log_src = d / "engine.log"
        self._log_whole = whole_log
        try:
            self._log_offset = self._log_src.stat().st_size
        except OSError:
            self._log_offset = 0
        self.update(server_log={"source": str(self._log_src), "run_starts_at_byte": self._log_offset,
                                "whole": whole_log})

    # --- as work finishes -----------------------------------------------------------------------
    def niah(self, line: dict[str, Any] | str) -> None:
        if isinstance(line, str):
            with open(self.path / "niah.log", "a") as fh:
                fh.write(line.rstrip("\n") + "\n")
        else:
            append_jsonl(self.path / "niah.log", line, fsync=False)

    def request(self, record: dict[str, Any]) -> None:
        # No fsync per line: at hundreds of requests/s it would steal the event loop's time and
        # show up as schedule lag; the OS still has every line if servedeck itself dies.
        append_jsonl(self.path / "requests.jsonl", record, fsync=False)

    def append_jsonl(self, name: str, line: dict[str, Any]) -> None:
        """One line of a per-run log (ramp.jsonl, outputs.jsonl), appended as its work finishes."""
        append_jsonl(self.path / name, line, fsync=False)

    def update(self, **changes: Any) -> None:
        self.summary.update(changes)
        self._write_summary()

    def finish(self, status: str, reason: str | None = None) -> None:
        """Close the folder: server.log copied, summary.json final. Safe to call more than once."""
        if self.summary.get("status") in ("ok", "failed"):
            return
        try:
            self._copy_server_log()
        except OSError as e:  # a missing log must not hide the run's own result
            self.summary["server_log_error"] = str(e)
        self.summary.update(status=status, reason=reason, finished_at=now_iso())
        self._write_summary()

    def write_markdown(self, text: str) -> None:
        atomic_write_text(self.path / "summary.md", text)

    # --- internals ------------------------------------------------------------------------------
    def _write_summary(self) -> None:
        atomic_write_json(self.path / "summary.json", self.summary)

    def _copy_server_log(self) -> None:
        src = self._log_src
        if src is None or not src.exists():
            return
        dst = self.path / "server.log"
        size = src.stat().st_size
        with open(src, "rb") as fin, open(dst, "wb") as fout:
            if self._log_whole or size <= FULL_LOG_MAX:
                self._copy_lines(fin, fout)
                return
            self._copy_lines(fin, fout, limit=min(HEAD_BYTES, self._log_offset))
            skipped = max(0, self._log_offset - HEAD_BYTES)
            if skipped:
                fout.write(f"\n[servedeck: {skipped} bytes of the launch log skipped; the run starts here]\n".encode())
            fin.seek(self._log_offset)
            self._copy_lines(fin, fout)

    def _copy_lines(self, fin: BinaryIO, fout: BinaryIO, limit: int | None = None) -> None:
        data = fin.read(limit) if limit is not None else None
        lines = data.splitlines(keepends=True) if data is not None else fin
        for raw in lines:
            fout.write(self.scrub(raw.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape"))
