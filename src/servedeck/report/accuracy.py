"""Accuracy of A against B on the same questions: McNemar's exact test and the paired difference's interval.

A sample of A is paired with B's sample of the same id, and only when their prompt digests agree (the same
question, checked, not assumed). Of the pairs, only the discordant ones carry evidence: `gained` (A wrong,
B right) and `lost` (A right, B wrong).

    p value    McNemar's exact test: under "no difference", each discordant pair goes either way with
               probability 1/2, so p is the two-sided binomial tail of min(gained, lost) of gained + lost
               (scipy.stats.binomtest).
    interval   of B's accuracy minus A's, in points: Newcombe's hybrid score interval for a paired
               difference (Newcombe 1998, "method 10"): Wilson intervals of each side's accuracy, joined
               with the pairs' correlation. Hand-written (a dozen lines; statsmodels, which has none
               either, is not a dependency); it stays inside [-100, 100] and behaves at 0 or all
               discordant pairs, where a Wald interval collapses.

The verdict names the difference only when p < ALPHA; otherwise "no difference distinguishable".
Every figure here is computed from the sample files (gates/samples.py), pure.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional, Sequence

ALPHA = 0.05
CONFIDENCE = 0.95


@dataclass
class PairedAccuracy:
    gate: str  # "eval"
    pairs: int
    a_correct: int
    b_correct: int
    gained: int  # A wrong, B right
    lost: int  # A right, B wrong
    difference: float  # B − A, in points (percent of the pairs)
    low: float
    high: float
    p_value: float
    distinguishable: bool
    text: str
    unpaired: int = 0  # samples on one side only, or whose digests differ: left out, and said

    @property
    def a_accuracy(self) -> float:
        return self.a_correct / self.pairs if self.pairs else 0.0

    @property
    def b_accuracy(self) -> float:
        return self.b_correct / self.pairs if self.pairs else 0.0

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "a_accuracy": self.a_accuracy, "b_accuracy": self.b_accuracy}


def mcnemar_exact(gained: int, lost: int) -> float:
    """Two-sided exact McNemar p value from the discordant pairs."""
    from scipy.stats import binomtest  # here, not at the top: scipy.stats takes ~0.4 s (report/stats.py)

    m = gained + lost
    return 1.0 if m == 0 else float(binomtest(min(gained, lost), m, 0.5).pvalue)


def _wilson(k: int, n: int, z: float) -> tuple[float, float]:
    if n == 0:
        return 0.0, 1.0
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return max(0.0, centre - half), min(1.0, centre + half)


def newcombe_paired(both: int, lost: int, gained: int, neither: int,
                    confidence: float = CONFIDENCE) -> tuple[float, float, float]:
    """B − A (as fractions) and its interval, from the 2×2 table of pairs (A right & B right, A right & B
    wrong, A wrong & B right, both wrong): Newcombe's method 10."""
    from scipy.stats import norm

    n = both + lost + gained + neither
    if n == 0:
        return 0.0, -1.0, 1.0
    z = float(norm.ppf(0.5 + confidence / 2))
    p1, p2 = (both + lost) / n, (both + gained) / n  # A's and B's accuracy
    l1, u1 = _wilson(both + lost, n, z)
    l2, u2 = _wilson(both + gained, n, z)
    denom = (both + lost) * (gained + neither) * (both + gained) * (lost + neither)
    # the pairs' correlation, as Newcombe's method 10 takes it (Altman et al., Statistics with Confidence,
    # 2000, p. 52): a positive cross-product shrunk by n/2, a negative one kept
    cross = both * neither - lost * gained
    cross = cross - n / 2 if cross > n / 2 else cross if cross < 0 else 0.0
    phi = cross / math.sqrt(denom) if denom > 0 else 0.0
    d = p2 - p1
    below = math.sqrt(max(0.0, (p2 - l2) ** 2 - 2 * phi * (p2 - l2) * (u1 - p1) + (u1 - p1) ** 2))
    above = math.sqrt(max(0.0, (u2 - p2) ** 2 - 2 * phi * (u2 - p2) * (p1 - l1) + (p1 - l1) ** 2))
    return d, max(-1.0, d - below), min(1.0, d + above)


def _pts(x: float) -> str:
    return f"{abs(x) * 100:.1f}"


def paired(a: Sequence[Mapping[str, Mapping[str, Any]]], b: Sequence[Mapping[str, Mapping[str, Any]]],
           gate: str = "eval") -> Optional[PairedAccuracy]:
    """A's and B's samples (one dict id → sample line per launch; launch i of A with launch i of B) →
    the paired comparison, or None when no sample pairs."""
    both = lost = gained = neither = unpaired = 0
    for sa, sb in zip(a, b):
        for sid, x in sa.items():
            y = sb.get(sid)
            if y is None or x.get("prompt_digest") != y.get("prompt_digest"):
                unpaired += 1
                continue
            ra, rb = bool(x.get("correct")), bool(y.get("correct"))
            both += ra and rb
            lost += ra and not rb
            gained += rb and not ra
            neither += not ra and not rb
        unpaired += sum(1 for sid in sb if sid not in sa)
    n = both + lost + gained + neither
    if n == 0:
        return None
    d, low, high = newcombe_paired(both, lost, gained, neither)
    p = mcnemar_exact(gained, lost)
    yes = p < ALPHA
    tail = f"(paired, {n:,} samples, p = {p:.3g})"
    if yes:
        text = (f"B {'gained' if d > 0 else 'lost'} {_pts(d)} points "
                f"[{_pts(low if d > 0 else high)}, {_pts(high if d > 0 else low)}] {tail}")
    else:
        text = (f"no difference distinguishable (B {'+' if d >= 0 else '-'}{_pts(d)} points "
                f"[{low * 100:+.1f}, {high * 100:+.1f}] {tail})")
    if unpaired:
        text += f"; {unpaired} samples without a partner left out"
    return PairedAccuracy(gate, n, both + lost, both + gained, gained, lost, d * 100, low * 100, high * 100, p,
                          yes, text, unpaired)


def launch_samples(runs: Sequence[Any], gate: str = "eval") -> list[dict[str, dict[str, Any]]]:
    """Each launch's samples of `gate` (id → line), in the order of `runs`: the runs of one launch (its gate
    run and the bench runs citing it) count once."""
    from servedeck.gates.samples import read_samples, record_of

    out, seen = [], set()
    for r in runs:
        rec = (r.view.get("gates") or {}).get(gate)
        if not isinstance(rec, dict):
            continue
        f = record_of(r.path, gate, rec)
        if f is None or f.resolve() in seen:
            continue
        seen.add(f.resolve())
        out.append({str(x.get("id")): x for x in read_samples(r.path, gate, rec)})
    return out


def gate_names(runs: Sequence[Any]) -> list[str]:
    return list(dict.fromkeys(name for r in runs for name in (r.view.get("gates") or {})))


def compare_runs(a: Sequence[Any], b: Sequence[Any]) -> list[PairedAccuracy]:
    """Every accuracy gate both sides ran, paired launch by launch."""
    out = []
    for name in gate_names(a):
        if name in gate_names(b):
            got = paired(launch_samples(a, name), launch_samples(b, name), name)
            if got is not None:
                out.append(got)
    return out
