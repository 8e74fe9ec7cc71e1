"""`servedeck gpu --watch`: the telemetry sampler's GPU lines, live (telemetry/live.py). --json prints
each line as telemetry.jsonl holds it; otherwise one table, redrawn each round."""

from __future__ import annotations

import itertools
import json
import sys
from typing import Any, Optional

from rich.live import Live
from rich.table import Table

from servedeck.cli.app import console
from servedeck.errors import ServedeckError, UsageError
from servedeck.gpu.nvml import gib
from servedeck.telemetry.live import samples
from servedeck.telemetry.nvml_source import GpuUnavailable


class NoGpu(ServedeckError):
    """No GPU can be sampled here (the message says why)."""


def _table(rows: dict[int, dict[str, Any]], xids: list[dict[str, Any]]) -> Table:
    t = Table(title="GPUs, sampled as a run's telemetry samples them")
    for col in ("GPU", "power", "limit", "share", "energy", "used", "SM util", "SM clock", "held by"):
        t.add_column(col, justify="left" if col == "held by" else "right")

    def w(v: Optional[float]) -> str:
        return "—" if v is None else f"{v:.0f} W"

    for g, ln in sorted(rows.items()):
        p, lim = ln.get("power_w"), ln.get("limit_w")
        t.add_row(str(g), w(p), w(lim), f"{p / lim:.0%}" if p is not None and lim else "—",
                  "—" if ln.get("energy_j") is None else f"{ln['energy_j'] / 3.6e6:.3f} kWh",
                  gib(ln.get("mem_used")) if ln.get("mem_used") is not None else "—",
                  "—" if ln.get("sm_util_pct") is None else f"{ln['sm_util_pct']}%",
                  "—" if ln.get("sm_clock_mhz") is None else f"{ln['sm_clock_mhz']} MHz",
                  ", ".join(ln.get("throttle") or []) or "—")
    if xids:
        t.caption = "Xid events: " + ", ".join(f"GPU {x.get('gpu')} Xid {x.get('xid')}" for x in xids)
    return t


def watch_gpus(interval_s: float, count: Optional[int], as_json: bool) -> None:
    if interval_s < 0.05:
        raise UsageError(f"--interval {interval_s:g} s is below NVML's useful rate", hint="use 0.05s or more")
    rows: dict[int, dict[str, Any]] = {}
    xids: list[dict[str, Any]] = []
    lines = samples(interval_s, count)
    try:
        first = next(lines)  # opens the GPUs: no GPU here raises before anything is drawn
    except GpuUnavailable as e:
        raise NoGpu(f"no GPU to watch: {e}", hint="`servedeck doctor` says what the driver reports") from None
    except StopIteration:
        return
    try:
        if as_json:
            for ln in itertools.chain([first], lines):
                sys.stdout.write(json.dumps(ln) + "\n")
                sys.stdout.flush()
            return
        with Live(_table(rows, xids), console=console, auto_refresh=False) as live:
            for ln in itertools.chain([first], lines):
                if ln["kind"] == "xid":
                    xids.append(ln)
                else:
                    rows[ln["gpu"]] = ln
                live.update(_table(rows, xids), refresh=True)
    except KeyboardInterrupt:
        return
    finally:
        lines.close()
