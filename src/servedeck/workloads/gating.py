"""One gate of any kind (gates/kinds.py) run into a run folder, and a gate cited from an earlier run.

    run_gate_into   its summary.json entry (gates/kinds.py) running → passed | failed (with the result and wall_s), one
                    sample line per question or probe appended to the gate's file as it is scored
    cite_gate       a later run on the same launch records that gate as its own: the entry, with `source`
                    the gate's run folder (and, for the needle, a copy of niah.log)

The same steps for every kind: the needle a bench runs first, `servedeck gate` (needle or --eval), and a
campaign cell's gates.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from time import perf_counter
from typing import Any, Callable, Optional

from servedeck.workloads.target import Target
from servedeck.errors import RunError, ServerDied
from servedeck.gates.kinds import KINDS, Gate, entry, records, stored
from servedeck.runs.folder import RunFolder
from servedeck.runs.read import summary_of


def _set(folder: RunFolder, name: str, rec: dict[str, Any]) -> None:
    folder.update(**stored(folder.summary, name, rec))


async def run_gate_into(folder: RunFolder, target: Target, gate: Gate,
                        on_sample: Optional[Callable[[dict[str, Any]], None]] = None) -> dict[str, Any]:
    """Ask every question of `gate` (already fitted to the server); its result. A server that died during
    it raises ServerDied (the scored samples stay)."""
    _set(folder, gate.name, entry(gate, "running"))

    def record(line: dict[str, Any]) -> None:
        folder.append_jsonl(gate.file, line)
        if on_sample:
            on_sample(line)

    t0 = perf_counter()
    try:
        result = await gate.run(target.server, folder.path, record)
    except RunError as e:
        death = target.death()
        raise (ServerDied(death) if death else e) from None
    _set(folder, gate.name, entry(gate, "passed" if result["passed"] else "failed", result=result,
                                  wall_s=round(perf_counter() - t0, 2)))
    death = target.death()
    if death:  # every request after the death failed; the score is real but the server is gone
        raise ServerDied(f"{death} (during the {gate.name} gate)")
    return result


def cite_gate(folder: RunFolder, gate_run: Path, name: str) -> None:
    """Record gate `name` of `gate_run` (an earlier run on this same launch) in `folder`: the figures there
    stand or fall with it."""
    rec = {k: v for k, v in records(summary_of(gate_run))[name].items() if k != "name"}
    f = gate_run / str(rec.get("file") or "")
    if KINDS[rec["kind"]].copied_when_cited and rec.get("file") and f.is_file():
        shutil.copyfile(f, folder.path / f.name)
    _set(folder, name, {**rec, "source": gate_run.name, "note": "gate run earlier on this same launch of the server"})
