"""Tried and refuted, by a tune: the searched trials of each finished `servedeck tune` of this model that lost, and
why, in the tune's own words (tune.json), so the page says what a search already ruled out and nobody launches it
again by hand. Pure but for reading the tune folders; nothing is launched or measured here.

A trial lost when it ended in a pruned verdict (broke-rule, invalid, no-fit, failed, gate-failed, outputs-differ,
below-best: tune/objective.py, with its `why`), served nobody (no-capacity), was measured but not chosen (its figure against
the starter's), or was launched again in the verification and did not hold (its outcome and why: tune/verify.py).
The starter is the baseline and the winner (the verification's, else the search's recommendation where the tune
has verify = false) is what the tune kept: neither is refuted. A trial still running or interrupted has no verdict;
a repeated one (values already tried, never launched) is left out: its result is the earlier trial's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

from servedeck.tune.folder import DONE, list_tunes
from servedeck.tune.objective import MEASURED, REPEATED
from servedeck.tune.verify import HOLDS, STARTER


def compact(values: Any) -> str:
    """{"args.parallel": 8, "args.threads": 2} → "parallel=8, threads=2": engine flags by their own names; env and
    other keys keep their table's prefix, as the tune file wrote them."""
    if not isinstance(values, dict) or not values:
        return "(the model's entry)"
    return ", ".join(f"{k.removeprefix('args.')}={v}" for k, v in values.items())


def _fig(t: dict[str, Any]) -> str:
    v = t.get("value")
    return "—" if v is None else ("≥ " if t.get("bound") else "") + f"{float(v):.2f}"


def winner_of(doc: dict[str, Any]) -> Optional[str]:
    """What the tune kept: the verification's winner; with no verification (verify = false, or a schema-1 folder),
    the search's recommended trial, as `tune apply` reads it."""
    ver = doc.get("verification")
    if isinstance(ver, dict):
        return ver.get("winner")
    best = doc.get("best") or {}
    return best.get("leading") if best.get("verdict") == "recommended" else None


def _measured_why(doc: dict[str, Any], t: dict[str, Any], starter: Optional[dict[str, Any]]) -> str:
    words = f"{_fig(t)} good req/s per GPU within SLO {doc.get('slo') or '?'}"
    words += f" against the starter's {_fig(starter)}" if starter else "; the starter has no figure"
    ver = doc.get("verification")
    sv = (starter or {}).get("value")
    if isinstance(ver, dict) and sv is not None and (t.get("value") or 0) >= sv:
        # ahead of the starter once, yet below the few the verification launched again
        words += f"; not among the best {ver.get('top') or len(ver.get('candidates') or [])} the verification " \
                 "launched again"
    return words


def lost_trials(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Each searched trial of a tune.json document that lost, in trial order: {trial, values, verdict, why,
    campaign}. Missing keys (an older or damaged document) read as absent, never as an error."""
    trials = [t for t in doc.get("trials") or [] if isinstance(t, dict)]
    starter = next((t for t in trials if t.get("trial") == STARTER), None)
    won = winner_of(doc)
    ver = doc.get("verification")
    verified = (ver.get("trials") if isinstance(ver, dict) else None) or {}
    out = []
    for t in trials:
        name = t.get("trial")
        if name in (STARTER, won) or t.get("state") != DONE or t.get("verdict") in (None, "", REPEATED):
            continue  # a repeated proposal is another trial's result, not a configuration of its own
        verdict, why = t["verdict"], t.get("why") or "no reason recorded"
        v = verified.get(name) if isinstance(verified.get(name), dict) else None
        if verdict == MEASURED and v and v.get("outcome"):
            verdict, why = f"verification: {v['outcome']}", v.get("why") or "no reason recorded"
            if v["outcome"] == HOLDS and won:
                why += f"; {won} held with a higher median"
            elif v["outcome"] == HOLDS:
                continue  # an undecided verification's leader: not refuted, not kept either
        elif verdict == MEASURED:
            why = _measured_why(doc, t, starter)
        out.append({"trial": name, "values": compact(t.get("values")), "verdict": verdict, "why": why,
                    "campaign": t.get("campaign")})
    return out


def tune_entry(folder: Path, doc: dict[str, Any]) -> dict[str, Any]:
    """One finished tune for the page: its name and folder, what its verification decided, and the trials it
    refuted."""
    ver = doc.get("verification")
    if isinstance(ver, dict):
        verdict, why = str(ver.get("verdict") or "not finished"), ver.get("why")
    else:
        best = doc.get("best") or {}
        verdict, why = f"not verified (the search's best: {best.get('verdict') or 'none'})", best.get("note")
    searched = [t for t in doc.get("trials") or [] if isinstance(t, dict) and t.get("trial") != STARTER]
    return {"name": doc.get("name"), "folder": str(folder), "file": doc.get("file"), "started": doc.get("started"),
            "slo": doc.get("slo"), "verified": isinstance(ver, dict), "verdict": verdict, "winner": winner_of(doc), "why": why,
            "searched": len(searched), "lost": lost_trials(doc), "importance": moved(doc)}


def moved(doc: dict[str, Any]) -> Optional[str]:
    """What moved the objective in the search, as its tune.json recorded it at the search's end (tune/importance.py:
    fANOVA over the complete trials): "args.parallel 0.81, args.batch-size 0.12"; None where it was not computed."""
    imp = doc.get("importance")
    shares = imp.get("importance") if isinstance(imp, dict) else None
    if not isinstance(shares, dict) or not shares:
        return None
    return ", ".join(f"{k.removeprefix('args.')} {float(v):.2f}" for k, v in shares.items())


def tunes_of(model: str, root: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """The finished tunes of `model` under `root` (<results>/tunes), newest first, and the folders whose tune.json
    could not be read (and why). An unfinished tune is left out: its losers are not decided yet."""
    tunes: list[dict[str, Any]] = []
    unreadable: list[str] = []
    for p in reversed(list_tunes(root)):
        try:
            doc = json.loads((p / "tune.json").read_text())
        except (OSError, ValueError) as e:
            unreadable.append(f"{p}: {e}")
            continue
        if isinstance(doc, dict) and doc.get("model") == model and doc.get("finished"):
            tunes.append(tune_entry(p, doc))
    return tunes, unreadable
