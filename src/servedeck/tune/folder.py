"""The tune folder: `<results>/tunes/<name>__<MMDD-HHMMSS>/`.

    tune.toml   the tune file as it was when the tune began (a resume searches this copy)
    tune.json   every trial: its values, state, verdict, figures or why none, its campaign folder; the best so
                far by the verdict rules; written atomically after every change
    tune.md     the same for a person, rebuilt from tune.json alone
    study.db    Optuna's study (SQLite): what the sampler learns from, and what `--resume` continues; absent where
                the tune named a database (`--storage URL`: storage.py; tune.json `storage`, `study_name`)
    tune.lock   held while a servedeck runs the tune (a second one is refused)

A trial's state: running → done (it has a verdict: measured or why not) | interrupted (Ctrl-C or a servedeck
that is gone: a resume redoes the same values as a new trial). Only TuneFolder writes these files.
"""

from __future__ import annotations

import json
import socket
import threading
from datetime import datetime
from pathlib import Path
from typing import Any, Optional

from servedeck import paths
from servedeck.campaign.folder import stamped_folders
from servedeck.deck.state import now_iso
from servedeck.errors import RunError
from servedeck.fsio import atomic_write_json, atomic_write_text, unique_dir
from servedeck.mdtable import table_lines
from servedeck.tune.file import Tune
from servedeck.tune.space import Categorical, IntRange

SCHEMA = 2  # 2: verify and verification (a schema-1 folder has neither: apply reads it as unverified)
RUNNING, DONE, INTERRUPTED = "running", "done", "interrupted"


def tunes_root(configured: Optional[str]) -> Path:
    return paths.results_dir(configured) / "tunes"


def _space_json(tune: Tune) -> list[dict[str, Any]]:
    out = []
    for k in tune.space.knobs:
        kind = "categorical" if isinstance(k, Categorical) else "integer" if isinstance(k, IntRange) else "together"
        out.append({"name": k.name, "kind": kind, "range": k.describe(),
                    "when": {a: list(b) for a, b in k.when.on.items()} if k.when else None})
    return out


class TuneFolder:
    def __init__(self, path: Path, doc: dict[str, Any]):
        self.path, self.doc = path, doc
        # `tune --ray` runs trials side by side, each on a thread of the head: every change and save under it
        self.lock = threading.RLock()

    @classmethod
    def create(cls, root: Path, tune: Tune, model: str) -> "TuneFolder":
        try:
            path = unique_dir(root, f"{tune.name}__{datetime.now().strftime('%m%d-%H%M%S')}")
        except OSError as e:
            raise RunError(f"cannot create a tune folder under {root}: {e.strerror}",
                           hint="set [host] results_dir in models.toml or SERVEDECK_RESULTS to a writable place") from None
        atomic_write_text(path / "tune.toml", tune.text)
        sp = tune.space
        doc = {"schema": SCHEMA, "name": tune.name, "file": str(tune.path), "model": model, "slo": tune.slo,
               "host": socket.gethostname(), "started": now_iso(), "updated": now_iso(),
               "budget": {"trials": sp.trials, "wall": sp.wall}, "sampler": "optuna TPESampler",
               "seed": sp.seed, "startup_trials": sp.startup_trials, "space": _space_json(tune),
               "require": [r.text for r in sp.rules], "outputs_may_differ": sp.outputs_may_differ,
               "check_outputs": sp.check_outputs, "verify": {"top": sp.verify_top, "repeats": sp.verify_repeats},
               "verification": None, "storage": "study.db", "spent_s": 0.0, "finished": False,
               "trials": [], "best": None}
        folder = cls(path, doc)
        folder.save()
        return folder

    @classmethod
    def open(cls, path: Path) -> "TuneFolder":
        try:
            doc = json.loads((path / "tune.json").read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise RunError(f"{path / 'tune.json'}: cannot read: {e}",
                           hint="the folder is not a tune folder, or its tune.json is damaged") from None
        return cls(path, doc)

    def trial(self, name: str) -> Optional[dict[str, Any]]:
        return next((t for t in self.doc["trials"] if t["trial"] == name), None)

    def begin_trial(self, name: str, number: Optional[int], values: dict[str, Any], redoes: Optional[str]) -> None:
        rec: dict[str, Any] = {"trial": name, "number": number, "values": values, "state": RUNNING, "verdict": None, "value": None,
               "bound": False, "why": None, "tell": None, "campaign": None, "runs": [], "row": None,
               "outputs": None, "fit": None, "redoes": redoes, "started": now_iso(), "ended": None,
               "duration_s": None}
        with self.lock:
            old = self.trial(name)
            if old is not None:  # the starter, begun again after an interruption
                self.doc["trials"].remove(old)
            self.doc["trials"].append(rec)
            self.save()

    def update_trial(self, name: str, **changes: Any) -> None:
        with self.lock:
            rec = self.trial(name)
            assert rec is not None, name
            rec.update(changes)
            self.save()

    def save(self) -> None:
        with self.lock:
            self.doc["updated"] = now_iso()
            atomic_write_json(self.path / "tune.json", self.doc)
            atomic_write_text(self.path / "tune.md", render_markdown(self.doc))


def _num(x: Optional[float], digits: int = 2) -> str:
    return "—" if x is None else f"{x:,.{digits}f}"


def _values(values: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items()) or "(the model's entry)"


def _figure(t: dict[str, Any]) -> str:
    row = t.get("row") or {}
    if t.get("verdict") in ("measured", "no-capacity"):
        ge = "≥ " if t.get("bound") else ""
        cap = row.get("capacity")
        at = f" at {'c=' if row.get('find') == 'max-concurrency' else ''}{cap:g}" if cap is not None else ""
        tok = row.get("output_tok_s_per_gpu")
        return f"{ge}{_num(t.get('value'))} good req/s" + (f" ({ge}{tok:.1f} tok/s)" if tok is not None else "") + at
    if t.get("verdict") == "below-best" and row.get("ceiling_per_gpu") is not None:
        return f"≤ {_num(row['ceiling_per_gpu'])} good req/s (stopped below the best)"
    return "—"


def best_sentence(best: Optional[dict[str, Any]]) -> str:
    if not best or best.get("verdict") in (None, "none"):
        return "No trial has a figure that may be served yet" + (f": {best['note']}." if best and best.get("note") else ".")
    ge = "≥ " if best.get("bound") else ""
    lead = f"{best.get('leading')} ({ge}{_num(best.get('goodput_per_gpu'))} good req/s per GPU)"
    if best["verdict"] == "recommended":
        nxt = f", {best['by'] * 100:+.0f} % over {best['next']}" if best.get("next") and best.get("by") is not None else ""
        return f"Best so far: **{lead}**{nxt}."
    opens = "; ".join(f"{u['variant']} (≥ {_num(u['goodput_per_gpu'])}: {u['step']})" for u in best.get("undecided") or [])
    return f"Undecided: {lead} leads, but lower bounds below it could still exceed it: {opens}."


def render_markdown(doc: dict[str, Any]) -> str:
    b = doc.get("budget") or {}
    budget = " and ".join(x for x in (f"{b['trials']} trials" if b.get("trials") else "",
                                      f"wall {b['wall']}" if b.get("wall") else "") if x)
    lines = [f"# Tune {doc.get('name')}", "",
             f"File `{doc.get('file')}`, model `{doc.get('model')}`, host `{doc.get('host')}`; objective: good "
             f"requests/s per GPU within SLO `{doc.get('slo')}` (a lower bound counts as its value, marked ≥). "
             f"Budget {budget}; {doc.get('sampler')} (seed {doc.get('seed')}, {doc.get('startup_trials')} random "
             f"trials first). Started {doc.get('started')}, updated {doc.get('updated')}"
             + (", finished." if doc.get("finished") else "."), "", best_sentence(doc.get("best")), "",
             "## Space", "", *table_lines(["key", "kind", "values", "only when"],
                                          [[s["name"], s["kind"], s["range"],
                                            ", ".join(f"{k} in {v}" for k, v in (s.get("when") or {}).items())]
                                           for s in doc.get("space") or []])]
    if doc.get("require"):
        lines += ["", "Rules every trial keeps: " + "; ".join(f"`{r}`" for r in doc["require"]) + "."]
    if doc.get("starter_point"):
        lines += ["", "The starter's figure was told to the search at " + ", ".join(
            f"{k}={v}" for k, v in doc["starter_point"].items()) + " (its entry's values, else the engine's fixed "
            "defaults; a knob with neither is left out)."]
    elif doc.get("study_offset") == 0:
        lines += ["", "The starter's entry has no known value for any searched knob: the search was not told its "
                      "figure."]
    lines += ["", "## Trials", "", *table_lines(
        ["trial", "values", "state", "verdict", "figure within the SLO", "outputs", "why", "campaign"],
        [[t["trial"], _values(t.get("values") or {}), t["state"], t.get("verdict") or "", _figure(t),
          (t.get("outputs") or {}).get("check", ""), (t.get("why") or "")[:160], t.get("campaign") or ""]
         for t in doc.get("trials") or []])]
    lines += _placement_lines(doc)
    if doc.get("importance"):
        lines += ["", *importance_lines(doc["importance"])]
    lines += _verification_lines(doc.get("verification"))
    lines += ["", "The starter is the model's entry as models.toml has it: every trial's greedy outputs are held "
              "against its, and it is the figure to beat. Pruned trials (verdicts other than measured and "
              "no-capacity) tell the search their region is bad; a below-best trial's search stopped once no load "
              "could carry the best figure so far. `servedeck tune apply` writes the verified "
              "winner into models.toml" + (" (this tune has verify = false: the best by one measurement each)."
                                           if not (doc.get("verify") or {}).get("top") else ".")]
    return "\n".join(lines) + "\n"


def importance_lines(imp: dict[str, Any]) -> list[str]:
    """How much each searched entry moved the objective (importance.py), as tune.md and `tune show` say it."""
    lines = ["## Importance of each searched entry", ""]
    if not imp.get("importance"):
        return lines + [f"Not computed: {imp.get('note')}."]
    return lines + [f"{imp['evaluator']} over {imp['trials']} complete trials: each entry's share of the "
                    "objective's variance (pruned trials have no value and do not count).", "",
                    *table_lines(["entry", "importance"], [[k, f"{v:.2f}"] for k, v in imp["importance"].items()])]


def most_at_once(trials: list[dict[str, Any]]) -> int:
    """How many trials ran at the same time at most, from their started/ended stamps (ISO 8601; one still
    running counts as running now). Pure."""
    events: list[tuple[datetime, int]] = []
    for t in trials:
        if not t.get("started"):
            continue
        a = datetime.fromisoformat(t["started"])
        b = datetime.fromisoformat(t["ended"]) if t.get("ended") else datetime.now(a.tzinfo)
        events += [(a, 1), (b, -1)]
    most = now = 0
    for _, d in sorted(events, key=lambda e: (e[0], e[1])):  # an end before a start at the same second
        now += d
        most = max(most, now)
    return most


def _placement_lines(doc: dict[str, Any]) -> list[str]:
    """`tune --ray`: where each trial ran (its Ray node), its port, and when it started and ended."""
    ray = doc.get("ray")
    if not ray:
        return []
    trials = doc.get("trials") or []
    rows = [[t["trial"], t.get("node") or "", (t.get("ray_node_id") or "")[:12], str(t.get("port") or ""),
             t.get("started") or "", t.get("ended") or "", _num(t.get("duration_s"), 0)] for t in trials]
    return ["", "## Where each trial ran", "",
            f"On Ray (`{ray.get('address')}`), up to {ray.get('parallel')} searched trial(s) at once, each a campaign "
            f"cell placed by Ray (the campaign's RayPlacement); at most {most_at_once(trials)} trial(s) ran at the "
            "same time. Trials side by side on one host take their own ports (campaign.port_offset)."
            + (f" Several nodes run on one host ({', '.join(ray['shared_hosts'])}): trials side by side there measured "
               "each other's load beside their own, so their figures are not comparable with the starter's, measured "
               "alone." if ray.get("shared_hosts") else "")
            + (f" Nodes that hold several trials at once on their CPUs ({', '.join(ray['crowded_nodes'])}): trials "
               "side by side there measured each other's load too." if ray.get("crowded_nodes") else ""), "",
            *table_lines(["trial", "node", "Ray node", "port", "started", "ended", "s"], rows)]


def _verification_lines(ver: Optional[dict[str, Any]]) -> list[str]:
    """The verification: its verdict, each verified trial's repeats against the starter's, each launch in order."""
    if not ver:
        return []
    lines = ["", "## Verification", "",
             f"The best {ver.get('top')} trial(s) and the starter launched again, {ver.get('repeats')} times each, "
             f"interleaved (campaign `{ver.get('campaign') or '-'}`). Paired round by round with the starter's launches, "
             "a trial holds from 3 rounds when the paired t interval (95 %) of its lead lies above 0 and the lead "
             "clears the 2 % noise threshold; with 2 rounds, when it led in both and its median beats the starter's "
             "by more than the spread (the larger range, max − min, of the two)."]
    if ver.get("state") != DONE:
        return lines + ["", f"Not finished ({len(ver.get('order') or [])} launches planned): "
                            "`servedeck tune FILE --resume` finishes it."]
    lines += ["", f"**{ver.get('verdict')}**" + (f": {ver['winner']}" if ver.get("winner") else "") +
              f". {ver.get('why') or ''}"]
    rows = []
    for name, t in (ver.get("trials") or {}).items():
        figs = ver.get("figures", {}).get(name) or []
        each = ", ".join(("≥ " if f.get("bound") else "") + _num(f.get("value")) if f.get("value") is not None
                         else f"— ({f.get('why')})" for f in figs)
        rows.append([name, each, _num(t.get("median")), _num(t.get("spread")),
                     "" if t.get("margin") is None else f"{t['margin']:+.2f}", _rounds(t.get("rounds")),
                     t.get("outcome") or ""])
    if rows:
        lines += ["", *table_lines(["trial", "each launch (good req/s per GPU)", "median", "spread",
                                    "margin over the starter", "rounds led (paired 95 %)", "outcome"], rows)]
    if ver.get("order"):
        lines += ["", "Launch order: " + ", ".join(ver["order"]) + "."]
    return lines


def _rounds(r: Optional[dict[str, Any]]) -> str:
    if not r or not r.get("pairs"):
        return ""
    ci = f" ({r['low']:+.2f}..{r['high']:+.2f})" if r.get("low") is not None else ""
    return f"{r['won']} of {r['pairs']}{ci}"


def _finished(doc: dict[str, Any]) -> bool:
    return bool(doc.get("finished"))


def list_tunes(root: Path) -> list[Path]:
    """Tune folders, oldest first (by the stamp in their name)."""
    return stamped_folders(root, "tune.json")


def newest_unfinished(root: Path, tune: Tune) -> Optional[Path]:
    """The newest folder of this tune (same name, same file) whose search has not finished."""
    for p in reversed(list_tunes(root)):
        try:
            doc = json.loads((p / "tune.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        if doc.get("name") == tune.name and doc.get("file") == str(tune.path) and not _finished(doc):
            return p
    return None
