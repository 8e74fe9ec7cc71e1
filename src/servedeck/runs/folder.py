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

import errno
import json
import os
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any, BinaryIO, Callable

from servedeck import paths
from servedeck.deck.state import now_iso
from servedeck.errors import DiskFullError, RunError
from servedeck.fsio import FULL, append_jsonl, append_line, atomic_write_json, atomic_write_text, disk_full, unique_dir
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
        self.full: DiskFullError | None = None  # the first write the results disk had no room for

    # --- opening ------------------------------------------------------------------------------
    @classmethod
    def create(cls, root: Path, model: str, layout: str, ctx: int | None, engine: str,
               summary: dict[str, Any]) -> "RunFolder":
        now = datetime.now()
        base = run_name(model, layout, ctx, engine, now)
        try:
            path = unique_dir(root, base)
        except OSError as e:
            if e.errno in FULL:
                raise _run_error(disk_full(root / base, e), "creating the run folder") from None
            raise RunError(f"cannot create a run folder under {root}: {e.strerror}",
                           hint="set [host] results_dir in models.toml or SERVEDECK_RESULTS to a writable place") from None
        doc = {"schema": SUMMARY_SCHEMA, "run": path.name, "status": "running", "reason": None,
               "pid": os.getpid(), "created_at": now_iso(), "finished_at": None, **summary}
        folder = cls(path, doc)
        try:
            folder._reserve()
            folder._write_summary()
        except DiskFullError as e:  # no room even to begin: nothing of the run is left behind
            shutil.rmtree(path, ignore_errors=True)
            raise _run_error(e, "opening the run folder") from None
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
                self._writing(self.path / name, lambda: shutil.copy2(d / name, self.path / name))
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
            self._writing(self.path / "niah.log", lambda: append_line(self.path / "niah.log", line, fsync=False))
        else:
            self._writing(self.path / "niah.log", lambda: append_jsonl(self.path / "niah.log", line, fsync=False))

    def request(self, record: dict[str, Any]) -> None:
        # No fsync per line: at hundreds of requests/s it would steal the event loop's time and
        # show up as schedule lag; the OS still has every line if servedeck itself dies.
        path = self.path / "requests.jsonl"
        self._writing(path, lambda: append_jsonl(path, record, fsync=False))

    def append_jsonl(self, name: str, line: dict[str, Any]) -> None:
        """One line of a per-run log (ramp.jsonl, outputs.jsonl), appended as its work finishes."""
        self._writing(self.path / name, lambda: append_jsonl(self.path / name, line, fsync=False))

    def update(self, **changes: Any) -> None:
        """Merge `changes` into summary.json. On a full disk they are kept for the closing summary (which
        the folder's reserve has room for) and nothing is raised: the lines a run loses raise, its notes do not."""
        self.summary.update(changes)
        if self.full is not None:
            return
        try:
            self._write_summary()
        except DiskFullError as e:
            self._filled(e)

    def finish(self, status: str, reason: str | None = None) -> None:
        """Close the folder: server.log copied, summary.json final. Safe to call more than once. After a
        full disk the run is `failed` saying so, whatever the caller thought of it: its records stop
        where the disk did."""
        if self.summary.get("status") in ("ok", "failed"):
            return
        if self.full is None:
            try:
                self._copy_server_log()
            except DiskFullError as e:
                self._filled(e)
            except OSError as e:  # a missing log must not hide the run's own result
                self.summary["server_log_error"] = str(e)
        self._release()  # the room kept for this closing summary
        if self.full is not None:
            status = "failed"
            reason = f"disk full: {self.full.message}" + (f" ({reason})" if reason and "disk full" not in reason else "")
            self.summary.setdefault("server_log_error", f"not copied: the results disk is full; the whole log "
                                                        f"is {self._log_src}" if self._log_src else "not copied")
        self.summary.update(status=status, reason=reason, finished_at=now_iso())
        try:
            self._write_summary()
        except DiskFullError as e:
            raise _run_error(e, "closing the run") from None

    def write_markdown(self, text: str) -> None:
        self._writing(self.path / "summary.md", lambda: atomic_write_text(self.path / "summary.md", text))

    # --- a full results disk -----------------------------------------------------------------------
    # The folder keeps RESERVE bytes of room from its creation until it closes, so that a disk filled
    # mid-run still takes the closing summary.json that says so: a run is never left "running" by a
    # full disk, and `runs` never blames a servedeck that stopped.
    def _reserve(self) -> None:
        reserve = self.path / RESERVE_NAME
        try:
            fd = os.open(reserve, os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                os.posix_fallocate(fd, 0, RESERVE)
            finally:
                os.close(fd)
        except OSError as e:
            if e.errno in FULL:
                raise disk_full(reserve, e) from None
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL):  # a file system without fallocate: no reserve
                raise

    def _release(self) -> None:
        try:
            (self.path / RESERVE_NAME).unlink()
        except FileNotFoundError:
            pass

    def _writing(self, path: Path, write: Callable[[], Any]) -> Any:
        """`write()`; on a full disk the run stops here: RunError (exit 7) naming the file and the free
        space, every later write refused the same way, the closing summary saying so."""
        closed = self.summary.get("status") in ("ok", "failed")
        if self.full is not None and not closed:
            raise _run_error(self.full, "the run stopped writing")
        try:
            return write()
        except DiskFullError as e:
            self._filled(e)
        except OSError as e:
            if e.errno not in FULL:
                raise
            self._filled(disk_full(path, e))
        if closed:  # summary.md and notes after the close: summary.json has said it all
            return None
        raise _run_error(self.full, "the run stopped writing")  # type: ignore[arg-type]

    def _filled(self, e: DiskFullError) -> None:
        if self.full is None:
            self.full = e
            self.summary["disk_full"] = {"path": e.path, "free_bytes": e.free_bytes, "at": now_iso()}

    # --- internals ------------------------------------------------------------------------------
    def _write_summary(self) -> None:
        atomic_write_json(self.path / "summary.json", self.summary)

    def _copy_server_log(self) -> None:
        src = self._log_src
        if src is None or not src.exists():
            return
        dst = self.path / "server.log"
        size = src.stat().st_size
        try:
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
        except OSError as e:
            if e.errno not in FULL:
                raise
            kept = _cut_to_whole_lines(dst)
            self.summary["server_log_error"] = (f"the results disk filled while copying it: kept the first {kept} "
                                                f"bytes, whole lines only; the whole log is {src}")
            if not kept:
                dst.unlink(missing_ok=True)
            raise disk_full(dst, e) from None

    def _copy_lines(self, fin: BinaryIO, fout: BinaryIO, limit: int | None = None) -> None:
        data = fin.read(limit) if limit is not None else None
        lines = data.splitlines(keepends=True) if data is not None else fin
        for raw in lines:
            fout.write(self.scrub(raw.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape"))


RESERVE_NAME = ".reserve"
RESERVE = 1 << 20  # room for the closing summary.json (a few KB to a few hundred) and summary.md


def _run_error(e: DiskFullError, doing: str) -> RunError:
    return RunError(f"disk full: {e.message} ({doing})",
                    hint=f"free space on the results disk ({e.path and Path(e.path).parent}); every whole line "
                         "written before is kept, and `servedeck show` reads the folder")


def _cut_to_whole_lines(path: Path) -> int:
    """Cut `path` back to its last newline (what a full disk left of a copy); its size after."""
    try:
        with open(path, "rb+") as fh:
            data = fh.read()
            keep = data.rfind(b"\n") + 1
            fh.truncate(keep)
            return keep
    except FileNotFoundError:
        return 0
