"""The tune file: a campaign file (campaign/file.py: [campaign], [[workloads]], [slo.NAME], the gate) whose
variants the search chooses, from its [search] table (space.py). Pure: text in, a Tune out.

Every trial is a one-variant campaign made from this file: the variant's overrides are the sampled values,
its name the trial's (`t3`), and, unless `check_outputs = false`, the starter as its `reference`, so each
trial's greedy outputs are held against the starter's (the model's entry as models.toml has it, launched first:
trial `starter`): the campaign's first workload answers the output check, or, a capacity search being unable
to, the campaign puts its short `output check` run first (campaign/file.py OUTPUT_CHECK). A searched trial's
campaign also names the starter's run as its `reference_run`, so a trial whose answers differ ends at that check,
before its capacity search (campaign/steps.py), and, unless `prune = false`, holds the capacity search under the
tune's SLO to the best figure so far (`stop_below`), so a trial that cannot reach it stops at its first failing load
(workloads/search.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import tomlkit

from servedeck.campaign.file import Campaign, parse as parse_campaign
from servedeck.config.tomlfile import read_toml
from servedeck.errors import ConfigError
from servedeck.tune.space import DOC, Space, SpaceError, overrides, parse_search

STARTER = "starter"  # the trial that launches the model's entry unchanged: the reference and the baseline


@dataclass(frozen=True)
class Tune:
    path: Path
    text: str
    raw: dict[str, Any]  # the campaign part of the file (no [search])
    camp: Campaign  # validated with the starter as its one variant
    space: Space
    slo: str  # the SLO the objective reads

    @property
    def name(self) -> str:
        return self.camp.name

    def trial_campaign(self, variant: str, values: dict[str, Any], lane: int = 0,
                       reference_run: Optional[str] = None, stop_below: Optional[float] = None) -> Campaign:
        """The one-variant campaign of a trial (ConfigError when a sampled value is wrong for a variant). `lane`:
        which of the trials running side by side (`tune --ray`) it is; its entry takes the port `lane` further on
        (campaign.port_offset), so two trials on one host never bind the same one. `reference_run`: the starter's
        run with the output check (its path), which the trial's own check is held against the moment it is
        answered (campaign.reference_run): a trial that changes the answers is stopped before its capacity search.
        `stop_below`: the best figure so far (good req/s per GPU), which the capacity search under the tune's SLO is
        held to (workloads/search.py's floor): one that cannot reach it stops at its first failing load."""
        raw = self.raw if stop_below is None else {**self.raw, "workloads": [
            {**w, "stop_below": {self.slo: stop_below}} if self.slo in _slos_of(w) else w
            for w in self.raw.get("workloads") or []]}
        return _campaign(raw, self.path, f"{self.name}.{variant}", {variant: values}, self.space.check_outputs,
                         port_offset=lane, reference_run=reference_run)

    def verify_campaign(self, variants: dict[str, dict[str, Any]], repeats: int) -> Campaign:
        """The verification: the starter and the best trials (name → sampled values) as one campaign, each
        launched `repeats` times, interleaved (campaign/cells.py), every one's outputs held against the starter's."""
        return _campaign(self.raw, self.path, f"{self.name}.{VERIFY}", {STARTER: {}, **variants},
                         self.space.check_outputs, repeats, STARTER)


VERIFY = "verify"  # the verification campaign's suffix: <tune>.verify


def _campaign(raw: dict[str, Any], path: Path, name: Optional[str], variants: dict[str, dict[str, Any]],
              check: bool, repeats: int = 1, reference: Optional[str] = None, port_offset: int = 0,
              reference_run: Optional[str] = None) -> Campaign:
    head = dict(raw.get("campaign") or {})
    if port_offset:
        head["port_offset"] = port_offset
    if check and reference_run:
        head["reference_run"] = reference_run
    if name is not None:  # None: the file's own (or its absence, which the campaign's rules name)
        head["name"] = name
    if repeats > 1:
        head["repeats"] = repeats
    if check:  # every launch answers the output check (campaign/file.py puts a run first that can)
        head["reference"] = reference or next(iter(variants))
    body = {**raw, "campaign": head, "variants": [{"name": v, **overrides(values)} for v, values in variants.items()]}
    return parse_campaign(tomlkit.dumps(body), path, body)


def _slos_of(w: Any) -> list[str]:
    """The SLOs a [[workloads]] entry searches under: a capacity workload's, else none."""
    return list(w.get("slo") or []) if isinstance(w, dict) and w.get("kind") == "capacity" else []


def _capacity_slos(raw: dict[str, Any]) -> list[str]:
    return [s for w in raw.get("workloads") or [] for s in _slos_of(w)]


def parse(text: str, path: Path) -> Tune:
    raw = read_toml(text, path)
    problems = []
    for key, what in (("variants", "[[variants]]"), ("matrix", "[matrix]")):
        if key in raw:
            problems.append(f"{key}: a tune's variants are chosen by its [search] table: drop {what} (a campaign "
                            "file runs listed variants: `servedeck campaign run`)")
    head: dict[str, Any] = raw["campaign"] if isinstance(raw.get("campaign"), dict) else {}
    if head.get("gate") is False:
        problems.append("campaign.gate: a tune gates every trial (a figure whose gate did not pass is not a result, "
                        "so an ungated tune could never name a winner): give a gate, a short needle will do, like "
                        "gate = { context = 512, depths = [0.5], repeats = 1 }")
    for key in ("repeats", "base", "reference", "reference_run", "port_offset"):
        if key in head:
            problems.append(f"campaign.{key}: a tune sets it itself (each trial is one launch, held against the "
                            "starter: the model's entry as models.toml has it): drop it")
    for i, w in enumerate(raw.get("workloads") or []):
        if isinstance(w, dict) and "stop_below" in w:
            problems.append(f"workloads[{i}].stop_below: a tune sets it itself (each trial's search is held to the best "
                            "figure so far; [search] prune = false turns that off): drop it")
    try:
        space = parse_search(raw.get("search"))
    except SpaceError as e:
        space = None
        problems.append(f"{e.where}: {e.what}")
    if problems:
        raise ConfigError("\n".join(f"{path}: {p}" for p in problems), hint=DOC)
    assert space is not None
    rest = {k: v for k, v in raw.items() if k != "search"}
    camp = _campaign(rest, path, None, {STARTER: {}}, space.check_outputs)  # names campaign.* problems
    slos = list(dict.fromkeys(_capacity_slos(rest)))
    slo: Optional[str] = space.slo
    if not slos:
        problems.append('workloads: a tune needs a capacity workload (kind = "capacity", find = "max-concurrency" '
                        'or "max-rate", slo = ["NAME"]): its goodput within the SLO is what the search maximises')
    elif slo is None and len(slos) > 1:
        problems.append(f"search.slo: the capacity workloads name {', '.join(slos)}: say which one the search "
                        f'maximises, like slo = "{slos[0]}"')
    elif slo is not None and slo not in slos:
        problems.append(f"search.slo: {slo!r} is not an SLO a capacity workload searches under "
                        f"({', '.join(slos)}): name one of those")
    if problems:
        raise ConfigError("\n".join(f"{path}: {p}" for p in problems), hint=DOC)
    return Tune(path, text, rest, camp, space, slo or slos[0])


def load(path: Path) -> Tune:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such tune file", hint=f"give the path of a tune .toml; {DOC}") from None
    except OSError as e:
        raise ConfigError(f"{path}: cannot read: {e.strerror}") from None
    return parse(text, path.resolve())
