"""How accurately does servedeck's load generator measure? Checked against the instrument.

The instrument (servedeck.testing.instrument, its own process) streams tokens at known times and
records when it really wrote each one, in two modes: "cheap" (JSON serialised once per request,
token text spliced in) and "realistic" (every event a dict built and json.dumps'ed when due, usage
last, one process: what a real server's front end costs per chunk; "spaced" is realistic with
json.dumps' default separators). This script drives it with servedeck's client (in 1 or more
processes) and with an aiohttp client written the way vllm bench serve uses aiohttp, interleaved:
each repetition runs every variant at every concurrency before the next repetition starts, so a
busy neighbour hits all of them alike. Per point (closed loop, TTFT 50 ms, one token per 20 ms,
100 tokens):
    TTFT error   client's first-token arrival − instrument's write of that token (ms)
    ITL error    client's gap between two chunks − instrument's gap between their writes (ms)
    rate         client output tok/s over the run ÷ ideal (concurrency × tokens / request time)
    lag          schedule lag, actual − targeted send (ms)
    self-check   whether the client's own self-check called the point client-bound
Medians over --reps repetitions; the host's load average is recorded with every point. An
optional open-loop ramp (--capacity-streams) finds the most streamed tokens/s one client core takes
while schedule lag p99 stays under 5 ms.

--before-tree PATH adds servedeck's client as a source tree (a git worktree) has it, run in a process
of its own (PYTHONPATH=PATH/src) at each point, interleaved with the others: before and after a
change in one run, on the same instrument, under the same neighbours ("before" in the client column):

    git worktree add /tmp/loadgen-before 33d2f12        # the client before issue 21's httptools framing
    .venv/bin/python bench/loadgen_accuracy.py --modes realistic --clients servedeck \
        --before-tree /tmp/loadgen-before --concurrency 1 64 256 --reps 5
    git worktree remove /tmp/loadgen-before

    .venv/bin/python bench/loadgen_accuracy.py [--reps 3] [--modes cheap realistic]
        [--clients servedeck aiohttp] [--client-procs 1 2 4] [--loops auto] [--gc quiet]
        [--before-tree PATH] [--out PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import pickle
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from rich.console import Console
from rich.table import Table

from servedeck.loadgen import (
    ClientConfig,
    ClosedLoop,
    LoadResult,
    OpenLoop,
    StreamingClient,
    run_load,
    summarize_run,
    synthetic_requests,
)
from servedeck.loadgen.loop import preferred, run as run_loop
from servedeck.loadgen.procs import ProcessLoadRun
from servedeck.testing.instrument_process import InstrumentProcess

HERE = Path(__file__).resolve().parent
console = Console(width=230)  # the tables are wider than a default terminal
MODE_ARGS = {"cheap": [], "realistic": ["--realistic"], "spaced": ["--realistic", "--json-spaces"]}
# issue 14's targets for the realistic mode on the 2-core box: streams -> (p50, p99, rate %)
TARGETS = {64: (None, 8.0, None), 256: (2.0, 20.0, 97.0)}


class BenchInstrument(InstrumentProcess):
    """The instrument with the timing it was started with, which the error figures need."""

    def __init__(self, mode: str, ttft_ms: float, itl_ms: float, tokens: int, cpus: set[int] | None = None) -> None:
        self.mode, self.ttft_ms, self.itl_ms, self.tokens = mode, ttft_ms, itl_ms, tokens
        super().__init__("--ttft-ms", str(ttft_ms), "--itl-ms", str(itl_ms), "--tokens", str(tokens),
                         *MODE_ARGS[mode], cpus=cpus)


@dataclass(frozen=True)
class Variant:
    """One way of running the client: which client, in how many processes, on which loop, how GC runs."""

    mode: str  # the instrument's mode
    client: str  # servedeck | aiohttp | before (servedeck's client from --before-tree, in its own process)
    procs: int = 1
    loop: str = "auto"  # auto | asyncio | uvloop (auto: uvloop when installed)
    gc: str = "quiet"  # quiet: no automatic GC in the measured phase (LoadRun's default) | default

    @property
    def label(self) -> str:
        return f"{self.mode}/{self.client}/p{self.procs}/{self.loop}/{self.gc}"


def make_client(kind: str, url: str, connections: int) -> Any:
    cfg = ClientConfig(url, model="instrument")
    if kind == "aiohttp":
        sys.path.insert(0, str(HERE))
        from _aiohttp_streamer import AiohttpStreamer

        return AiohttpStreamer(cfg, connections)
    return StreamingClient(cfg)


class Spread:
    """One client per instrument, requests dealt round-robin: lets one client process be
    measured past what a single (Python) instrument process can emit."""

    def __init__(self, clients: list[Any]) -> None:
        self.clients = clients
        self.i = 0

    async def send(self, spec: Any, record: Any, t0: float) -> None:
        self.i += 1
        await self.clients[self.i % len(self.clients)].send(spec, record, t0)


async def drive(kind: str, urls: list[str], shape: Any, n: int, max_tokens: int, connections: int,
                duration_s: float | None = None, quiet_gc: bool = True) -> LoadResult:
    specs = list(synthetic_requests(64, max_tokens, n=n))
    warm = list(synthetic_requests(64, 4, n=min(8, connections), kind="warmup"))
    clients = [make_client(kind, u, connections) for u in urls]
    for c in clients:
        await c.__aenter__()
        if isinstance(c, StreamingClient):
            await c.prewarm(connections // len(clients) + 1)
    try:
        streamer = clients[0] if len(clients) == 1 else Spread(clients)
        return await run_load(streamer, shape, specs, warmup=warm, duration_s=duration_s, quiet_gc=quiet_gc)
    finally:
        for c in clients:
            await c.__aexit__(None, None, None)


def before_point(tree: Path, v: Variant, url: str, conc: int, n: int, tokens: int) -> LoadResult:
    """One closed-loop point driven by the client of another source tree, in a process of its own:
    this script again (`--one-point`), importing servedeck from TREE/src (the API drive() uses is the
    same on both sides). The LoadResult comes back pickled; perf_counter is the system's monotonic
    clock, so its times compare with the instrument's as the in-process client's do."""
    with tempfile.TemporaryDirectory(prefix="loadgen-before-") as d:
        out = Path(d) / "result.pickle"
        job = {"url": url, "conc": conc, "n": n, "tokens": tokens, "quiet_gc": v.gc == "quiet", "out": str(out)}
        env = {**os.environ, "PYTHONPATH": str(tree / "src"), "SERVEDECK_LOOP": v.loop}
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--one-point", json.dumps(job)],
                       env=env, check=True)
        return pickle.loads(out.read_bytes())


def one_point(job_json: str) -> None:
    """The child side of before_point: drive one point with whatever servedeck this process imports."""
    import servedeck.loadgen

    job = json.loads(job_json)
    where = Path(servedeck.loadgen.__file__).resolve().parents[2]
    if where != Path(os.environ["PYTHONPATH"]).resolve():  # the other tree must be the one measured
        sys.exit(f"--one-point imported servedeck from {where}, not from PYTHONPATH={os.environ['PYTHONPATH']}")
    loop = os.environ.get("SERVEDECK_LOOP", "auto")
    res = run_loop(drive("servedeck", [job["url"]], ClosedLoop(job["conc"]), job["n"], job["tokens"], job["conc"],
                         quiet_gc=job["quiet_gc"]), None if loop == "auto" else loop)  # type: ignore[arg-type]
    Path(job["out"]).write_bytes(pickle.dumps(res))


def run_variant(v: Variant, coro_or_run: Any) -> LoadResult:
    """Run on the variant's loop; client processes read SERVEDECK_LOOP, so it is set for them too."""
    os.environ["SERVEDECK_LOOP"] = v.loop
    return run_loop(coro_or_run, None if v.loop == "auto" else v.loop)  # type: ignore[arg-type]


def compare(res: LoadResult, sent: dict[str, dict[str, Any]]) -> dict[str, list[float]]:
    """Client-measured vs instrument-recorded, per request and per token (ms)."""
    ttft_err, itl_err, delivery = [], [], []
    for r in res.records:
        if r.kind != "measured" or r.status != "ok" or r.id not in sent:
            continue
        s = sent[r.id]
        ct = [t + res.t0 for t in r.chunk_t]
        st = s["chunk_t"]
        if len(ct) != len(st):
            continue  # a mismatch would shift every comparison; counted below as unmatched
        ttft_err.append((ct[0] - st[0]) * 1e3)
        delivery.extend((c - x) * 1e3 for c, x in zip(ct, st))
        itl_err.extend(((ct[k] - ct[k - 1]) - (st[k] - st[k - 1])) * 1e3 for k in range(1, len(ct)))
    return {"ttft_err": ttft_err, "itl_err": itl_err, "delivery": delivery}


def lateness(sent: dict[str, dict[str, Any]], ttft_ms: float, itl_ms: float) -> list[float]:
    """How late the instrument itself wrote each chunk versus its deadline (ms)."""
    out = []
    for s in sent.values():
        for k, t in enumerate(s["chunk_t"]):
            out.append((t - (s["t_received"] + (ttft_ms + k * itl_ms) / 1e3)) * 1e3)
    return out


def load3() -> list[float] | None:
    """The host's load average (1, 5, 15 min), None where the kernel does not say (a sandbox)."""
    try:
        return list(os.getloadavg())
    except OSError:
        return None


def load1() -> float | None:
    la = load3()
    return la[0] if la else None


def pct(values: list[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


def accuracy_point(inst: BenchInstrument, v: Variant, conc: int, rounds: int,
                   before_tree: Path | None = None) -> dict[str, Any]:
    inst.clear()
    n = max(10, conc * rounds)
    load_before = load1()
    quiet = v.gc == "quiet"
    if v.client == "before":
        assert before_tree is not None
        res = before_point(before_tree, v, inst.url, conc, n, inst.tokens)
    elif v.procs > 1:
        specs = list(synthetic_requests(64, inst.tokens, n=n))
        warm = list(synthetic_requests(64, 4, n=min(8, conc), kind="warmup"))
        run = ProcessLoadRun(ClientConfig(inst.url, model="instrument"), ClosedLoop(conc), specs, procs=v.procs,
                             warmup=warm, quiet_gc=quiet)
        res = run_variant(v, run.run())
    else:
        res = run_variant(v, drive(v.client, [inst.url], ClosedLoop(conc), n, inst.tokens, conc, quiet_gc=quiet))
    sent = inst.records()
    cmp = compare(res, sent)
    stats = summarize_run(res)
    ideal = conc * inst.tokens / ((inst.ttft_ms + (inst.tokens - 1) * inst.itl_ms) / 1e3)
    measured = [r for r in res.records if r.kind == "measured"]
    return {
        "mode": v.mode, "client": v.client, "procs": v.procs, "loop_asked": v.loop, "gc": v.gc,
        "loop": res.loop,
        "concurrency": conc,
        "requests": len(measured),
        "ok": stats["counts"]["ok"],
        "compared": len(cmp["ttft_err"]),
        "ttft_err_p50_ms": pct(cmp["ttft_err"], 50),
        "ttft_err_p99_ms": pct(cmp["ttft_err"], 99),
        "itl_err_p50_ms": pct(cmp["itl_err"], 50),
        "itl_err_abs_p50_ms": pct([abs(x) for x in cmp["itl_err"]], 50),
        "itl_err_p99_ms": pct([abs(x) for x in cmp["itl_err"]], 99),
        "delivery_p50_ms": pct(cmp["delivery"], 50),
        "delivery_p99_ms": pct(cmp["delivery"], 99),
        "rate_pct_of_ideal": 100 * stats["output_tok_s"] / ideal if stats["output_tok_s"] else None,
        "lag_p50_ms": stats["client"]["lag_ms"]["p50"],
        "lag_p99_ms": stats["client"]["lag_ms"]["p99"],
        "client_cpu_fraction": stats["client"]["cpu_fraction"],
        "client_bound": stats["client"]["client_bound"],
        "self_check_reasons": stats["client"]["reasons"],
        "instrument_late_p99_ms": pct(lateness(sent, inst.ttft_ms, inst.itl_ms), 99),
        "load_avg_1m": load_before,
    }


def capacity_point(insts: list[BenchInstrument], kind: str, streams: int, duration_s: float) -> dict[str, Any]:
    """Open loop at the rate that keeps `streams` requests in flight; steady-state tok/s."""
    inst = insts[0]
    for i in insts:
        i.clear()
    req_s = (inst.ttft_ms + (inst.tokens - 1) * inst.itl_ms) / 1e3
    rate = streams / req_s
    n = int(rate * duration_s) + 1
    res = run_loop(drive(kind, [i.url for i in insts], OpenLoop(rate), n, inst.tokens, streams, duration_s=duration_s))
    sent = {k: v for i in insts for k, v in i.records().items()}
    stats = summarize_run(res)
    measured = [r for r in res.records if r.kind == "measured" and r.t_send is not None]
    # Steady state: from when the first request has finished to when the last was sent.
    a = min(r.t_send for r in measured) + req_s
    b = max(r.t_send for r in measured)
    chunks = sum(1 for r in measured for t in r.chunk_t if a <= t <= b)
    cmp = compare(res, sent)
    return {
        "streams": streams,
        "target_tok_s": streams * inst.tokens / req_s,
        "steady_tok_s": chunks / (b - a) if b > a else None,
        "lag_p50_ms": stats["client"]["lag_ms"]["p50"],
        "lag_p99_ms": stats["client"]["lag_ms"]["p99"],
        "client_cpu_fraction": stats["client"]["cpu_fraction"],
        "ttft_err_p50_ms": pct(cmp["ttft_err"], 50),
        "ttft_err_p99_ms": pct(cmp["ttft_err"], 99),
        "errors": stats["counts"]["error"],
        "instrument_late_p99_ms": pct(lateness(sent, inst.ttft_ms, inst.itl_ms), 99),
        "load_avg_1m": load1(),
    }


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k in runs[0]:
        vals = [r[k] for r in runs if isinstance(r[k], (int, float)) and not isinstance(r[k], bool) and r[k] is not None]
        same = all(r[k] == runs[0][k] for r in runs)  # e.g. the concurrency: keep it as it is
        out[k] = statistics.median(vals) if vals and not same else runs[0][k]
    out["client_bound_runs"] = sum(bool(r.get("client_bound")) for r in runs)
    return out


def medians(runs: dict[tuple[str, int], list[dict[str, Any]]]) -> list[dict[str, Any]]:
    acc = []
    for (label, _conc), rs in runs.items():
        m = median_of(rs)
        m["runs"] = len(rs)
        m["verdict"] = verdict(m)
        acc.append({"variant": label, "median": m, "runs": rs})
    return acc


def write_json(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1))
    tmp.replace(path)


def verdict(m: dict[str, Any]) -> str:
    """Issue 14's targets (realistic mode): 'met', or 'missed (flagged k/n)' with how many of the
    runs the self-check called client-bound, or '' where the point has no target."""
    t = TARGETS.get(m["concurrency"])
    if m["mode"] == "cheap" or t is None:
        return ""
    p50, p99, rate = t
    ok = ((p50 is None or (m["ttft_err_p50_ms"] or 1e9) <= p50) and (p99 is None or (m["ttft_err_p99_ms"] or 1e9) <= p99)
          and (rate is None or (m["rate_pct_of_ideal"] or 0) >= rate))
    return "met" if ok else f"missed (flagged {m['client_bound_runs']}/{m['runs']})"


def fmt(x: Any, nd: int = 2) -> str:
    return "—" if x is None else f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def tree_commit(tree: Path) -> str | None:
    """The commit a source tree is at (and "+changes" when its files differ from it), None outside git."""
    try:
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(tree), "status", "--porcelain", "--", "src"], capture_output=True,
                               text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None
    return head + ("+changes" if dirty else "")


def cpus_of(text: str | None) -> set[int] | None:
    if not text:
        return None
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out |= set(range(int(lo), int(hi or lo) + 1))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--modes", nargs="+", choices=list(MODE_ARGS), default=["cheap", "realistic"])
    ap.add_argument("--clients", nargs="+", choices=["servedeck", "aiohttp"], default=["servedeck", "aiohttp"])
    ap.add_argument("--client-procs", type=int, nargs="+", default=[1],
                    help="servedeck's client split over N processes (one schedule); aiohttp always runs in one")
    ap.add_argument("--loops", nargs="+", choices=["auto", "asyncio", "uvloop"], default=["auto"],
                    help="the client's event loop (auto: uvloop when installed); several: side by side")
    ap.add_argument("--gc", nargs="+", choices=["quiet", "default"], default=["quiet"],
                    help="quiet: no automatic GC in the measured phase (the library's default); default: CPython's")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=3, help="requests per stream in each accuracy run")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--capacity-streams", type=int, nargs="*", default=[],
                    help="open-loop stream counts to ramp through, servedeck client, first mode (default: skip)")
    ap.add_argument("--capacity-duration", type=float, default=8.0)
    ap.add_argument("--lag-limit-ms", type=float, default=5.0)
    ap.add_argument("--instruments", type=int, default=1,
                    help="instrument processes for the capacity ramp (one Python process tops out "
                         "near 50k tok/s, below what the client takes)")
    ap.add_argument("--client-cpus", type=str, default=None,
                    help="CPUs for the client (and its processes), e.g. 0 or 0-3")
    ap.add_argument("--client-cpu", type=int, default=None, help=argparse.SUPPRESS)  # the old spelling
    ap.add_argument("--instrument-cpus", type=str, default=None,
                    help="CPUs for the instruments, e.g. 1 or 1-3 (default: the OS decides)")
    ap.add_argument("--ttft-ms", type=float, default=50.0)
    ap.add_argument("--itl-ms", type=float, default=20.0)
    ap.add_argument("--tokens", type=int, default=100)
    ap.add_argument("--before-tree", type=Path, default=None,
                    help="a source tree (git worktree) whose servedeck client also runs, in its own process, "
                         "interleaved: before/after in one run")
    ap.add_argument("--one-point", default=None, help=argparse.SUPPRESS)  # before_point's child
    ap.add_argument("--out", type=Path, default=HERE / "results" / "loadgen_accuracy.json")
    a = ap.parse_args()
    if a.one_point:
        one_point(a.one_point)
        return
    if a.before_tree is not None and not (a.before_tree / "src" / "servedeck" / "loadgen" / "client.py").is_file():
        ap.error(f"--before-tree {a.before_tree}: no src/servedeck/loadgen/client.py there "
                 "(make one with: git worktree add /tmp/loadgen-before 33d2f12)")
    client_cpus = cpus_of(a.client_cpus) or ({a.client_cpu} if a.client_cpu is not None else None)

    variants: list[Variant] = []
    for mode, client, procs, loop, gcm in itertools.product(a.modes, a.clients, a.client_procs, a.loops, a.gc):
        if client == "aiohttp" and procs != 1:
            continue
        variants.append(Variant(mode, client, procs, loop, gcm))
        if a.before_tree is not None and client == "servedeck" and procs == 1:
            variants.append(Variant(mode, "before", 1, loop, gcm))
    icpus = cpus_of(a.instrument_cpus)
    timing = (a.ttft_ms, a.itl_ms, a.tokens)
    insts = {m: BenchInstrument(m, *timing, cpus=icpus) for m in a.modes}
    extra = [BenchInstrument(a.modes[0], *timing, cpus=icpus) for _ in range(max(0, a.instruments - 1))] \
        if a.capacity_streams else []
    if client_cpus:
        try:
            os.sched_setaffinity(0, client_cpus)  # after the instruments started: they keep theirs
        except OSError as e:
            console.log(f"could not pin the client to CPUs {a.client_cpus}: {e}")
    result: dict[str, Any] = {
        "tool": "bench/loadgen_accuracy.py", "argv": sys.argv[1:],
        "instrument": {"ttft_ms": a.ttft_ms, "itl_ms": a.itl_ms, "tokens": a.tokens, "modes": a.modes,
                       "loops": {m: i.loop for m, i in insts.items()}, "cpus": a.instrument_cpus,
                       "pinned_to": {m: sorted(i.pinned) if i.pinned else None for m, i in insts.items()}},
        "client_cpus": sorted(client_cpus) if client_cpus else None,
        "client_affinity": sorted(os.sched_getaffinity(0)),
        "preferred_loop": preferred(),
        "variants": [asdict(v) for v in variants],
        "before_tree": {"path": str(a.before_tree), "commit": tree_commit(a.before_tree)} if a.before_tree else None,
        "after_commit": tree_commit(HERE.parent),
        "targets_realistic": {str(k): {"ttft_err_p50_ms": t[0], "ttft_err_p99_ms": t[1], "rate_pct": t[2]}
                              for k, t in TARGETS.items()},
        "platform": {"python": platform.python_version(), "machine": platform.machine(),
                     "cpus": os.cpu_count(), "load_avg_start": load3()},
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    acc: list[dict[str, Any]] = []
    try:
        # Interleaved: every variant at every concurrency, then the next repetition. The JSON is
        # rewritten after each repetition, so a run cut short keeps what finished.
        for rep in range(a.reps):
            for conc in a.concurrency:
                for v in variants:
                    r = accuracy_point(insts[v.mode], v, conc, a.rounds, a.before_tree)
                    runs.setdefault((v.label, conc), []).append(r)
                    console.log(f"rep {rep + 1}/{a.reps} {v.label} c={conc}: TTFT err p50 {fmt(r['ttft_err_p50_ms'])} "
                                f"p99 {fmt(r['ttft_err_p99_ms'])} ms, rate {fmt(r['rate_pct_of_ideal'], 1)} %, "
                                f"load {fmt(r['load_avg_1m'], 1)}")
            acc = medians(runs)
            result["accuracy"] = acc
            result["reps_done"] = rep + 1
            write_json(a.out, result)
        cap = []
        best = None
        cap_insts = [insts[a.modes[0]], *extra]
        for streams in a.capacity_streams:
            pts = [capacity_point(cap_insts, "servedeck", streams, a.capacity_duration) for _ in range(a.reps)]
            m = median_of(pts)
            cap.append({"median": m, "runs": pts})
            console.log(f"capacity {streams} streams: {fmt(m['steady_tok_s'], 0)} tok/s, lag p99 {fmt(m['lag_p99_ms'])} ms")
            # On a shared box one preempted point is not the client's limit: keep ramping, and
            # stop only once the client itself is saturated (CPU) or streams go missing.
            if m["lag_p99_ms"] is not None and m["lag_p99_ms"] <= a.lag_limit_ms and not m["errors"]:
                if best is None or m["steady_tok_s"] > best["steady_tok_s"]:
                    best = m
            if (m["client_cpu_fraction"] or 0) > 0.95 or (m["steady_tok_s"] or 0) < 0.9 * m["target_tok_s"]:
                break
        if cap:
            result["capacity"] = {"lag_limit_ms": a.lag_limit_ms, "mode": a.modes[0], "points": cap,
                                  "best_steady_tok_s": best["steady_tok_s"] if best else None,
                                  "best_streams": best["streams"] if best else None}
    finally:
        for i in [*insts.values(), *extra]:
            i.stop()
        os.environ.pop("SERVEDECK_LOOP", None)
    result["platform"]["load_avg_end"] = load3()
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")

    la = result["platform"]
    la0, la1 = (la["load_avg_start"] or [None])[0], (la["load_avg_end"] or [None])[0]
    t = Table(title=f"loadgen accuracy vs instrument (median of {a.reps} runs, interleaved; ms; load average "
                    f"{fmt(la0, 1)} → {fmt(la1, 1)} on {la['cpus']} CPUs)")
    for col in ("instrument", "client", "procs", "loop", "gc", "streams", "TTFT err p50", "TTFT err p99",
                "|ITL err| p99", "rate % ideal", "lag p99", "client CPU", "client-bound", "instr. late p99",
                "load", "target"):
        t.add_column(col, justify="right", no_wrap=True)
    for row in sorted(acc, key=lambda r: (r["median"]["concurrency"], r["variant"])):
        m = row["median"]
        t.add_row(m["mode"], m["client"], str(m["procs"]), str(m["loop"]), m["gc"], str(m["concurrency"]),
                  fmt(m["ttft_err_p50_ms"]), fmt(m["ttft_err_p99_ms"]), fmt(m["itl_err_p99_ms"]),
                  fmt(m["rate_pct_of_ideal"], 1), fmt(m["lag_p99_ms"]), fmt(m["client_cpu_fraction"]),
                  f"{m['client_bound_runs']}/{m['runs']}", fmt(m["instrument_late_p99_ms"]), fmt(m["load_avg_1m"], 1),
                  m["verdict"])
    console.print(t)
    if cap:
        t2 = Table(title=f"open-loop capacity, {a.modes[0]} instrument (schedule lag p99 limit {a.lag_limit_ms:g} ms)")
        for col in ("streams", "target tok/s", "steady tok/s", "lag p50", "lag p99", "client CPU",
                    "TTFT err p50", "TTFT err p99", "instr. late p99"):
            t2.add_column(col, justify="right")
        for row in cap:
            m = row["median"]
            t2.add_row(str(m["streams"]), fmt(m["target_tok_s"], 0), fmt(m["steady_tok_s"], 0),
                       fmt(m["lag_p50_ms"]), fmt(m["lag_p99_ms"]), fmt(m["client_cpu_fraction"]),
                       fmt(m["ttft_err_p50_ms"]), fmt(m["ttft_err_p99_ms"]), fmt(m["instrument_late_p99_ms"]))
        console.print(t2)
        console.print(f"highest steady tok/s with lag p99 <= {a.lag_limit_ms:g} ms: "
                      f"{fmt(result['capacity']['best_steady_tok_s'], 0)}")
    write_json(a.out, result)
    console.print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
