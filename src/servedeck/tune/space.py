"""A tune file's `[search]` table: the space of flags to search, the rules across them, the budget. Pure.

    [search]
    trials = 8                 # the budget: searched trials (the starter is launched besides), and/or
    wall = "30m"               # no trial starts once this much has been spent (one that started runs to its end)
    slo = "interactive"        # the [slo.NAME] the objective reads (default: the only one the capacity workload names)
    seed = 0                   # the sampler's seed
    startup = 3                # trials drawn at random before TPE models the space (default: a third of `trials`)
    outputs_may_differ = false # true: a trial whose greedy outputs differ from the starter's may still win
    check_outputs = true       # false: no output check (nor its prompts) at all
    prune = true               # false: every trial's capacity search runs whole, however far below the best it falls
    verify = { top = 2, repeats = 3 }   # the best `top` trials and the starter launched again, `repeats` each
    require = ["args.ubatch-size <= args.batch-size"]   # a sampled variant that breaks one is never launched
    parallel = 2               # `tune --ray`: searched trials at once (default: as many as the cluster can place)

    [search.space]
    "args.parallel" = [1, 2, 4]                                     # categorical
    "args.batch-size" = { low = 64, high = 2048, log = true }       # integer range, log-scaled
    "args.threads" = { low = 1, high = 2, step = 1 }                # integer range
    "args.draft-max" = { values = [4, 8], when = { "args.spec" = ["ngram"] } }   # only when another took one of these
    kv = { together = [ { "args.cache-type-k" = "f16", "args.cache-type-v" = "f16" },
                        { "args.cache-type-k" = "q8_0", "args.cache-type-v" = "q8_0" } ] }   # flags set as one

A key is a models.toml key a campaign variant may override (`args.NAME`, `env.NAME`, `context`, `tp`, `dp`,
`pp`, `gpu_memory_utilization`, `replicas`, `build`); a `together` entry's own name is free. What each kind of
entry samples is a `Knob`; a new kind is one class and one line in KINDS.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Protocol, Union

from servedeck.timeparse import seconds

# what a knob may set: a variant's overrides (campaign/file.py's OVERRIDABLE), less where it runs
SPACE_KEYS = ("build", "context", "tp", "dp", "pp", "gpu_memory_utilization", "replicas")
Scalar = Union[bool, int, float, str]
# What a wheel's user reads instead of a docs/ path they do not have (issue 50): a tune file in two lines.
DOC = ("a tune file is a campaign file ([campaign] with model and gate, [slo.NAME], a capacity [[workloads]]) "
       "plus [search] (trials = 8 and/or wall = \"2h\") and [search.space] (\"args.parallel\" = [1, 2, 4], "
       "\"args.batch-size\" = { low = 64, high = 2048, log = true })")


class Trial(Protocol):
    """What a knob asks of the search (optuna.Trial has these)."""

    def suggest_categorical(self, name: str, choices: Any) -> Any: ...
    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1, log: bool = False) -> int: ...


class SpaceError(ValueError):
    """One problem with the [search] table: the key path, what is wrong, what to write instead."""

    def __init__(self, where: str, what: str):
        super().__init__(f"{where}: {what}")
        self.where, self.what = where, what


def key_problem(key: str) -> Optional[str]:
    """Why `key` is not a key a knob may set, or None."""
    head, dot, leaf = key.partition(".")
    if head in ("args", "env"):
        if not dot or not leaf:
            return f'name the flag or variable, like "{head}.{"max-num-seqs" if head == "args" else "NAME"}"'
        return None
    if head in SPACE_KEYS and not dot:
        return None
    return (f"not a key a variant may set: expected args.NAME, env.NAME or one of {', '.join(SPACE_KEYS)} "
            "(gpus, cpus and host say where a trial runs, not what it searches)")


@dataclass(frozen=True)
class When:
    """Sample a knob only when every named knob took one of its values (else the model's entry decides)."""

    on: dict[str, tuple[Scalar, ...]]

    def holds(self, taken: dict[str, Any]) -> bool:
        return all(k in taken and taken[k] in vals for k, vals in self.on.items())


@dataclass(frozen=True)
class Categorical:
    name: str
    values: tuple[Scalar, ...]
    when: Optional[When] = None

    def sample(self, trial: Trial) -> dict[str, Any]:
        return {self.name: trial.suggest_categorical(self.name, list(self.values))}

    def describe(self) -> str:
        return " | ".join(str(v) for v in self.values)


@dataclass(frozen=True)
class IntRange:
    name: str
    low: int
    high: int
    step: int = 1
    log: bool = False
    when: Optional[When] = None

    def sample(self, trial: Trial) -> dict[str, Any]:
        return {self.name: trial.suggest_int(self.name, self.low, self.high, step=self.step, log=self.log)}

    def describe(self) -> str:
        return f"{self.low}..{self.high}" + (" log" if self.log else f" step {self.step}" if self.step != 1 else "")


@dataclass(frozen=True)
class Together:
    """Keys that only make sense set as one: one categorical choice among whole sets (labelled for the sampler)."""

    name: str
    options: tuple[dict[str, Scalar], ...]
    when: Optional[When] = None

    @property
    def labels(self) -> list[str]:
        return [",".join(f"{k.split('.')[-1]}={v}" for k, v in o.items()) for o in self.options]

    def sample(self, trial: Trial) -> dict[str, Any]:
        label = trial.suggest_categorical(self.name, self.labels)
        return dict(self.options[self.labels.index(label)])

    def describe(self) -> str:
        return " | ".join(self.labels)


Knob = Union[Categorical, IntRange, Together]

_OPS: dict[str, Callable[[Any, Any], bool]] = {"<=": operator.le, "<": operator.lt, ">=": operator.ge,
                                               ">": operator.gt, "==": operator.eq, "!=": operator.ne}
_RULE = re.compile(r"^\s*(\S+)\s*(<=|>=|==|!=|<|>)\s*(\S+)\s*$")


@dataclass(frozen=True)
class Rule:
    """`args.ubatch-size <= args.batch-size`: a relation between two sampled keys (or a key and a number).
    A side the trial did not set leaves the rule unchecked (the engine's own default decides)."""

    text: str
    left: str
    op: str
    right: Union[str, float]

    def broken(self, values: dict[str, Any]) -> bool:
        if self.left not in values:
            return False
        right = self.right if not isinstance(self.right, str) else values.get(self.right)
        if right is None:
            return False
        try:
            return not _OPS[self.op](values[self.left], right)
        except TypeError:
            return True


@dataclass(frozen=True)
class Space:
    knobs: tuple[Knob, ...]
    rules: tuple[Rule, ...] = ()
    trials: Optional[int] = None
    wall_s: Optional[float] = None
    wall: Optional[str] = None
    slo: Optional[str] = None
    seed: Optional[int] = None
    startup: Optional[int] = None
    outputs_may_differ: bool = False
    check_outputs: bool = True
    prune: bool = True  # a trial's search stops once it cannot carry the best figure so far (objective: below-best)
    keys: tuple[str, ...] = field(default=())  # every models.toml key the knobs may set
    verify_top: int = 2  # trials verified after the search (0: none, `verify = false`)
    verify_repeats: int = 3  # launches of each verified trial and of the starter, interleaved
    parallel: Optional[int] = None  # `tune --ray`: searched trials at once (None: as many as the cluster places)

    def sample(self, trial: Trial) -> dict[str, Any]:
        """The sampled variant as {"args.parallel": 4, ...}, knobs in file order (a `when` reads those before it)."""
        taken: dict[str, Any] = {}
        for k in self.knobs:
            if k.when is None or k.when.holds(taken):
                taken.update(k.sample(trial))
        return taken

    def point(self, known: dict[str, Any]) -> dict[str, Any]:
        """Where a configuration lies in the space, in the sampler's terms ({knob name: value, or a together knob's
        label}): `known` maps keys to the configuration's values ({"args.parallel": 4, ...}). A knob whose key is
        not known, or whose value is outside it (not one of its values, out of its range or off its step), is left
        out; a `when` is read as sample() reads it."""
        out: dict[str, Any] = {}
        taken: dict[str, Any] = {}
        for k in self.knobs:
            if k.when is not None and not k.when.holds(taken):
                continue
            if isinstance(k, Together):
                hit = next((i for i, o in enumerate(k.options)
                            if all(key in known and known[key] == v for key, v in o.items())), None)
                if hit is not None:
                    out[k.name] = k.labels[hit]
                    taken.update(k.options[hit])
                continue
            if k.name not in known:
                continue
            v = known[k.name]
            if isinstance(k, Categorical):
                inside = any(type(v) is type(c) and v == c for c in k.values)  # 1 is not True
            else:
                inside = _is_int(v) and k.low <= v <= k.high and (v - k.low) % k.step == 0
            if inside:
                out[k.name] = v
                taken[k.name] = v
        return out

    def broken_rules(self, values: dict[str, Any]) -> list[str]:
        return [r.text for r in self.rules if r.broken(values)]

    @property
    def startup_trials(self) -> int:
        """Random draws before TPE models the space: a third of the budget, at least 2, at most 10."""
        if self.startup is not None:
            return self.startup
        return max(2, min(10, (self.trials or 15) // 3))


def known_values(keys: tuple[str, ...], model: Any, engine: Any, booted: Optional[dict[str, Any]] = None
                 ) -> dict[str, Any]:
    """A models.toml entry's value for each key a space searches ("args.parallel", "env.X", "context", ...): what the
    entry sets, else for an args key the engine's fixed default (Engine.flag_defaults; `engine` may be None), else
    what a launch of it took at boot (`booted`: Engine.booted_flags of its log, like llama.cpp's threads). Flags
    are matched in the engine's own spelling (`-np` and `parallel` are one flag). Keys with none are left out."""
    out: dict[str, Any] = {}
    canon = engine.canonical_flag if engine is not None else (lambda k: k)
    given = {canon(k): v for k, v in (getattr(model, "args", None) or {}).items()}
    defaults = {**(booted or {}), **(getattr(engine, "flag_defaults", None) or {})}
    for key in keys:
        head, _, leaf = key.partition(".")
        if head == "args":
            flag = canon(leaf)
            if flag in given:
                out[key] = given[flag]
            elif flag in defaults:
                out[key] = defaults[flag]
        elif head == "env":
            env = getattr(model, "env", None) or {}
            if leaf in env:
                out[key] = env[leaf]
        elif getattr(model, key, None) is not None:
            out[key] = getattr(model, key)
    return out


def overrides(values: dict[str, Any]) -> dict[str, Any]:
    """{"args.parallel": 4, "context": 4096} → a variant's overrides {"args": {"parallel": 4}, "context": 4096}."""
    out: dict[str, Any] = {}
    for key, v in values.items():
        head, _, leaf = key.partition(".")
        if leaf:
            out.setdefault(head, {})[leaf] = v
        else:
            out[head] = v
    return out


# --- reading the table -----------------------------------------------------------------------------

_SEARCH_KEYS = {"trials", "wall", "slo", "seed", "startup", "outputs_may_differ", "check_outputs", "require", "space",
                "verify", "parallel", "prune"}
_SCALARS = (bool, int, float, str)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _scalars(where: str, values: Any) -> tuple[Scalar, ...]:
    if not isinstance(values, list) or not values:
        raise SpaceError(where, f"expected a non-empty list of values, got {values!r}: write it like [1, 2, 4]")
    bad = [v for v in values if not isinstance(v, _SCALARS)]
    if bad:
        raise SpaceError(where, f"{bad[0]!r} is not a flag value: expected numbers, strings or true/false")
    if len(set(map(repr, values))) != len(values):
        raise SpaceError(where, f"a value is listed twice in {values!r}: list each once")
    return tuple(values)


def _when(where: str, raw: Any) -> Optional[When]:
    if raw is None:
        return None
    if not isinstance(raw, dict) or not raw:
        raise SpaceError(f"{where}.when", f'expected a table like {{ "args.spec" = ["ngram"] }}, got {raw!r}')
    on = {}
    for k, v in raw.items():
        on[k] = _scalars(f'{where}.when."{k}"', v if isinstance(v, list) else [v])
    return When(on)


def _int_range(where: str, name: str, raw: dict[str, Any], when: Optional[When]) -> IntRange:
    extra = set(raw) - {"low", "high", "step", "log", "when"}
    if extra:
        raise SpaceError(where, f"unknown key {sorted(extra)[0]!r}: an integer range takes low, high, step, log, when")
    for k in ("low", "high"):
        if k not in raw:
            raise SpaceError(where, f"an integer range needs {k}: write it like {{ low = 64, high = 2048 }}")
        if not _is_int(raw[k]):
            raise SpaceError(f"{where}.{k}", f"expected an integer, got {raw[k]!r} (ranges are integer; list floats "
                                             "as values = [...])")
    low, high = raw["low"], raw["high"]
    step, log = raw.get("step", 1), raw.get("log", False)
    if not isinstance(log, bool):
        raise SpaceError(f"{where}.log", f"expected true or false, got {log!r}")
    if not _is_int(step) or step < 1:
        raise SpaceError(f"{where}.step", f"expected an integer of 1 or more, got {step!r}")
    if low > high:
        raise SpaceError(where, f"low = {low} is above high = {high}: expected low <= high; swap them")
    if log and low < 1:
        raise SpaceError(f"{where}.low", f"a log-scaled range starts at 1 or more, got {low}: raise low or drop log")
    if log and step != 1:
        raise SpaceError(where, "step and log do not go together (a log range samples every integer): drop one")
    if (high - low) % step:
        raise SpaceError(where, f"high - low = {high - low} is not a multiple of step = {step}: make it one")
    return IntRange(name, low, high, step, log, when)


def _knob(name: str, raw: Any) -> Knob:
    where = f'search.space."{name}"'
    if isinstance(raw, list):
        if (problem := key_problem(name)) is not None:
            raise SpaceError(where, problem)
        return Categorical(name, _scalars(where, raw))
    if not isinstance(raw, dict):
        raise SpaceError(where, f"expected a list of values [1, 2, 4] or a table ({{ low = 1, high = 8 }}, "
                                f"{{ values = [...] }}, {{ together = [...] }}), got {raw!r}")
    when = _when(where, raw.get("when"))
    if "together" in raw:
        extra = set(raw) - {"together", "when"}
        if extra:
            raise SpaceError(where, f"unknown key {sorted(extra)[0]!r} beside together (it takes together and when)")
        opts = raw["together"]
        if not isinstance(opts, list) or len(opts) < 2 or not all(isinstance(o, dict) and o for o in opts):
            raise SpaceError(f"{where}.together", "expected two or more tables of keys set as one, like "
                                                  '[{ "args.cache-type-k" = "f16", "args.cache-type-v" = "f16" }, ...]')
        for i, o in enumerate(opts):
            for k, v in o.items():
                if (problem := key_problem(k)) is not None:
                    raise SpaceError(f'{where}.together[{i}]."{k}"', problem)
                if not isinstance(v, _SCALARS):
                    raise SpaceError(f'{where}.together[{i}]."{k}"', f"{v!r} is not a flag value")
        if len({tuple(sorted(o)) for o in opts}) != 1:
            raise SpaceError(f"{where}.together", "every set names the same keys (a key one set leaves out would "
                                                  "keep the model's value in some trials and not in others)")
        return Together(name, tuple(dict(o) for o in opts), when)
    if (problem := key_problem(name)) is not None:
        raise SpaceError(where, problem + " (a name that is not a key is a group: { together = [...] })")
    if "values" in raw:
        extra = set(raw) - {"values", "when"}
        if extra:
            raise SpaceError(where, f"unknown key {sorted(extra)[0]!r} beside values (it takes values and when)")
        return Categorical(name, _scalars(f"{where}.values", raw["values"]), when)
    if "low" in raw or "high" in raw:
        return _int_range(where, name, raw, when)
    raise SpaceError(where, "expected values = [...], low/high (an integer range) or together = [...]")


def _rule(i: int, text: Any, keys: set[str]) -> Rule:
    where = f"search.require[{i}]"
    m = _RULE.match(text) if isinstance(text, str) else None
    if not m:
        raise SpaceError(where, f'expected a relation like "args.ubatch-size <= args.batch-size", got {text!r}')
    left, op, right = m.groups()
    if left not in keys:
        raise SpaceError(where, f"{left!r} is not a key of search.space (keys: {', '.join(sorted(keys))})")
    try:
        value: Union[str, float] = float(right)
    except ValueError:
        if right not in keys:
            raise SpaceError(where, f"{right!r} is neither a number nor a key of search.space") from None
        value = right
    return Rule(text, left, op, value)


def parse_search(raw: Any) -> Space:
    """The [search] table → a Space, or SpaceError naming the first key path that is wrong and what to write."""
    if not isinstance(raw, dict):
        raise SpaceError("search", "a tune file needs a [search] table with a space and a budget (trials or wall)")
    extra = set(raw) - _SEARCH_KEYS
    if extra:
        raise SpaceError(f"search.{sorted(extra)[0]}", f"unknown key: [search] takes {', '.join(sorted(_SEARCH_KEYS))}")
    trials, wall = raw.get("trials"), raw.get("wall")
    if trials is None and wall is None:
        raise SpaceError("search", 'no budget: give trials = N, wall = "30m", or both')
    if trials is not None and (not _is_int(trials) or trials < 1):
        raise SpaceError("search.trials", f"expected a whole number of 1 or more, got {trials!r}")
    wall_s = None
    if wall is not None:
        try:
            wall_s = seconds(str(wall), "wall")
        except Exception:
            raise SpaceError("search.wall", f"{wall!r} is not a duration: write it like 90m or 2h") from None
        if not isinstance(wall, str) or wall_s <= 0:
            raise SpaceError("search.wall", f'expected a duration above 0 in quotes, like "30m"; got {wall!r}')
    par = raw.get("parallel")
    if par is not None and (not _is_int(par) or par < 1):
        raise SpaceError("search.parallel", f"expected a whole number of 1 or more (searched trials at once on "
                                            f"Ray), got {par!r}")
    for k in ("seed", "startup"):
        v = raw.get(k)
        if v is not None and (not _is_int(v) or v < 0):
            raise SpaceError(f"search.{k}", f"expected a whole number of 0 or more, got {v!r}")
    for k in ("outputs_may_differ", "check_outputs", "prune"):
        v = raw.get(k)
        if v is not None and not isinstance(v, bool):
            raise SpaceError(f"search.{k}", f"expected true or false (a TOML boolean, no quotes), got {v!r}")
    slo = raw.get("slo")
    if slo is not None and not isinstance(slo, str):
        raise SpaceError("search.slo", f'expected the name of an [slo.NAME] table, like "interactive"; got {slo!r}')
    space = raw.get("space")
    if not isinstance(space, dict) or not space:
        raise SpaceError("search.space", 'nothing to search: add keys like "args.parallel" = [1, 2, 4] under '
                                         "[search.space]")
    knobs = tuple(_knob(name, v) for name, v in space.items())
    sets = [k for knob in knobs for k in ((knob.name,) if not isinstance(knob, Together) else knob.options[0])]
    twice = sorted({k for k in sets if sets.count(k) > 1})
    if twice:
        raise SpaceError("search.space", f"{twice[0]!r} is set by two entries: let one entry set each key")
    names = [k.name for k in knobs]
    for i, knob in enumerate(knobs):  # a `when` reads knobs sampled before it
        for on in (knob.when.on if knob.when else {}):
            key_of = {k: j for j, kn in enumerate(knobs)
                      for k in ((kn.name,) if not isinstance(kn, Together) else (kn.name, *kn.options[0]))}
            if on not in key_of:
                raise SpaceError(f'search.space."{knob.name}".when', f"{on!r} is not searched (entries: {', '.join(names)})")
            if key_of[on] >= i:
                raise SpaceError(f'search.space."{knob.name}".when', f"{on!r} comes later in [search.space]: "
                                                                     "list it before the entry that depends on it")
    require = raw.get("require", [])
    if not isinstance(require, list):
        raise SpaceError("search.require", 'expected a list like ["args.ubatch-size <= args.batch-size"]')
    rules = tuple(_rule(i, r, set(sets)) for i, r in enumerate(require))
    top, repeats = _verify(raw.get("verify", {}))
    return Space(knobs, rules, trials, wall_s, wall, slo, raw.get("seed"), raw.get("startup"),
                 bool(raw.get("outputs_may_differ", False)), bool(raw.get("check_outputs", True)),
                 bool(raw.get("prune", True)), tuple(sets), top, repeats, par)


def _verify(raw: Any) -> tuple[int, int]:
    """`verify = { top = 2, repeats = 3 }` (either key may be left out) or `verify = false` → (top, repeats)."""
    if raw is False:
        return 0, 0
    if not isinstance(raw, dict):
        raise SpaceError("search.verify", f"expected {{ top = 2, repeats = 3 }} or false, got {raw!r}")
    extra = set(raw) - {"top", "repeats"}
    if extra:
        raise SpaceError(f"search.verify.{sorted(extra)[0]}", "unknown key: verify takes top and repeats")
    top, repeats = raw.get("top", 2), raw.get("repeats", 3)
    if not _is_int(top) or top < 1:
        raise SpaceError("search.verify.top", f"expected a whole number of 1 or more (how many of the best trials are "
                                              f"launched again), got {top!r}; verify = false verifies none")
    if not _is_int(repeats) or repeats < 2:
        raise SpaceError("search.verify.repeats", f"expected a whole number of 2 or more (one launch has no spread "
                                                  f"to hold a margin against), got {repeats!r}")
    return top, repeats


def grid_size(space: Space) -> Optional[int]:
    """How many launches a grid over this space would take (None: a range too wide to call a grid)."""
    n = 1
    for k in space.knobs:
        if isinstance(k, IntRange):
            count = (k.high - k.low) // k.step + 1
            n *= count if not k.log else max(1, int(math.log2(k.high / k.low)) + 1)
        elif isinstance(k, Categorical):
            n *= len(k.values)
        else:
            n *= len(k.options)
    return n
