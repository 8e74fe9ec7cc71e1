"""The campaign folder: `<results>/campaigns/<name>__<MMDD-HHMMSS>/` (notes/campaign-contract.md).

    campaign.toml   the campaign file as it was when the campaign began (a resume runs this copy)
    campaign.json   every cell: state, run folders, reason, signature, timings; written atomically
    campaign.md     the same for a person, with a variant × point table rebuilt from the run folders

Cell states (cells.CellState, its values on disk): pending → running → done | failed | timed-out;
skipped (left out by --only). A cell found `running` by a later `campaign run --resume` is redone: the
servedeck that ran it is gone. A state changes only through `move_cell`, which refuses a move
cells.MOVES does not list. Only CampaignFolder writes these files; one lock serialises writers within a
process (--parallel).
A Ray node running one of the head's cells keeps no record and writes no campaign folder: the head's is
the only one, and the node's news reaches it through the task's stream (cluster/node.py).
"""

from __future__ import annotations

import json
import socket
import threading
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

from servedeck import paths
from servedeck.campaign.cells import Cell, CellState, moved
from servedeck.campaign.file import Campaign
from servedeck.deck.state import now_iso
from servedeck.errors import RunError
from servedeck.fsio import atomic_write_json, atomic_write_text, unique_dir

SCHEMA = 1


def campaigns_root(configured: Optional[str]) -> Path:
    return paths.results_dir(configured) / "campaigns"


def _new_doc(camp: Campaign, cells: list[Cell], model: str) -> dict[str, Any]:
    return {"schema": SCHEMA, "name": camp.name, "file": str(camp.path), "model": model, "started": now_iso(),
            "updated": now_iso(), "host": socket.gethostname(),
            "variants": {v.name: {"overrides": v.overrides(), "replicas": v.replicas, "knobs": camp.knobs.get(v.name, {}),
                                  "outputs_may_differ": v.outputs_may_differ} for v in camp.variants},
            "base_variant": camp.base_variant, "reference": camp.head.reference,
            "cells": [{"id": c.id, "variant": c.variant, "repeat": c.repeat, "state": CellState.PENDING.value, "runs": [],
                       "reason": None, "signature": None, "started": None, "ended": None, "node": None}
                      for c in cells]}


class CampaignFolder:
    def __init__(self, path: Path, doc: dict[str, Any]):
        self.path = path
        self.doc = doc
        self._lock = threading.Lock()

    @classmethod
    def create(cls, root: Path, camp: Campaign, cells: list[Cell], model: str) -> "CampaignFolder":
        base = f"{camp.name}__{datetime.now().strftime('%m%d-%H%M%S')}"
        try:
            path = unique_dir(root, base)
        except OSError as e:
            raise RunError(f"cannot create a campaign folder under {root}: {e.strerror}",
                           hint="set [host] results_dir in models.toml or SERVEDECK_RESULTS to a writable place") from None
        atomic_write_text(path / "campaign.toml", camp.text)
        folder = cls(path, _new_doc(camp, cells, model))
        folder.save()
        return folder

    @classmethod
    def open(cls, path: Path) -> "CampaignFolder":
        try:
            doc = json.loads((path / "campaign.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise RunError(f"{path / 'campaign.json'}: cannot read: {e}",
                           hint="the folder is not a campaign folder, or its campaign.json is damaged") from None
        return cls(path, doc)

    # --- cells ------------------------------------------------------------------------------------
    def cell(self, cell_id: str) -> dict[str, Any]:
        return next(c for c in self.doc["cells"] if c["id"] == cell_id)

    def state(self, cell_id: str) -> CellState:
        return CellState(self.cell(cell_id)["state"])

    def move_cell(self, cell_id: str, to: CellState, **changes: Any) -> None:
        """The one way a cell's state changes (with the fields that go with the move, saved together)."""
        with self._lock:
            rec = self.cell(cell_id)
            rec.update(changes, state=moved(rec["state"], to).value)
            self._save_locked()

    def set_cell(self, cell_id: str, **changes: Any) -> None:
        """A cell's other fields (node, runs, attempts); its state moves through `move_cell`."""
        if "state" in changes:
            raise ValueError(f"cell {cell_id}: set_cell does not change a state; move_cell does")
        with self._lock:
            self.cell(cell_id).update(changes)
            self._save_locked()

    def add_run(self, cell_id: str, run: str) -> None:
        with self._lock:
            runs = self.cell(cell_id)["runs"]
            if run not in runs:
                runs.append(run)
            self._save_locked()

    def save(self) -> None:
        with self._lock:
            self._save_locked()

    def _save_locked(self) -> None:
        self.doc["updated"] = now_iso()
        atomic_write_json(self.path / "campaign.json", self.doc)

    @property
    def finished(self) -> bool:
        return all(CellState(c["state"]).finished for c in self.doc["cells"])

    def write_markdown(self, text: str) -> None:
        atomic_write_text(self.path / "campaign.md", text)


def _finished(state: Any) -> bool:
    """A state read from any campaign.json on disk (one this servedeck did not write may hold anything)."""
    try:
        return CellState(state).finished
    except ValueError:
        return False


def stamped_folders(root: Path, marker: str) -> list[Path]:
    """Folders of `root` that hold `marker` (campaign.json, tune.json), oldest first (by the stamp in their name)."""
    if not root.exists():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and (p / marker).exists()]
    return sorted(found, key=lambda p: (p.name.split("__")[-1], p.stat().st_mtime))


def list_campaigns(root: Path) -> list[Path]:
    """Campaign folders, oldest first (by the stamp in their name)."""
    return stamped_folders(root, "campaign.json")


def newest_unfinished(root: Path, camp: Campaign) -> Optional[Path]:
    """The newest folder of this campaign (same name, same file) that still has cells to do."""
    for p in reversed(list_campaigns(root)):
        try:
            doc = json.loads((p / "campaign.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if doc.get("name") != camp.name or doc.get("file") != str(camp.path):
            continue
        if any(not _finished(c.get("state")) for c in doc.get("cells", [])):
            return p
    return None


def find_campaign(root: Path, ref: Optional[str]) -> Path:
    """A campaign folder by path, name, a unique fragment, or (none given) the newest."""
    if ref:
        p = Path(ref).expanduser()
        if (p / "campaign.json").exists():
            return p
    found = list_campaigns(root)
    if not found:
        raise RunError(f"no campaigns under {root}", hint="run `servedeck campaign run FILE` first")
    if not ref:
        return found[-1]
    matches = [p for p in found if p.name == ref] or [p for p in found if ref in p.name]
    if len(matches) == 1 or (matches and all(m.name.split("__")[0] == ref for m in matches)):
        return matches[-1]
    if not matches:
        raise RunError(f"no campaign matching {ref!r} under {root}", hint="`servedeck campaign status` lists the newest")
    raise RunError(f"{ref!r} matches {len(matches)} campaigns ({', '.join(m.name for m in matches[-5:])})",
                   hint="give more of the folder name")
