"""The energy at a capacity point: J per output token and mean power of the step the search found as its
capacity, read from the run view's own telemetry figures (telemetry/figures.py, rebuilt from
telemetry.jsonl and requests.jsonl by runs.read.load), and what to say where there is none.

Pure functions over run views; nothing is measured here.
"""

from __future__ import annotations

from typing import Any, Optional

NO_GPU = "no GPU"  # the launch used no GPU and none was sampled: there is no energy to show
NOT_SAMPLED = "GPU not sampled"  # a GPU launch whose capacity point has no energy figure


def at_capacity(view: dict[str, Any]) -> dict[str, Any]:
    """{"j_per_output_token", "mean_power_w", "energy_source"} at the run's capacity point, or
    {"missing": NO_GPU | NOT_SAMPLED (and why)} where the point has no energy figure."""
    cap = view.get("capacity") or {}
    point = next((p for p in view.get("points") or [] if p.get("index") == cap.get("point")), None)
    gpu = (((point or {}).get("figures") or {}).get("telemetry") or {}).get("gpu") or {}
    if gpu.get("energy_j") is not None:
        return {"j_per_output_token": gpu.get("j_per_output_token"), "mean_power_w": gpu.get("mean_power_w"),
                "energy_source": gpu.get("energy_source")}
    if not view.get("gpus_used") and not gpu.get("samples"):
        return {"missing": NO_GPU}
    why = gpu.get("unavailable") or ("no capacity point" if point is None else "no energy over its window")
    return {"missing": f"{NOT_SAMPLED} ({why})"}


def mean_at_capacity(views: list[dict[str, Any]]) -> dict[str, Any]:
    """The energy at capacity across repeats: the means of those that have it; `missing` says why where
    none has it (one repeat without it is left out of the means, and `partial` counts it)."""
    each = [at_capacity(v) for v in views if (v.get("capacity") or {}).get("capacity") is not None]
    have = [e for e in each if "missing" not in e]
    if not have:
        reasons = sorted({e["missing"] for e in each})
        return {"j_per_output_token": None, "mean_power_w": None, "energy_source": None,
                "missing": "; ".join(reasons) if reasons else "no capacity found"}
    sources = sorted({str(e["energy_source"]) for e in have if e.get("energy_source")})
    return {"j_per_output_token": _mean([e.get("j_per_output_token") for e in have]),
            "mean_power_w": _mean([e.get("mean_power_w") for e in have]),
            "energy_source": ", ".join(sources) or None, "missing": None, "partial": len(each) - len(have)}


def _mean(xs: list[Optional[float]]) -> Optional[float]:
    vals = [float(x) for x in xs if isinstance(x, (int, float))]
    return sum(vals) / len(vals) if vals else None


def j_text(e: dict[str, Any]) -> str:
    """The J per output token cell: the figure, or why there is none."""
    if e.get("j_per_output_token") is None:
        return e.get("missing") or "-"
    return f"{e['j_per_output_token']:.4g}" + (f" ({e['partial']} repeat without)" if e.get("partial") else "")


def w_text(e: dict[str, Any]) -> str:
    """The mean power cell (watts, summed over the launch's GPUs), or why there is none."""
    if e.get("mean_power_w") is None:
        return e.get("missing") or "-"
    return f"{e['mean_power_w']:.0f}"
