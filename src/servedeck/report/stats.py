"""Whether a difference is real: paired and unpaired bootstrap intervals, intervals across repeats,
drift. scipy does the resampling and the t quantiles; what is decided from them is here, pure.

Every interval is of the relative change of B against A (B/A − 1), so a verdict reads the same way
for every figure: "B is 12 % faster [8 %, 15 %] (95 %)". A change whose interval straddles zero, or
whose estimate is within the noise threshold (criterion.rs's idea: run-to-run drift of a few percent
is normal on a shared machine), is "not distinguishable from noise".
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence

if TYPE_CHECKING:
    import numpy as np

# numpy and scipy.stats are imported where they are used: scipy takes ~0.4 s and numpy ~0.1 s, and
# every `servedeck` command (status, start, switch) imports this module through the CLI's command
# tree without computing an interval.

CONFIDENCE = 0.95
RESAMPLES = 4000
NOISE = 0.02  # relative changes below this are reported as noise even when the interval excludes zero
MIN_N = 3


@dataclass
class Verdict:
    figure: str  # e.g. "TTFT p50"
    method: str  # paired bootstrap | unpaired bootstrap | repeats (Welch t) | none
    n_a: int
    n_b: int
    a: Optional[float]  # A's estimate (median, or mean across repeats)
    b: Optional[float]
    change: Optional[float]  # B/A − 1
    low: Optional[float]
    high: Optional[float]
    distinguishable: bool
    text: str
    p_value: Optional[float] = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _rel_medians(a: np.ndarray, b: np.ndarray, axis: int = -1) -> np.ndarray:
    import numpy as np

    return np.median(b, axis=axis) / np.median(a, axis=axis) - 1.0


def _interval(res: Any) -> tuple[float, float]:
    ci = res.confidence_interval
    return float(ci.low), float(ci.high)


def paired(a: Sequence[float], b: Sequence[float], *, seed: int = 0) -> tuple[float, float, float]:
    """(change, low, high) of median(B)/median(A) − 1, resampling the pairs together (percentile bootstrap)."""
    import numpy as np
    from scipy import stats as st

    xa, xb = np.asarray(a, float), np.asarray(b, float)
    if np.array_equal(xa, xb):
        # every pair the same: each resample's change is 0 where it is defined, and a resample whose
        # A-median is a 0 (a TPOT whose tokens were read at once) would make the whole interval NaN
        return 0.0, 0.0, 0.0
    res = st.bootstrap((xa, xb), _rel_medians, paired=True, vectorized=True, n_resamples=RESAMPLES,
                       confidence_level=CONFIDENCE, method="percentile", rng=np.random.default_rng(seed))
    lo, hi = _interval(res)
    return float(_rel_medians(xa, xb)), lo, hi


def unpaired(a: Sequence[float], b: Sequence[float], *, seed: int = 0) -> tuple[float, float, float, float]:
    """(change, low, high, Mann–Whitney p) for independent samples, each resampled on its own."""
    import numpy as np
    from scipy import stats as st

    xa, xb = np.asarray(a, float), np.asarray(b, float)
    res = st.bootstrap((xa, xb), _rel_medians, paired=False, vectorized=True, n_resamples=RESAMPLES,
                       confidence_level=CONFIDENCE, method="percentile", rng=np.random.default_rng(seed))
    lo, hi = _interval(res)
    p = float(st.mannwhitneyu(xa, xb, alternative="two-sided").pvalue)
    return float(_rel_medians(xa, xb)), lo, hi, p


def across_repeats(a: Sequence[float], b: Sequence[float]) -> tuple[float, float, float]:
    """(change, low, high) of mean(B)/mean(A) − 1 from each side's repeats (Welch's t interval of the
    difference of means, divided by A's mean)."""
    import numpy as np
    from scipy import stats as st

    xa, xb = np.asarray(a, float), np.asarray(b, float)
    ci = st.ttest_ind(xb, xa, equal_var=False).confidence_interval(CONFIDENCE)
    m = float(xa.mean())
    return float(xb.mean() / m - 1.0), float(ci.low) / m, float(ci.high) / m


def _pct(x: float) -> str:
    return f"{abs(x) * 100:.1f} %" if abs(x) < 0.1 else f"{abs(x) * 100:.0f} %"


def _words(change: float, lower_is_better: bool) -> str:
    if lower_is_better:
        return "faster" if change < 0 else "slower"
    return "higher" if change > 0 else "lower"


def judge(figure: str, method: str, a_vals: Sequence[float], b_vals: Sequence[float], *,
          lower_is_better: bool, noise: float = NOISE) -> Verdict:
    """A verdict on one figure. `method`: "paired", "unpaired" or "repeats"."""
    n_a, n_b = len(a_vals), len(b_vals)
    need = 2 if method == "repeats" else MIN_N
    import numpy as np

    est_a = float(np.mean(a_vals) if method == "repeats" else np.median(a_vals)) if n_a else None
    est_b = float(np.mean(b_vals) if method == "repeats" else np.median(b_vals)) if n_b else None
    label = {"paired": "paired bootstrap", "unpaired": "unpaired bootstrap", "repeats": "repeats, Welch t"}[method]
    if n_a < need or n_b < need or not est_a:
        change = (est_b / est_a - 1.0) if est_a and est_b is not None else None
        why = (f"one launch per side: {label.split(',')[0]} needs at least {need} per side"
               if method == "repeats" else f"too few requests ({n_a} vs {n_b}; at least {need} each)")
        txt = f"no interval: {why}" + (f"; B − A = {change * 100:+.1f} % untested" if change is not None else "")
        return Verdict(figure, "none", n_a, n_b, est_a, est_b, change, None, None, False, txt)
    p = None
    if method == "paired":
        change, lo, hi = paired(a_vals, b_vals)
    elif method == "unpaired":
        change, lo, hi, p = unpaired(a_vals, b_vals)
    else:
        change, lo, hi = across_repeats(a_vals, b_vals)
    n_txt = f"{n_a} pairs" if method == "paired" else f"n = {n_a} vs {n_b}"
    tail = f"({CONFIDENCE * 100:.0f} %, {label}, {n_txt})"
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return Verdict(figure, method, n_a, n_b, est_a, est_b, change, None, None, False,
                       f"no interval (the resamples were degenerate) {tail}", p)
    straddles = lo <= 0.0 <= hi
    if straddles or abs(change) < noise:
        why = "" if straddles else f", within the ±{noise:.0%} noise threshold"
        txt = (f"no difference distinguishable from noise at this sample size{why}: "
               f"B − A = {change * 100:+.1f} % [{lo * 100:+.1f} %, {hi * 100:+.1f} %] {tail}")
        return Verdict(figure, method, n_a, n_b, est_a, est_b, change, lo, hi, False, txt, p)
    # the interval of the improvement, in the verdict's own direction
    lo_w, hi_w = sorted((abs(lo), abs(hi)))
    txt = f"B is {_pct(change)} {_words(change, lower_is_better)} [{_pct(lo_w)}, {_pct(hi_w)}] {tail}"
    return Verdict(figure, method, n_a, n_b, est_a, est_b, change, lo, hi, True, txt, p)


@dataclass
class Spread:
    n: int
    mean: Optional[float]
    low: Optional[float]
    high: Optional[float]
    values: list[float]
    drift: Optional[str]  # "rising" | "falling" when monotonic across ≥ 3 repeats


def spread(values: Sequence[float]) -> Spread:
    """Mean with a t interval across repeats, and a drift flag (a figure that only rises or only falls)."""
    v = [float(x) for x in values if x is not None and math.isfinite(x)]
    n = len(v)
    if not n:
        return Spread(0, None, None, None, [], None)
    import numpy as np

    m = float(np.mean(v))
    lo = hi = None
    if n >= 2:
        from scipy import stats as st

        half = float(st.t.ppf(0.5 + CONFIDENCE / 2, n - 1) * np.std(v, ddof=1) / math.sqrt(n))
        lo, hi = m - half, m + half
    drift = None
    if n >= 3:
        d = np.diff(v)
        drift = "rising" if np.all(d > 0) else "falling" if np.all(d < 0) else None
    return Spread(n, m, lo, hi, v, drift)
