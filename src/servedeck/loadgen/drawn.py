"""A length or a pause that is fixed or drawn from a distribution, per turn (the conversations workload).
(loadgen/spread.py is something else: requests spread over replicas.)

    256                 fixed
    uniform:128-512     uniform between the two, both included
    normal:256,64       mean 256, standard deviation 64, clipped at mean ± 3 sd (and at the least allowed)
    exp:256             exponential with mean 256, clipped at its 99th percentile (mean × ln 100)

Durations take units on every number: `2s`, `uniform:1s-3s`, `normal:2s,500ms`, `exp:2s`. Every draw takes a
`random.Random`, so a seeded run draws the same lengths. Each spread is bounded (`low`, `high`), so a context
or an output cap can be checked before a launch against the longest a draw can be. numpy's generators would
do the draws; `random.Random` is what the workloads already seed per user, so one seed gives one run.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Callable, Literal, Optional

from servedeck.errors import UsageError
from servedeck.timeparse import seconds

Kind = Literal["fixed", "uniform", "normal", "exp"]
EXP_CLIP = math.log(100)  # an exponential draw is clipped at its 99th percentile: mean × ln 100


@dataclass(frozen=True)
class Drawn:
    kind: Kind
    a: float  # fixed: the value; uniform: low; normal, exp: the mean
    b: float = 0.0  # uniform: high; normal: the standard deviation
    least: float = 0.0  # no draw goes below this (a turn's 16 tokens, an answer's 1)
    integer: bool = True  # token counts: whole numbers; durations: seconds

    @property
    def mean(self) -> float:
        return (self.a + self.b) / 2 if self.kind == "uniform" else self.a

    @property
    def low(self) -> float:
        lo = {"fixed": self.a, "uniform": self.a, "normal": self.a - 3 * self.b, "exp": 0.0}[self.kind]
        return self._round(max(self.least, lo))

    @property
    def high(self) -> float:
        hi = {"fixed": self.a, "uniform": self.b, "normal": self.a + 3 * self.b, "exp": self.a * EXP_CLIP}[self.kind]
        return self._round(max(self.least, hi))

    def draw(self, rng: random.Random) -> float:
        if self.kind == "fixed":
            x = self.a
        elif self.kind == "uniform":
            x = rng.randint(int(self.a), int(self.b)) if self.integer else rng.uniform(self.a, self.b)
        elif self.kind == "normal":
            x = min(max(rng.gauss(self.a, self.b), self.a - 3 * self.b), self.a + 3 * self.b)
        else:
            x = min(rng.expovariate(1 / self.a), self.a * EXP_CLIP) if self.a > 0 else 0.0
        return self._round(max(self.least, x))

    def _round(self, x: float) -> float:
        return float(round(x)) if self.integer else x

    @property
    def fixed(self) -> bool:
        return self.kind == "fixed"

    @property
    def text(self) -> str:
        f: Callable[[float], str] = (lambda x: f"{x:g}") if self.integer else (lambda x: f"{x:g}s")
        return {"fixed": f(self.a), "uniform": f"uniform:{f(self.a)}-{f(self.b)}",
                "normal": f"normal:{f(self.a)},{f(self.b)}", "exp": f"exp:{f(self.a)}"}[self.kind]

    def to_json(self) -> dict[str, object]:
        return {"text": self.text, "kind": self.kind, "mean": self.mean, "low": self.low, "high": self.high}


def fixed(value: float, least: float = 0.0, integer: bool = True) -> Drawn:
    return Drawn("fixed", value, least=least, integer=integer)


def parse_drawn(text: str, flag: str, *, least: float, integer: bool = True,
                 example: Optional[str] = None) -> Drawn:
    """`256`, `uniform:128-512`, `normal:256,64`, `exp:256` (durations with units: `2s`, `exp:2s`) → a Drawn;
    a UsageError names the flag, the text and what was expected."""
    t = (text or "").strip()
    ex = example or ("256, uniform:128-512, normal:256,64 or exp:256" if integer
                     else "2s, uniform:1s-3s, normal:2s,500ms or exp:2s")
    kind, _, rest = t.partition(":") if ":" in t else ("fixed", "", t)

    def num(s: str) -> float:
        s = s.strip()
        if integer:
            try:
                v = float(s)
            except ValueError:
                raise UsageError(f"{flag}: {s!r} in {text!r} is not a number of tokens", hint=f"e.g. {ex}") from None
            if v != int(v):
                raise UsageError(f"{flag}: {s!r} in {text!r} is not a whole number of tokens", hint=f"e.g. {ex}")
            return v
        return 0.0 if s in ("0", "0s") else seconds(s, flag)

    if kind == "fixed":
        sp = Drawn("fixed", num(rest), least=least, integer=integer)
    elif kind == "uniform":
        lo, sep, hi = rest.partition("-")
        if not sep:
            raise UsageError(f"{flag}: {text!r}: a uniform spread is uniform:LOW-HIGH", hint=f"e.g. {ex}")
        sp = Drawn("uniform", num(lo), num(hi), least=least, integer=integer)
        if sp.b < sp.a:
            raise UsageError(f"{flag}: {text!r}: the high end is below the low one", hint=f"e.g. {ex}")
    elif kind == "normal":
        mean, sep, sd = rest.partition(",")
        if not sep:
            raise UsageError(f"{flag}: {text!r}: a normal spread is normal:MEAN,SD", hint=f"e.g. {ex}")
        sp = Drawn("normal", num(mean), num(sd), least=least, integer=integer)
        if sp.b < 0:
            raise UsageError(f"{flag}: {text!r}: a standard deviation is 0 or more", hint=f"e.g. {ex}")
    elif kind == "exp":
        sp = Drawn("exp", num(rest), least=least, integer=integer)
    else:
        raise UsageError(f"{flag}: {text!r}: {kind!r} is not a spread (fixed, uniform, normal or exp)",
                         hint=f"e.g. {ex}")
    if sp.mean < least:
        unit = "tokens" if integer else "s"
        raise UsageError(f"{flag} must be at least {least:g} {unit}, got {text!r}", hint=f"e.g. {ex}")
    return sp
