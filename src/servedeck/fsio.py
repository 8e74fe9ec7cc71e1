"""Small file helpers that keep state consistent across crashes: atomic replace, fsynced appends."""

from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Write to a temp file in the same directory, fsync, then rename over the target.

    A reader (or a crash) sees the old file or the new one, never half of one.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # make the rename itself durable
        dfd = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")


def append_jsonl(path: Path, record: dict, fsync: bool = True) -> None:
    """One JSON object per line, appended with O_APPEND so concurrent writers never interleave a line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps(record, default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


def read_jsonl(path: Path) -> list[dict]:
    """Read every complete line; a torn last line (crash mid-write) is skipped, not fatal."""
    out: list[dict] = []
    try:
        with open(path) as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
    except FileNotFoundError:
        pass
    return out


def tail_text(path: Path, lines: int = 40, max_bytes: int = 256 * 1024) -> str:
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(0, size - max_bytes))
            data = fh.read()
    except FileNotFoundError:
        return ""
    text = data.decode("utf-8", "replace")
    return "\n".join(text.splitlines()[-lines:])


@contextmanager
def exclusive(lock_path: Path, what: str, busy: Callable[[dict | None], BaseException],
              wait_s: float = 0.0) -> Iterator[None]:
    """Hold an flock on `lock_path` (released by the kernel if the holder dies) and say who holds it in
    `<lock>.holder` ({pid, what, since}). A second caller gets `busy(holder-or-None)` raised."""
    from datetime import datetime, timezone

    from filelock import FileLock, Timeout

    info_path = Path(lock_path).with_suffix(".holder")
    lock = FileLock(str(lock_path))
    try:
        lock.acquire(timeout=wait_s if wait_s > 0 else 0)
    except Timeout:
        try:
            holder = json.loads(info_path.read_text())
        except (OSError, ValueError):
            holder = None
        raise busy(holder if isinstance(holder, dict) else None) from None
    try:
        since = datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")
        atomic_write_json(info_path, {"pid": os.getpid(), "what": what, "since": since})
        yield
    finally:
        try:
            info_path.unlink()
        except FileNotFoundError:
            pass
        lock.release()
