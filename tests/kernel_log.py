"""A stand-in for the kernel's journal, for tests that need Xid lines on a machine with no GPU.

The kernel is the one input here that cannot be real: no NVIDIA driver, so no NVRM line is ever
written. `KernelJournal` puts a `journalctl` first on PATH that prints the lines a test adds, in the
JSON form `journalctl -o json` gives (MESSAGE, _BOOT_ID, __REALTIME_TIMESTAMP), and `--list-boots`.
Everything after it is servedeck's real path: `doctor/kernel.py` runs it as it runs the real one, parses
its output, windows it around the crash. The Xid texts a test adds are seed 004's and NVIDIA's formats
(written from documented facts, never captured here).
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

BOOT = "0123456789abcdef0123456789abcdef"  # one boot, this one
SCRIPT = """#!/bin/sh
# stand-in for journalctl in servedeck's tests (tests/kernel_log.py): no GPU here to write Xid lines
for a in "$@"; do
  if [ "$a" = "--list-boots" ]; then cat "{dir}/boots.txt"; exit 0; fi
done
cat "{dir}/kernel.jsonl"
"""


class KernelJournal:
    def __init__(self, folder: Path, monkeypatch=None):
        self.dir = Path(folder)
        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "kernel.jsonl").write_text("")
        (self.dir / "boots.txt").write_text(f" 0 {BOOT} Thu 2026-10-08 09:00:00 UTC—Sat 2026-10-10 23:59:59 UTC\n")
        script = self.dir / "journalctl"
        script.write_text(SCRIPT.format(dir=self.dir))
        script.chmod(script.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
        self.path = f"{self.dir}{os.pathsep}{os.environ.get('PATH', '')}"
        if monkeypatch is not None:
            monkeypatch.setenv("PATH", self.path)  # the CLI subprocesses a test starts inherit it

    def add(self, message: str, at: float, boot: str = BOOT) -> None:
        """One kernel line (without its timestamp and `kernel:` prefix) at epoch `at`."""
        with open(self.dir / "kernel.jsonl", "a") as fh:
            fh.write(json.dumps({"MESSAGE": message, "_BOOT_ID": boot,
                                 "__REALTIME_TIMESTAMP": str(int(at * 1e6))}) + "\n")

    def env(self) -> dict[str, str]:
        return {**os.environ, "PATH": self.path}


def xid(code: int, pid: int | str, name: str, text: str, pci: str = "PCI:0000:01:00") -> str:
    """An NVRM Xid line as the driver writes it (seed 004; NVIDIA's Xid catalogue)."""
    return f"NVRM: Xid ({pci}): {code}, pid={pid}, name={name}, {text}"
