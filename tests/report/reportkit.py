"""Helpers shared by the report tests and their conftest (imported by name, as tests/watch does)."""

from __future__ import annotations

import psutil

SEED = 7
CHROME_MARK = "servedeck-report-test-chromium"  # in every user-data-dir the tests give chromium


def chromium_processes() -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            if any(CHROME_MARK in a for a in p.info["cmdline"] or []):
                out.append(p)
        except psutil.Error:
            continue
    return out
