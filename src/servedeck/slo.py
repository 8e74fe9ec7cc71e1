"""A latency target (an SLO) and whether a measured point met it, judged from its request records.

    ttft_p95<=2s,tpot_p95<=50ms,itl_p99<=100ms,e2e_p90<=30s,error_rate<=1%

A latency threshold `FIGURE_pP<=LIMIT` is met when at least P % of the point's measured requests are
within LIMIT (the inverted-CDF percentile: the value at rank ceil(P/100 · n) is at or under it). A
request that failed (an error, a timeout, a cancelled stream) misses every threshold: it counts as an
infinite value. ITL is per token gap, pooled over the requests (as docs/loadgen.md defines it); a failed
request adds as many infinite gaps as the point's requests were to produce, so it weighs as much as a
finished one. Goodput: requests per second that met every threshold on their own (a request's ITL by
its own P-th percentile gap). Parsing is pure and refuses, naming the part, whatever it cannot read.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Any, Optional, Sequence

from servedeck.errors import UsageError
from servedeck.loadgen.records import RequestRecord
from servedeck.loadgen.stats import itl_values, tpot

LATENCY_FIGURES = ("ttft", "tpot", "itl", "e2e")
FIGURES = LATENCY_FIGURES + ("error_rate",)
_UNITS_MS = {"ms": 1.0, "s": 1000.0, "m": 60_000.0}
_EXAMPLE = "ttft_p95<=2s,tpot_p95<=50ms,itl_p99<=100ms,e2e_p90<=30s,error_rate<=1%"


@dataclass(frozen=True)
class Threshold:
    """One bound: `figure` at `percentile` (None for error_rate) at or under `limit` (ms, or a fraction)."""

    figure: str
    percentile: Optional[float]
    limit: float

    @property
    def key(self) -> str:
        return "error_rate" if self.percentile is None else f"{self.figure}_p{self.percentile:g}"

    @property
    def text(self) -> str:
        if self.percentile is None:
            return f"error_rate<={self.limit * 100:g}%"
        return f"{self.key}<={_ms_text(self.limit)}"

    def to_json(self) -> dict[str, Any]:
        return {"key": self.key, "figure": self.figure, "percentile": self.percentile,
                "limit": self.limit, "unit": "fraction" if self.percentile is None else "ms", "text": self.text}


@dataclass(frozen=True)
class SloSpec:
    """A named set of thresholds (`--slo` on the command line, `[slo.NAME]` in a campaign file)."""

    name: str
    thresholds: tuple[Threshold, ...]

    @property
    def text(self) -> str:
        return ",".join(t.text for t in self.thresholds)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "text": self.text, "thresholds": [t.to_json() for t in self.thresholds]}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "SloSpec":
        return parse_slo(d["text"], name=d.get("name") or "slo")


def _ms_text(ms: float) -> str:
    return f"{ms / 1000:g}s" if ms >= 1000 and ms % 100 == 0 else f"{ms:g}ms"


def parse_slo(text: str, *, name: str = "slo", what: str = "--slo") -> SloSpec:
    """`ttft_p95<=2s,error_rate<=1%` → an SloSpec; UsageError naming the part otherwise."""
    parts = [p for p in (text or "").replace(" ", "").lower().split(",") if p]
    if not parts:
        raise UsageError(f"{what}: no thresholds given", hint=f"write it like {what} \"{_EXAMPLE}\"")
    out: list[Threshold] = []
    for part in parts:
        t = _threshold(part, what)
        if any(o.key == t.key for o in out):
            raise UsageError(f"{what}: {t.key} is given twice ({part!r})", hint="give each figure and percentile once")
        out.append(t)
    return SloSpec(name=name, thresholds=tuple(out))


def slo_of_table(name: str, table: dict[str, str]) -> SloSpec:
    """A campaign file's [slo.NAME] table (ttft_p95 = "2s", error_rate = "1%") → an SloSpec."""
    text = ",".join(f"{key}<={value}" for key, value in table.items())
    return parse_slo(text, name=name, what=f"slo.{name}")


def _threshold(part: str, what: str) -> Threshold:
    if "<=" not in part:
        raise UsageError(f"{what}: {part!r} is not a threshold: expected FIGURE_pNN<=LIMIT, like ttft_p95<=2s",
                         hint=f"write it like {what} \"{_EXAMPLE}\"")
    head, _, value = part.partition("<=")
    if head == "error_rate":
        m = re.fullmatch(r"([0-9.]+)%", value)
        if not m or _number(m.group(1)) is None:
            raise UsageError(f"{what}: {part!r}: the error rate's limit {value!r} is not a percentage",
                             hint="write it like error_rate<=1%")
        pct = _number(m.group(1))
        assert pct is not None
        if pct > 100:
            raise UsageError(f"{what}: {part!r}: an error rate above 100 % means nothing", hint="like error_rate<=1%")
        return Threshold("error_rate", None, pct / 100)
    figure, sep, pct_text = head.rpartition("_p")
    if not sep:
        figure = head
    if figure == "error_rate":
        raise UsageError(f"{what}: {part!r}: error_rate takes no percentile", hint="write it like error_rate<=1%")
    if figure not in LATENCY_FIGURES:
        raise UsageError(f"{what}: {part!r}: unknown figure {figure!r} (expected one of {', '.join(FIGURES)})",
                         hint=f"write it like {what} \"{_EXAMPLE}\"")
    if not sep:
        raise UsageError(f"{what}: {part!r}: name the percentile, like {figure}_p95<=…",
                         hint="a latency threshold is FIGURE_pNN<=LIMIT")
    pct = _number(pct_text)
    if pct is None or not 0 < pct < 100:
        raise UsageError(f"{what}: {part!r}: percentile {pct_text!r} is outside (0, 100)",
                         hint=f"like {figure}_p95 or {figure}_p99.9")
    m = re.fullmatch(r"([0-9.]+)([a-z%]*)", value)
    num = _number(m.group(1)) if m else None
    if m is None or num is None:
        raise UsageError(f"{what}: {part!r}: the limit {value!r} is not a number with a unit",
                         hint=f"like {figure}_p{pct:g}<=2s or <=500ms")
    unit = m.group(2)
    if not unit:
        raise UsageError(f"{what}: {part!r}: the limit {value!r} has no unit (expected ms, s or m)",
                         hint=f"write {figure}_p{pct:g}<={value}ms or <={value}s")
    if unit not in _UNITS_MS:
        raise UsageError(f"{what}: {part!r}: unit {unit!r} is not ms, s or m", hint=f"like {figure}_p{pct:g}<=2s")
    if num <= 0:
        raise UsageError(f"{what}: {part!r}: a limit of 0 no request can meet", hint="give a limit above 0")
    return Threshold(figure, pct, num * _UNITS_MS[unit])


def _number(text: str) -> Optional[float]:
    try:
        v = float(text)
    except ValueError:
        return None
    return v if math.isfinite(v) else None


# --- judging ------------------------------------------------------------------------------------

def _failed(r: RequestRecord) -> bool:
    return r.status != "ok"


def _request_value(r: RequestRecord, figure: str) -> Optional[float]:
    """A finished request's TTFT, TPOT or E2E in ms; None when it has none (TPOT of a one-token answer)."""
    if figure == "ttft":
        v = r.ttft
    elif figure == "tpot":
        v = tpot(r)
    else:
        v = r.e2e
    return None if v is None else v * 1000.0


def percentile(values: Sequence[float], p: float) -> float:
    """The inverted-CDF percentile (no interpolation: infinite misses stay infinite)."""
    import numpy as np  # here, not at the top: every servedeck command imports this module (--help included)

    return float(np.percentile(np.asarray(values, dtype=float), p, method="inverted_cdf"))


def _values(measured: Sequence[RequestRecord], t: Threshold, gaps_per_request: int) -> list[float]:
    if t.figure == "itl":
        out: list[float] = []
        for r in measured:
            if _failed(r):
                out.extend([math.inf] * gaps_per_request)
            else:
                out.extend(g * 1000.0 for g in itl_values(r))
        return out
    vals = []
    for r in measured:
        if _failed(r):
            vals.append(math.inf)
            continue
        v = _request_value(r, t.figure)
        if v is not None:
            vals.append(v)
        elif t.figure != "tpot":  # a finished request without a first token has no latency to meet
            vals.append(math.inf)
    return vals


def _request_meets(r: RequestRecord, slo: SloSpec) -> bool:
    if _failed(r) or r.ttft is None:
        return False
    for t in slo.thresholds:
        if t.percentile is None:
            continue
        if t.figure == "itl":
            gaps = itl_values(r)
            if gaps and percentile([g * 1000.0 for g in gaps], t.percentile) > t.limit:
                return False
            continue
        v = _request_value(r, t.figure)
        if v is not None and v > t.limit:
            return False
    return True


def judge(records: Sequence[RequestRecord], slo: SloSpec, *, client: Optional[dict[str, Any]] = None,
          output_tok_s: Optional[float] = None, closed_loop: bool = True) -> dict[str, Any]:
    """One point against the SLO, from its records (warm-up ones are left out). `client`: the point's
    self-check (figures["client"]). The point is client-bound, its verdict not a result, when the client was
    short of CPU (`client_kind` "short": more client processes are the cure) or when its schedule lag can move
    what this SLO reads ("lag": loadgen/pace.py); a few ms of lag beside a limit of hundreds is neither."""
    measured = [r for r in records if r.kind == "measured"]
    ok = [r for r in measured if not _failed(r)]
    gaps = [len(itl_values(r)) for r in ok]
    gaps_per_request = max(1, int(statistics.median(gaps))) if gaps else 1
    rows = []
    for t in slo.thresholds:
        if t.percentile is None:
            value = (len(measured) - len(ok)) / len(measured) if measured else math.inf
        else:
            vals = _values(measured, t, gaps_per_request)
            value = percentile(vals, t.percentile) if vals else math.inf
        passed = value <= t.limit
        ratio = value / t.limit if t.limit > 0 else (0.0 if value == 0 else math.inf)
        rows.append({"key": t.key, "text": t.text, "limit": t.limit, "value": None if math.isinf(value) else value,
                     "missed_by_failures": math.isinf(value), "ratio": None if math.isinf(ratio) else ratio,
                     "passed": passed})
    sends = [r.t_send for r in measured if r.t_send is not None]
    ends = [r.t_end for r in measured if r.t_end is not None]
    window = (max(ends) - min(sends)) if sends and ends else 0.0
    good = sum(_request_meets(r, slo) for r in measured)
    failing = [row for row in rows if not row["passed"]]
    binding = max(rows, key=lambda row: math.inf if row["ratio"] is None else row["ratio"]) if rows else None
    short, lag = _client_verdict(measured, ok, rows, client or {}, closed_loop)
    ttfts = [r.ttft * 1000.0 for r in ok if r.ttft is not None]
    return {"slo": slo.name, "passed": not failing and bool(measured), "measured": len(measured),
            "failed_requests": len(measured) - len(ok), "thresholds": rows,
            "missed": [row["key"] for row in failing],
            "binding": binding["key"] if binding else None,  # closest to (or furthest past) its limit
            "good_requests": good, "goodput_request_s": good / window if window > 0 else None,
            "output_tok_s": output_tok_s, "window_s": window,
            "ttft_p50_ms": float(statistics.median(ttfts)) if ttfts else None,
            "client_bound": bool(short or lag), "client_kind": "short" if short else "lag" if lag else None,
            "client_reasons": short + lag, "client_procs": (client or {}).get("processes") or 1,
            "host": (client or {}).get("host")}


def _client_verdict(measured: Sequence[RequestRecord], ok: Sequence[RequestRecord], rows: list[dict[str, Any]],
                    client: dict[str, Any], closed_loop: bool) -> tuple[list[str], list[str]]:
    """(the client's own shortfall, the host's lag) when the point is no result: a client process near a full core,
    or a lag that can move what these thresholds read; ([], []) otherwise. A lag that matters is the client's own
    when it was short of CPU (stats' `short`) or its loop was running, not waiting for a core, more of the time
    (pace.loop_fell_behind): more client processes are then the cure."""
    from servedeck.loadgen.pace import Reading, lag_matters
    from servedeck.loadgen.stats import output_tokens

    short = client.get("short")
    full = client.get("saturated")
    if short is None:  # figures from before the self-check told the two apart: its CPU reasons
        short = [r for r in client.get("reasons") or [] if "CPU" in r]
        full = bool(short)
    readings = [Reading(row["key"], row["key"].split("_p")[0], row["value"], row["limit"]) for row in rows
                if row["key"] != "error_rate"]
    outs = [output_tokens(r) for r in ok]
    out_tokens = int(statistics.median(outs)) if outs else None
    lags_ms = [r.lag * 1000.0 for r in measured if r.lag is not None]
    e2e = [r.e2e * 1000.0 for r in ok if r.e2e is not None]
    lag = lag_matters(lags_ms, readings, output_tokens=out_tokens,
                      e2e_mean_ms=statistics.fmean(e2e) if e2e else None, closed_loop=closed_loop)
    if not full and not lag:  # a client short of CPU whose lag moves nothing the SLO reads: the point stands
        return [], []
    if closed_loop and not full and not short and _failure_stands(rows, lags_ms, out_tokens):
        return [], []
    return _own_or_hosts(short, lag, client)


def _failure_stands(rows: list[dict[str, Any]], lags_ms: list[float], out_tokens: Optional[int]) -> bool:
    """A closed-loop point that fails a threshold by more than its schedule lag p99 can move that figure: the
    failure is the server's. Late sends in a closed loop only offer the server less load, and a loop that was not
    short of CPU stamps a figure late by no more than its lag; so taking the whole lag away still leaves it failing."""
    from servedeck.loadgen.pace import lag_reach_ms

    if not lags_ms:
        return False
    p99 = percentile(lags_ms, 99.0)
    for row in rows:
        if row["passed"] or row["value"] is None:
            continue
        figure = row["key"].split("_p")[0]
        if row["value"] - lag_reach_ms(figure, p99, out_tokens) > row["limit"]:
            return True
    return False


def _own_or_hosts(short: list[str], lag: list[str], client: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(the client's own shortfall, the host's lag): a lag that matters is the client's own when its loop was
    running rather than waiting for a core (pace.loop_fell_behind)."""
    from servedeck.loadgen.pace import loop_fell_behind

    own = loop_fell_behind(client.get("cpu_fraction"), client.get("wait_fraction")) if lag and not short else None
    return (list(short) + ([own] + lag if own else [])), ([] if own else lag)
