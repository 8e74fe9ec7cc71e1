"""`servedeck tune apply`: the winner's values written into the model's models.toml entry, each with its `why`.

Pure: models.toml's text in, the new text out, through tomlkit (the user's comments, order and layout kept; the
file is never formatted by hand). Which trial wins is the verdict rules' (objective.best): a tune whose best is
"undecided" is applied only when the user asks for the leader anyway.
"""

from __future__ import annotations

from typing import Any, Optional

import tomlkit
import tomlkit.items
from tomlkit.exceptions import TOMLKitError

from servedeck.errors import ConfigError, UsageError

STARTER = "starter"


# what to do when the verification named no winner, by its verdict (tune/verify.py)
_NEXT = {
    "not held": "the starter's entry stays as it is; to decide a smaller lead, give the verification more rounds "
                "(`[search] verify = { repeats = N }`: the paired interval narrows as rounds are added) or steadier "
                "launches (longer capacity steps, a quieter machine) and run the tune again; --leading applies the "
                "search's leader unverified",
    "undecided": "take the step named and run the tune again; --leading applies the search's leader unverified",
    "no baseline": "see tune.md for why the starter's launches have no figure, fix it and run the tune again",
    "nothing to verify": "no trial has a figure that may be served: see tune.md for each trial's verdict",
}


def winner(doc: dict[str, Any], leading: bool) -> dict[str, Any]:
    """The trial to apply from tune.json: the verified winner (tune/verify.py); with `leading`, the search's leader
    where the verification named none. A tune that ran without a verification (`verify = false`, or one from
    before it existed): the recommended trial, or the leader of an undecided verdict with `leading`. UsageError
    says why there is none, and what to do."""
    ver = doc.get("verification")
    if (doc.get("verify") or {}).get("top") and not ver:
        raise UsageError(f"tune {doc.get('name')}: its best trials have not been verified yet (the search has not "
                         "finished)", hint="`servedeck tune FILE --resume` searches on, then verifies")
    if ver and ver.get("state") != "done":
        raise UsageError(f"tune {doc.get('name')}: its verification has not finished",
                         hint="`servedeck tune FILE --resume` finishes it")
    if ver and ver.get("verdict") == "verified":
        return next(t for t in doc["trials"] if t["trial"] == ver["winner"])
    if ver and not leading:
        raise UsageError(f"tune {doc.get('name')}: no verified winner (verification {ver.get('verdict')}): "
                         f"{ver.get('why')}", hint=_NEXT.get(str(ver.get("verdict")), "see tune.md"))
    best = doc.get("best") or {}
    verdict = best.get("verdict")
    if verdict == "recommended":
        name = best["best"]
    elif verdict == "undecided" and leading:
        name = best["leading"]
    elif verdict == "undecided":
        steps = "; ".join(f"{u['variant']}: {u['step']}" for u in best.get("undecided") or [])
        raise UsageError(f"tune {doc.get('name')}: undecided: {best.get('leading')} leads, but a lower bound below it "
                         f"could still exceed it ({steps})",
                         hint="take the step named, or pass --leading to apply the leader anyway")
    else:
        raise UsageError(f"tune {doc.get('name')}: no trial has a figure that may be served",
                         hint="see tune.md for each trial's verdict; `servedeck tune FILE --resume` searches on")
    trial = next(t for t in doc["trials"] if t["trial"] == name)
    return trial


def reason(doc: dict[str, Any], trial: dict[str, Any], folder: str) -> str:
    """The `why` written beside each applied value: the trial and the figure that chose it, and what it was not."""
    starter: dict[str, Any] = next((t for t in doc["trials"] if t["trial"] == STARTER), {})
    ge = "≥ " if trial.get("bound") else ""
    than = (f" against the starter's {'≥ ' if starter.get('bound') else ''}{starter['value']:.3g}"
            if starter.get("value") is not None else "")
    head = f"servedeck tune {doc.get('name')} ({folder}), trial {trial['trial']}"
    ver = doc.get("verification") or {}
    if ver.get("verdict") == "verified" and ver.get("winner") == trial["trial"]:
        mine, base = ver["trials"][trial["trial"]], ver["trials"][STARTER]
        r = mine.get("rounds") or {}
        led = f", ahead in {r['won']} of {r['pairs']} rounds" if r.get("pairs") else ""
        held = (f"a paired lead of {r['low']:+.3g}..{r['high']:+.3g} (95 %){led}" if r.get("low") is not None
                else f"a margin of {mine['margin']:.3g} above the spread {mine['spread']:.3g}{led}")
        return (f"{head}: verified: median {mine['median']:.3g} good req/s per GPU within SLO {doc.get('slo')} "
                f"against the starter's {base['median']:.3g} over {ver.get('repeats')} interleaved launches each, "
                f"{held}")
    verdict = (doc.get("best") or {}).get("verdict")
    unverified = (f"its verification: {ver.get('verdict')}, applied with --leading" if ver
                  else "not verified with repeats")
    return (f"{head}: {ge}{trial['value']:.3g} good req/s per GPU within SLO {doc.get('slo')}{than}; {verdict}, "
            f"one measurement each ({unverified})")


def _merge(entry: Any, key: str, values: dict[str, Any]) -> None:
    """Set `values` in the entry's `key` table: an inline one (or none yet) is written anew with the values merged, so
    tomlkit spaces it as one; a [models.X.key] table of its own keeps its layout and gets the keys set."""
    if not values:
        return
    have = entry.get(key)
    if have is None or isinstance(have, tomlkit.items.InlineTable):
        table = tomlkit.inline_table()
        table.update({**(have.unwrap() if have is not None else {}), **values})
        entry[key] = table
    else:
        for k, v in values.items():
            have[k] = v


def applied(text: str, model: str, values: dict[str, Any], why: str) -> str:
    """models.toml's text with `values` ({"args.parallel": 2, "context": 4096}) set on [models.MODEL], each key's
    `why` set to `why`. ConfigError when the file or the entry is not there to change."""
    try:
        doc = tomlkit.parse(text)
    except TOMLKitError as e:
        raise ConfigError(f"models.toml: not valid TOML: {e}", hint="fix the syntax, then apply again") from None
    models = doc.get("models")
    if models is None or model not in models:
        raise ConfigError(f"models.toml has no [models.{model}] entry to apply the tune to",
                          hint="apply with the models.toml the tune ran with (--config)")
    entry = models[model]
    tables: dict[str, dict[str, Any]] = {}
    whys: dict[str, str] = {}
    for key, value in values.items():
        head, _, leaf = key.partition(".")
        if leaf:
            tables.setdefault(head, {})[leaf] = value
        else:
            entry[head] = value
        whys[leaf or head] = why
    for head, vals in tables.items():
        _merge(entry, head, vals)
    _merge(entry, "why", whys)
    return tomlkit.dumps(doc)


def changes(text: str, model: str, values: dict[str, Any]) -> list[tuple[str, Optional[Any], Any]]:
    """(key, value now in the entry or None, value the trial sets) for each key, for the user to read first."""
    entry = (tomlkit.parse(text).get("models") or {}).get(model) or {}
    out = []
    for key, value in values.items():
        head, _, leaf = key.partition(".")
        now = (entry.get(head) or {}).get(leaf) if leaf else entry.get(head)
        out.append((key, None if now is None else getattr(now, "unwrap", lambda n=now: n)(), value))
    return out
