"""Which knob a difference between two launches can be credited to. Pure.

In a campaign the user changes the variants' knobs (campaign.json `knobs`, e.g. `args.parallel = 8`).
The launch servedeck renders from them can differ in more places: llama.cpp's `-c` is parallel ×
context, so `args.parallel` moves both `-c` and `--parallel`. Those rendered differences are the
knob's consequences, not more knobs. A configuration fact no campaign knob explains (another host,
engine build or servedeck version between cells) still counts as a knob of its own: it changed, and
nobody asked for it. Loose runs declare nothing: every configuration difference is a knob.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from servedeck.report.collect import Run

# The rendered launch: any difference here follows from the campaign's knobs, since every variant is
# the same models.toml entry with only its declared overrides applied.
RENDERED = ("flag ", "env ")
# Facts outside the rendered launch that a declared knob explains when it changes.
EXPLAINS: dict[str, tuple[str, ...]] = {
    "context": ("context",),
    "build": ("build", "engine", "engine version"),
    "cpus": ("CPUs",),
    "host": ("host", "CPUs", "GPUs", "GPU driver", "GPU memory", "GPU power limit", "engine version", "build"),
}
UNSET = "(not set)"


@dataclass(frozen=True)
class Attribution:
    asked: list[tuple[str, str, str]]  # (knob, A, B) the user changed: campaign.json knobs, or for loose
    #                                    runs every configuration difference
    unasked: list[tuple[str, str, str]]  # configuration differences no campaign knob explains
    consequences: list[tuple[str, str, str]]  # rendered differences that follow from the asked knobs
    declared: bool  # True: `asked` are the campaign's own knobs (campaign.json)

    @property
    def knobs(self) -> list[tuple[str, str, str]]:
        """What a difference can be credited to: the knobs asked for, and whatever else changed."""
        return self.asked + self.unasked

    def consequences_of(self) -> str:
        """"flag -c: 131072 → 32768, flag --parallel: 32 → 8", or ""."""
        return ", ".join(f"{n}: {x} → {y}" for n, x, y in self.consequences)


def _text(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v) if isinstance(v, (list, dict)) else str(v)


def knob_value(run: Run, knob: str) -> str:
    """The knob's value on this run: what its variant declared, else what models.toml gave the launch
    (summary.json's config), else "(not set)"."""
    if run.declared and knob in run.declared:
        return _text(run.declared[knob])
    model = (run.view.get("config") or {}).get("model") or {}
    head, _, leaf = knob.partition(".")
    v = (model.get(head) or {}).get(leaf) if leaf else model.get(head)
    return UNSET if v is None else _text(v)


def attribute(a: Run, b: Run, config_changes: list[tuple[str, str, str]]) -> Attribution:
    """A against B: by the campaign's knobs when both runs carry them, else by every configuration
    difference. `config_changes`: knobs.changed() of the two runs' configuration knobs."""
    if a.declared is None or b.declared is None:
        return Attribution(list(config_changes), [], [], False)
    names = list(a.declared) + [n for n in b.declared if n not in a.declared]
    user = [(n, knob_value(a, n), knob_value(b, n)) for n in names]
    user = [u for u in user if u[1] != u[2]]
    explained = {fact for n, _, _ in user for fact in EXPLAINS.get(n.partition(".")[0], ())}
    follows = [c for c in config_changes if c[0].startswith(RENDERED) or c[0] in explained]
    if not user:  # nothing declared differs: whatever the launches differ in, nobody asked for it
        follows = []
    unexplained = [c for c in config_changes if c not in follows]
    return Attribution(user, unexplained, follows, True)


def sentence(att: Attribution) -> str:
    """How many knobs, and whether a difference can be credited to one."""
    n = len(att.knobs)
    names = ", ".join(k[0] for k in att.knobs)
    if n == 0:
        return "same configuration: any difference is run-to-run noise"
    if n == 1:
        tail = f"; it renders as {att.consequences_of()}" if att.consequences else ""
        return f"one knob changed ({names}{tail}): a difference can be credited to it"
    tail = f"; they render as {att.consequences_of()}" if att.consequences else ""
    return f"{n} knobs changed ({names}{tail}): a difference cannot be attributed to any one of them"
