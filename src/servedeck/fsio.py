"""Small file helpers that keep state consistent across crashes: atomic replace, fsynced appends of
whole lines. A full disk (ENOSPC, EDQUOT) is a DiskFullError naming the file and the free space."""

from __future__ import annotations

import errno
import json
import os
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator

if TYPE_CHECKING:
    from servedeck.errors import DiskFullError


FULL = (errno.ENOSPC, errno.EDQUOT)


def free_bytes(path: Path) -> int | None:
    """What the file system holding `path` (or its nearest existing folder) has free; None if unknown."""
    p = Path(path)
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        return shutil.disk_usage(p).free
    except OSError:
        return None


def human(n: int | None) -> str:
    if n is None:
        return "an unknown amount"
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} bytes"


def disk_full(path: Path, err: OSError | None = None) -> DiskFullError:
    """The error for a write to `path` that found no room."""
    from servedeck.errors import DiskFullError


    free = free_bytes(path)
    # the kernel's words (what a user searches for), then what its file system has left
    why = os.strerror(err.errno if err is not None else errno.ENOSPC)
    return DiskFullError(f"cannot write {path}: {why} ({human(free)} free)",
                         hint=f"free space on the disk that holds {Path(path).parent}; `servedeck stop` works meanwhile",
                         path=str(path), free_bytes=free)


def atomic_write_text(path: Path, text: str, mode: int = 0o644) -> None:
    """Write to a temp file in the same directory, fsync, then rename over the target.

    A reader (or a crash) sees the old file or the new one, never half of one.
    """
    atomic_write_bytes(path, text.encode(), mode)


def atomic_write_bytes(path: Path, data: bytes, mode: int = 0o644) -> None:
    """atomic_write_text for bytes (the temp file is `.NAME.XXXX` beside the target)."""
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as e:
        if e.errno in FULL:
            raise disk_full(path, e) from None
        raise
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError) and e.errno in FULL:  # the old file is still whole
            raise disk_full(path, e) from None
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
    """One JSON object per line, appended with O_APPEND so concurrent writers never interleave a line.
    Whole lines only: a line the disk has no room for is cut back off (DiskFullError), never left half."""
    append_line(path, json.dumps(record, default=str), fsync)


def append_line(path: Path, text: str, fsync: bool = True) -> None:
    """One line of text appended whole, as `append_jsonl` appends its lines."""
    path = Path(path)
    line = (text.rstrip("\n") + "\n").encode()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    except OSError as e:
        if e.errno in FULL:
            raise disk_full(path, e) from None
        raise
    try:
        start = os.fstat(fd).st_size
        try:
            written = os.write(fd, line)
        except OSError as e:
            if e.errno not in FULL:
                raise
            written = -1
        if written != len(line):  # ENOSPC mid-line, or a short write: take back what part of it went in
            if written > 0 and os.fstat(fd).st_size == start + written:  # nobody appended after it
                os.ftruncate(fd, start)
            raise disk_full(path)
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)


class JsonlRows(list):
    """The rows of a JSON-lines file, plus what could not be read.

    `torn` is 1 when the last line is cut short (no newline and not JSON: a crash mid-append, which
    `append_jsonl` makes the only expected damage); it is counted but needs no warning. `skipped` counts
    every other line that is not a JSON object: those are damage, and a reader must say so (`warning`).
    """

    def __init__(self, rows: list[dict] | None = None, skipped: int = 0, torn: int = 0,
                 first_error: str | None = None):
        super().__init__(rows or [])
        self.skipped = skipped
        self.torn = torn
        self.first_error = first_error

    def keep(self, pred: Callable[[dict], bool]) -> "JsonlRows":
        """The rows that pass `pred`, with the counts of what could not be read carried along."""
        return JsonlRows([r for r in self if pred(r)], self.skipped, self.torn, self.first_error)

    def warning(self, path: Path | str) -> str | None:
        """One sentence for the user when lines were lost, else None."""
        if not self.skipped:
            return None
        return (f"{path}: {self.skipped} line(s) could not be read and are left out "
                f"(first: {self.first_error}); the file is damaged or was written by something else")


def read_jsonl(path: Path, check: Callable[[dict], str | None] | None = None) -> JsonlRows:
    """Every line that is a JSON object. A torn last line is skipped and counted in `.torn`; any other
    unreadable line is skipped and counted in `.skipped`, which callers report. `check`: what a row of
    this file needs; a row it finds a problem with (returned as a sentence) is skipped and counted too."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read()
    except FileNotFoundError:
        return JsonlRows()
    lines = raw.split(b"\n")
    complete, tail = lines[:-1], lines[-1]  # tail: b"" when the file ends in a newline
    out = JsonlRows()

    def parse(line: bytes, number: int) -> tuple[dict | None, str | None, bool]:
        """(row, None, True), or (None, why, whether the line was a whole JSON object)."""
        try:
            rec = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return None, f"line {number}: {e}", False
        if not isinstance(rec, dict):
            return None, f"line {number}: not a JSON object", False
        problem = check(rec) if check else None
        return (None, f"line {number}: {problem}", True) if problem else (rec, None, True)

    for i, line in enumerate(complete, 1):
        if not line.strip():
            continue
        rec, err, _ = parse(line, i)
        if rec is None:
            out.skipped += 1
            out.first_error = out.first_error or err
        else:
            out.append(rec)
    if tail.strip():
        rec, err, whole = parse(tail, len(complete) + 1)
        if rec is not None:
            out.append(rec)
        elif whole:  # a whole object this file's rows must not be: damage, not a cut
            out.skipped += 1
            out.first_error = out.first_error or err
        else:
            out.torn = 1
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


def head_and_tail(path: Path, max_bytes: int, head_bytes: int) -> tuple[str, int]:
    """A text file whole when it is at most `max_bytes`; else its first `head_bytes` and its last
    `max_bytes - head_bytes`, cut at line ends, with one line saying how much was left out between them.
    Returns (text, bytes left out); ("", 0) when the file does not exist."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(0)
            if size <= max_bytes:
                return fh.read().decode("utf-8", "replace"), 0
            head = fh.read(head_bytes)
            fh.seek(size - (max_bytes - head_bytes))
            tail = fh.read()
    except FileNotFoundError:
        return "", 0
    head = head[: head.rfind(b"\n") + 1] or head  # whole lines only, on both sides of the gap
    cut = tail.find(b"\n")
    tail = tail[cut + 1:] if cut >= 0 else tail
    skipped = size - len(head) - len(tail)
    gap = f"[servedeck: {skipped:,} bytes of this log left out here]\n".encode()
    return (head + gap + tail).decode("utf-8", "replace"), skipped


def unique_dir(root: Path, base: str) -> Path:
    """Create and return root/base, or root/base-2, -3, … when that name is taken (two in the same second).
    Raises OSError when root cannot be written."""
    root.mkdir(parents=True, exist_ok=True)
    path, n = root / base, 1
    while True:
        try:
            path.mkdir()
            return path
        except FileExistsError:
            n += 1
            path = root / f"{base}-{n}"


@contextmanager
def exclusive(lock_path: Path, what: str, busy: Callable[[dict | None], BaseException],
              wait_s: float = 0.0, patience: Callable[[dict | None], float] | None = None) -> Iterator[None]:
    """Hold an flock on `lock_path` (released by the kernel if the holder dies) and say who holds it in
    `<lock>.holder` ({pid, what, since}). A second caller gets `busy(holder-or-None)` raised, after `wait_s`,
    and then after `patience(holder)` seconds more where that holder is worth waiting through (a short job)."""
    from filelock import FileLock, Timeout

    info_path = holder_path(lock_path)
    lock = FileLock(str(lock_path))

    def acquired(timeout: float) -> bool:
        try:
            lock.acquire(timeout=max(timeout, 0.0))
        except Timeout:
            return False
        return True

    if not acquired(wait_s):
        holder = read_holder(lock_path)
        more = patience(holder) if patience else 0.0
        if more <= 0 or not acquired(more):
            raise busy(read_holder(lock_path) or holder)
    try:
        say_holder(lock_path, what)
        yield
    finally:
        try:
            info_path.unlink()
        except FileNotFoundError:
            pass
        lock.release()


def holder_path(lock_path: Path) -> Path:
    return Path(lock_path).with_suffix(".holder")


def read_holder(lock_path: Path) -> dict | None:
    """Who holds `lock_path`, as its holder wrote it ({pid, what, since}); None when nobody said."""
    try:
        holder = json.loads(holder_path(lock_path).read_text())
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) else None


def say_holder(lock_path: Path, what: str) -> None:
    """The holder of `lock_path` (this process) says it does `what`: a second caller is told that (at the hold's
    start, and again when the work changes). Advice for a second caller only: a full disk must not make the
    lock itself fail, and leaves the old words or none."""
    from datetime import datetime, timezone

    from servedeck.errors import ServedeckError

    since = datetime.now(timezone.utc).astimezone().isoformat(timespec="seconds")
    try:
        atomic_write_json(holder_path(lock_path), {"pid": os.getpid(), "what": what, "since": since})
    except (OSError, ServedeckError):
        pass
