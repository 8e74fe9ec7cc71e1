"""scripts/gpu-energy.sh's check: per bench point, servedeck's energy per output token (its run folder's
summary.json, figures.telemetry.gpu) against independent readings over the same measured window:

    counter   the NVML energy counter as _nvml_energy_reader.py read it (a separate process), linear
              between its samples at the window's edges: the reading that must agree within --tolerance
    smi       nvidia-smi's power.draw samples (-lms 100), integrated (trapezoids) over the window
              (beside it, not gated: on Hopper power.draw is a 1-s average)

Both use the point's own output-token count, so only the energy is compared. Writes JSON and a
markdown table; exits 1 when a point disagrees by more than the tolerance or cannot be checked.

    python3 scripts/_energy_check.py RUN_FOLDER READER.jsonl SMI.csv OUT_PREFIX [--tolerance 0.03]
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from datetime import datetime
from pathlib import Path

import numpy as np


def reader_series(path: Path) -> tuple[dict[int, tuple[list[float], list[float]]], float | None]:
    """GPU → (t, energy J) from the reader's capture, and wall − monotonic offset from its first line."""
    series: dict[int, tuple[list[float], list[float]]] = {}
    offset = None
    if not path.exists():
        return series, offset
    for raw in path.read_text().splitlines():
        try:
            ln = json.loads(raw)
        except ValueError:
            continue  # a torn last line
        if "clock" in ln:
            offset = ln["wall"] - ln["t"]
        elif ln.get("energy_mj") is not None:
            ts, es = series.setdefault(int(ln["gpu"]), ([], []))
            ts.append(ln["t"])
            es.append(ln["energy_mj"] / 1000.0)
    return series, offset


def smi_series(path: Path, offset: float | None) -> dict[int, tuple[list[float], list[float]]]:
    """GPU → (t on the monotonic clock, power W) from `nvidia-smi --query-gpu=timestamp,index,power.draw`."""
    out: dict[int, tuple[list[float], list[float]]] = {}
    if offset is None or not path.exists():
        return out
    for row in csv.reader(path.read_text().splitlines()):
        if len(row) < 3 or not row[0].strip()[:1].isdigit():
            continue
        try:
            wall = datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
            ts, ps = out.setdefault(int(row[1]), ([], []))
            ts.append(wall - offset)
            ps.append(float(row[2]))
        except ValueError:
            continue
    return out


def counter_energy(series, a: float, b: float) -> float | None:
    total = 0.0
    for ts, es in series.values():
        if len(ts) < 2 or ts[0] > a or ts[-1] < b:
            return None  # the reader did not cover the window
        total += float(np.interp(b, ts, es) - np.interp(a, ts, es))
    return total if series else None


def smi_energy(series, a: float, b: float) -> float | None:
    total = 0.0
    for ts, ps in series.values():
        inner = [(t, p) for t, p in zip(ts, ps) if a < t < b]
        if len(inner) < 2:
            return None
        xs = [a] + [t for t, _ in inner] + [b]
        ys = [float(np.interp(a, ts, ps))] + [p for _, p in inner] + [float(np.interp(b, ts, ps))]
        total += float(np.trapezoid(ys, xs)) if hasattr(np, "trapezoid") else float(np.trapz(ys, xs))
    return total if series else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("run")
    ap.add_argument("reader")
    ap.add_argument("smi")
    ap.add_argument("out")
    ap.add_argument("--tolerance", type=float, default=0.03)
    a = ap.parse_args()
    summary = json.loads((Path(a.run) / "summary.json").read_text())
    counter, offset = reader_series(Path(a.reader))
    smi = smi_series(Path(a.smi), offset)
    rows, ok = [], True
    for p in summary.get("points", []):
        load, gpu = p.get("load") or {}, ((p.get("figures") or {}).get("telemetry") or {}).get("gpu") or {}
        t0, ms, me = load.get("t0_perf_counter"), load.get("measured_start"), load.get("measured_end")
        row = {"point": p.get("label"), "window_s": None, "output_tokens": gpu.get("output_tokens"),
               "servedeck_j": gpu.get("energy_j"), "servedeck_source": gpu.get("energy_source"),
               "servedeck_j_per_token": gpu.get("j_per_output_token"), "mean_power_w": gpu.get("mean_power_w"),
               "max_power_w": gpu.get("max_power_w"), "limit_w": (gpu.get("gpus") or [{}])[0].get("limit_w"),
               "samples": gpu.get("samples"), "missed": gpu.get("missed"),
               "ttft_p50_ms": (p.get("headline") or {}).get("ttft_p50_ms"),
               "tpot_p50_ms": (p.get("headline") or {}).get("tpot_p50_ms")}
        if None in (t0, ms, me) or not row["output_tokens"]:
            row["verdict"] = "cannot check: " + (gpu.get("unavailable") or "no window or no output tokens")
            ok = False
            rows.append(row)
            continue
        w0, w1 = t0 + ms, t0 + me
        row["window_s"] = round(w1 - w0, 3)
        ref = counter_energy(counter, w0, w1)
        alt = smi_energy(smi, w0, w1)
        row["reader_j"], row["smi_j"] = ref, alt
        row["reader_j_per_token"] = None if ref is None else ref / row["output_tokens"]
        row["smi_j_per_token"] = None if alt is None else alt / row["output_tokens"]
        if ref is None or row["servedeck_j_per_token"] is None:
            row["verdict"] = "cannot check: no independent counter reading over the window"
            ok = False
        else:
            row["difference"] = row["servedeck_j_per_token"] / row["reader_j_per_token"] - 1
            agree = abs(row["difference"]) <= a.tolerance
            row["verdict"] = "agree" if agree else f"DISAGREE (over {a.tolerance:.0%})"
            ok = ok and agree
        rows.append(row)
    doc = {"run": summary.get("run"), "tolerance": a.tolerance, "ok": ok, "points": rows}
    Path(a.out + ".json").write_text(json.dumps(doc, indent=2) + "\n")

    def f(x, fmt):
        return "-" if x is None else format(x, fmt)

    lines = ["| point | window s | output tokens | servedeck J/token (source) | reader J/token | difference | "
             "nvidia-smi J/token | mean / max W | limit W | verdict |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['point']} | {f(r['window_s'], '.1f')} | {r['output_tokens']} | "
                     f"{f(r['servedeck_j_per_token'], '.4f')} ({r['servedeck_source']}) | "
                     f"{f(r.get('reader_j_per_token'), '.4f')} | {f(r.get('difference'), '+.2%')} | "
                     f"{f(r.get('smi_j_per_token'), '.4f')} | {f(r['mean_power_w'], '.0f')} / "
                     f"{f(r['max_power_w'], '.0f')} | {f(r['limit_w'], '.0f')} | {r['verdict']} |")
    Path(a.out + ".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
