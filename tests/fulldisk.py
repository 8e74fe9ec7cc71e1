"""A small file system of its own for a test that fills a disk (issue 36 items 7 and 8): a tmpfs of a few
MiB mounted over a folder of the test's tmp_path, so that filling it is felt by that test alone, never by
the machine's /tmp that other test runs share. Mounting needs root (the CI and dev machines run the
tests as root); a test that cannot mount is skipped, saying why.

    with small_disk(tmp_path / "home", mib=96) as disk:
        ...                      # $SERVEDECK_HOME (or the results) on it
        disk.fill(leave=40_000)  # one file takes all but 40 KB (posix_fallocate: at once, not by a loop)
        disk.free_space()        # and back
"""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

import pytest


class SmallDisk:
    def __init__(self, path: Path):
        self.path = path
        self.filler = path / ".filler"

    def free(self) -> int:
        return shutil.disk_usage(self.path).free

    def fill(self, leave: int = 0) -> None:
        """Take all but about `leave` bytes (to within a page), in a few allocations: what is free moves
        while an engine writes its log, so each asks for what is free now, halving when refused."""
        fd = os.open(self.filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            want = self.free() - leave
            while want >= 4096:
                try:
                    os.posix_fallocate(fd, os.fstat(fd).st_size, want)
                    want = self.free() - leave
                except OSError as e:
                    if e.errno != errno.ENOSPC:
                        raise
                    want //= 2
            if not leave:  # the last page or so, byte runs at a time, until the disk says no
                os.lseek(fd, 0, os.SEEK_END)
                chunk = b"\0" * 512
                while True:
                    try:
                        if os.write(fd, chunk) < len(chunk):
                            break
                    except OSError as e:
                        if e.errno != errno.ENOSPC:
                            raise
                        break
        finally:
            os.close(fd)

    def free_space(self) -> None:
        self.filler.unlink(missing_ok=True)


@contextmanager
def small_disk(path: Path, mib: int, before_unmount: Callable[[], None] = lambda: None) -> Iterator[SmallDisk]:
    """Mount a `mib` MiB tmpfs on `path` (created if missing, which must be empty); unmount it at the end,
    after `before_unmount` (stop what runs from it: an engine's log is open there)."""
    if os.geteuid() != 0:
        pytest.skip("a full-disk test mounts a small tmpfs, which needs root")
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={mib}m,mode=0755", "tmpfs", str(path)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {r.stderr.strip()}")
    disk = SmallDisk(path)
    try:
        yield disk
    finally:
        try:
            disk.free_space()
            before_unmount()
        finally:
            if subprocess.run(["umount", str(path)], capture_output=True).returncode != 0:
                subprocess.run(["umount", "-l", str(path)], capture_output=True)  # something still holds a file
