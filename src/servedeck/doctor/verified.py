"""What `servedeck verify-build` last found for each build, kept so it can be read later without hashing
again: `$SERVEDECK_HOME/builds/<build>/verified.json`, written atomically (fsio) after every verification,
read by `servedeck page` (the seed's "on 2026-09-11 the install matched its package RECORD hashes on 24,416
of 24,417 files").

    {"schema": 1, "at": ISO time, "build", "kind", "path", "engine", "engine_version", "version_source",
     "verdict": intact | changed | not-checked | absent,
     "exists", "integrity_checked", "integrity_skip", "files_total", "files_matched", "dists",
     "changed" / "missing" / "untracked" / "no_record" / "editable": {"count": N, "first": [up to 50 paths]},
     "requires": [{"path", "ok", "saw"}], "problems": [...], "servedeck": version}
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from servedeck import __version__, paths
from servedeck.doctor.build import BuildReport
from servedeck.fsio import atomic_write_json

SCHEMA = 1
LISTED = 50  # paths kept per list: the counts are whole, the lists are for a person to start from


def verified_file(build: str) -> Path:
    return paths.home() / "builds" / re.sub(r"[^\w.-]", "_", build) / "verified.json"


def verdict_of(rep: BuildReport) -> str:
    if not rep.exists:
        return "absent"
    if not rep.integrity_checked:
        return "not-checked"
    return "intact" if rep.intact else "changed"


def record_of(rep: BuildReport, at: str) -> dict[str, Any]:
    """Pure: the record kept for one verification."""
    d = rep.to_json()

    def listed(key: str) -> dict[str, Any]:
        items = list(d.get(key) or [])
        return {"count": len(items), "first": items[:LISTED]}

    return {"schema": SCHEMA, "at": at, "build": rep.build, "kind": rep.kind, "path": rep.path,
            "engine": rep.engine, "engine_version": rep.engine_version, "version_source": rep.version_source,
            "verdict": verdict_of(rep), "exists": rep.exists, "integrity_checked": rep.integrity_checked,
            "integrity_skip": rep.integrity_skip, "files_total": rep.files_total, "files_matched": rep.files_matched,
            "dists": rep.dists, "site_packages": rep.site_packages,
            **{k: listed(k) for k in ("changed", "missing", "untracked", "no_record", "editable")},
            "requires": [{"path": r.path, "ok": r.ok, "saw": r.saw} for r in rep.requires],
            "problems": list(rep.problems), "servedeck": __version__}


def record_verification(rep: BuildReport, at: str) -> dict[str, Any]:
    """Keep `rep` as the build's last verdict (replacing the one before, atomically)."""
    rec = record_of(rep, at)
    atomic_write_json(verified_file(rep.build), rec)
    return rec


def last_verification(build: str) -> dict[str, Any] | None:
    """The build's last verdict, or None when it was never verified (or the record cannot be read)."""
    try:
        doc = json.loads(verified_file(build).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and doc.get("schema") == SCHEMA else None
