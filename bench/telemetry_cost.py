"""What the telemetry sampler costs (issue 24): its CPU time at the default rates, and the client's TTFT
error with it on and off, in one run.

  1. idle cost: the sampler alone beside a real llama-server (/metrics every 1 s) and the GPUs (NVML every
     0.2 s; on a host without a GPU, --gpu-replay CAPTURE replays recorded readings, which costs the
     conversion and the writing but not NVML's own calls: said in the output) for --idle-s seconds; the
     figure is the sampler threads' CPU time (time.thread_time, per thread) over wall time, in % of one core.
  2. TTFT error: bench/loadgen_accuracy.py's closed-loop point against the instrument (realistic mode,
     TTFT 50 ms, 20 ms per token, 100 tokens), servedeck's client in this process, the sampler running in the
     same process beside it (on) or not (off), interleaved on/off --reps times at each --concurrency.
     TTFT error = the client's first-token arrival − the instrument's write of it (ms), p50 and p99.

    .venv/bin/python bench/telemetry_cost.py [--idle-s 60] [--reps 3] [--concurrency 16 64]
        [--gpu-replay CAPTURE] [--metrics-url URL] [--out bench/results/telemetry_cost.json]

--metrics-url samples an engine already running (a vLLM's page is ~100 KB, llama.cpp's 1 KB) instead of
starting llama-server. The issue's bar: ≤ 0.5 % of one core at the default rates; TTFT error unchanged.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from rich.console import Console
from rich.table import Table

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from loadgen_accuracy import BenchInstrument, compare, drive, load3, pct, run_variant, Variant  # noqa: E402

from servedeck.engines import get_engine  # noqa: E402
from servedeck.loadgen import ClosedLoop  # noqa: E402
from servedeck.telemetry.nvml_source import PynvmlSource, RecordedSource  # noqa: E402
from servedeck.telemetry.sampler import EngineReader, PointSampler, Settings  # noqa: E402

console = Console(width=160)


def start_llama(port: int) -> subprocess.Popen:
    from servedeck.init import default_locations

    loc = default_locations()
    proc = subprocess.Popen([loc["llama_server"], "-m", loc["smollm2_gguf"], "--port", str(port), "--metrics",
                             "-c", "1024", "--parallel", "1", "-t", "1"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    for _ in range(120):
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    proc.kill()
    raise SystemExit("llama-server did not come up")


def sampler(path: Path, metrics_url: str, engine: str, replay: str | None) -> tuple[PointSampler, str]:
    gpu = RecordedSource.from_file(Path(replay)) if replay else PynvmlSource()
    how = f"replayed from {replay} (NVML's own calls not measured)" if replay else "NVML (pynvml)"
    names = get_engine(engine).telemetry_series()
    return PointSampler(path, 0, engine=EngineReader([metrics_url], names, 2.0), gpu_source=gpu, gpus=None,
                        settings=Settings()), how


def cpu_pct(facts: dict[str, Any], wall_s: float) -> float:
    return 100 * sum((facts.get(s) or {}).get("cpu_s", 0.0) for s in ("engine", "gpu")) / wall_s


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle-s", type=float, default=60.0)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--gpu-replay")
    ap.add_argument("--metrics-url")
    ap.add_argument("--engine", default="llamacpp", help="the adapter whose series --metrics-url carries")
    ap.add_argument("--out", default=str(HERE / "results" / "telemetry_cost.json"))
    a = ap.parse_args()
    llama = None
    if a.metrics_url:
        base = a.metrics_url.rsplit("/metrics", 1)[0]
    else:
        port = 18000 + int(time.time()) % 1000
        llama = start_llama(port)
        base = f"http://127.0.0.1:{port}"
    out: dict[str, Any] = {"host": platform.node(), "python": sys.version.split()[0], "load_avg_start": load3(),
                           "metrics": base + "/metrics", "engine": a.engine}
    inst = BenchInstrument("realistic", 50.0, 20.0, 100)
    try:
        with tempfile.TemporaryDirectory() as d:
            s, how = sampler(Path(d) / "telemetry.jsonl", base, a.engine, a.gpu_replay)
            t0 = time.perf_counter()
            s.start()
            time.sleep(a.idle_s)
            facts = s.stop()
            wall = time.perf_counter() - t0
            out["idle"] = {"seconds": wall, "gpu_source": how, "facts": facts, "cpu_pct_of_one_core": cpu_pct(facts, wall),
                           "page_bytes": len(httpx.get(base + "/metrics").content)}
        console.print(f"idle: {out['idle']['cpu_pct_of_one_core']:.3f} % of one core over {wall:.0f} s "
                      f"(engine {facts.get('engine', {}).get('samples')} samples, gpu "
                      f"{facts.get('gpu', {}).get('samples', 0)}; GPU {how}; not sampled: {facts['not_sampled']})")
        rows = []
        v = Variant("realistic", "servedeck")
        for rep in range(a.reps):
            for conc in a.concurrency:
                for on in ((False, True) if rep % 2 == 0 else (True, False)):  # interleaved, order alternating
                    inst.clear()
                    n = max(10, conc * a.rounds)
                    with tempfile.TemporaryDirectory() as d:
                        sm = sampler(Path(d) / "telemetry.jsonl", base, a.engine, a.gpu_replay)[0] if on else None
                        if sm:
                            sm.start()
                        t = time.perf_counter()
                        res = run_variant(v, drive("servedeck", [inst.url], ClosedLoop(conc), n, inst.tokens, conc))
                        wall = time.perf_counter() - t
                        f = sm.stop() if sm else None
                    err = compare(res, inst.records())["ttft_err"]
                    rows.append({"rep": rep, "concurrency": conc, "telemetry": on, "compared": len(err),
                                 "ttft_err_p50_ms": pct(err, 50), "ttft_err_p99_ms": pct(err, 99),
                                 "sampler_cpu_pct": cpu_pct(f, wall) if f else None, "load_avg_1m": (load3() or [None])[0]})
        out["points"] = rows
    finally:
        inst.stop()
        if llama is not None:
            llama.kill()
            llama.wait()
    t = Table(title="client TTFT error with the telemetry sampler off and on (median over repetitions)")
    for col in ("streams", "telemetry", "TTFT err p50 ms", "TTFT err p99 ms", "sampler % of a core", "reps"):
        t.add_column(col, justify="right")
    summary = []
    for conc in a.concurrency:
        for on in (False, True):
            mine = [r for r in out["points"] if r["concurrency"] == conc and r["telemetry"] == on]
            med = {k: pct([r[k] for r in mine if r[k] is not None], 50) for k in
                   ("ttft_err_p50_ms", "ttft_err_p99_ms", "sampler_cpu_pct")}
            summary.append({"concurrency": conc, "telemetry": on, **med, "reps": len(mine)})
            t.add_row(str(conc), "on" if on else "off", *(f"{med[k]:.3f}" if med[k] is not None else "-" for k in
                                                          ("ttft_err_p50_ms", "ttft_err_p99_ms", "sampler_cpu_pct")),
                      str(len(mine)))
    out["summary"] = summary
    console.print(t)
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(out, indent=2) + "\n")
    console.print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
