"""What the front door adds: the load generator against a server directly and through `servedeck serve`,
side by side (runs alternate direct/door), at 1, 64 and 256 streams.

Two targets:
  instrument    servedeck's timing instrument (first token after 50 ms, one every 20 ms, 100 tokens),
                given to the door with --upstream. The instrument records when it received each request
                and wrote each chunk on the same monotonic clock as the client, so the door's cost is
                measured per request, not inferred from two noisy runs:
                    transit = (instrument received − client sent) + (client got chunk 0 − instrument wrote it)
                    added TTFT = transit through the door − transit direct (p50 and p99 over requests)
  llama         llama-server (SmolLM2-135M) started by the door itself (preload); client TTFT and
                output tok/s, direct vs door. Engine queueing at 64/256 streams on 2 cores dwarfs the door.
Targets (issue 12): added TTFT p50 <= 1 ms and p99 <= 5 ms at 64 streams; output tok/s >= 98 % of direct.

    .venv/bin/python bench/door_latency.py [--targets instrument llama] [--reps 2] [--out PATH]
        [--pin client=0-3 door=4-7 instrument=8-11] [--before-tree PATH] [--vllm-router]
Without --pin every process (client, door, instrument, engine) shares this machine's cores; with it,
each is held to its own CPU set (a GPU host has cores to spare: that shows the door's own cost, not
the contention of three Python processes on two cores). The load average is recorded at the start
and end of each point.

--vllm-router (instrument target): vllm-router (the `bench` extra, vllm-router==0.1.17; --vllm-router-policy,
default round_robin) in front of the same instrument as a third path: each point rotates direct / door /
vllm_router, so the door's added TTFT and vllm-router's are measured in the same run on the same ruler.

--before-tree PATH (instrument target): a second door from another checkout of servedeck (e.g. a
`git worktree add /tmp/door-before COMMIT`), run beside this one from PATH/src, in front of the same
instrument; each point's runs rotate direct / door / before, so drift on a shared box falls on all three.
With --pin both doors are held to the door's CPUs (only one of them is driven at a time).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from rich.console import Console
from rich.table import Table

from servedeck.loadgen import ClientConfig, ClosedLoop, LoadResult, StreamingClient, run_load, summarize_run
from servedeck.loadgen import synthetic_requests
from servedeck.loadgen.loop import run as run_loop
from servedeck.testing.instrument_process import InstrumentProcess
from servedeck.testing.ports import free_port  # below the ephemeral range: that module says why

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _vllm_router import version as vllm_router_version  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
console = Console(width=160)
TTFT_MS, ITL_MS, TOKENS = 50.0, 20.0, 100


PINS: dict[str, set[int]] = {}  # --pin: role (client, door, instrument) → CPU set


def cpu_list(text: str) -> set[int]:
    """"0-3,8" → {0, 1, 2, 3, 8}"""
    out: set[int] = set()
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def pinned(role: str):
    """A preexec_fn holding a child (and every thread it starts) to the role's CPUs, if any. A sandbox
    that refuses affinity leaves it unpinned; `affinity()` records what each process really got."""
    cpus = PINS.get(role)

    def pin() -> None:
        try:
            os.sched_setaffinity(0, cpus)
        except OSError:
            pass

    return pin if cpus else None


def affinity(pid: int) -> list[int] | None:
    try:
        return sorted(os.sched_getaffinity(pid))
    except OSError:
        return None


class DoorProcess:
    """`servedeck serve` in its own process group, on its own SERVEDECK_HOME."""

    def __init__(self, config_text: str, *args: str, src: Path | None = None) -> None:
        self.tmp = tempfile.mkdtemp(prefix="door-bench-")
        cfg = Path(self.tmp) / "models.toml"
        cfg.write_text(config_text)
        self.env = dict(os.environ, SERVEDECK_HOME=str(Path(self.tmp) / "home"), SERVEDECK_CONFIG=str(cfg))
        self.env.pop("SERVEDECK_API_KEY", None)
        if src is not None:  # another checkout's servedeck (--before-tree): ahead of this venv's own
            self.env["PYTHONPATH"] = os.pathsep.join([str(src), *filter(None, [os.environ.get("PYTHONPATH")])])
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "servedeck", "serve", "--port", str(self.port),
                                      "--watch-interval", "30s", *args], env=self.env,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                     start_new_session=True, preexec_fn=pinned("door"))
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60:
            try:
                httpx.get(self.url + "/v1/models", timeout=1)
                return
            except httpx.TransportError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"door exited: {self.proc.stderr.read()}") from None
                time.sleep(0.1)
        raise RuntimeError("door did not start")

    def models(self) -> dict[str, dict]:
        return {m["id"]: m["servedeck"] for m in httpx.get(self.url + "/v1/models", timeout=10).json()["data"]}

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        # the door leaves engines running (as `watch` does): stop what it started
        subprocess.run([sys.executable, "-m", "servedeck", "stop", "--all"], env=self.env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)


async def drive(url: str, model: str, conc: int, n: int, max_tokens: int, prompt_tokens: int) -> LoadResult:
    specs = list(synthetic_requests(prompt_tokens, max_tokens, n=n))
    # One warm-up request per stream, all at once: the client's connections, and the door's pool of engine
    # connections, are as many as the measured phase uses (a pool left idle past relay.IDLE_S, or smaller
    # than the wave, pays a connect per missing connection on the first wave: docs/door.md, "cold pool").
    warm = list(synthetic_requests(prompt_tokens, 4, n=conc, kind="warmup"))
    async with StreamingClient(ClientConfig(url, model=model)) as c:
        await c.prewarm(conc + 1)
        return await run_load(c, ClosedLoop(conc), specs, warmup=warm)


def git_commit(tree: Path) -> str | None:
    out = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    return out.stdout.strip() or None


def pct(v: list[float], q: float) -> float | None:
    return float(np.percentile(v, q)) if v else None


def transit(res: LoadResult, sent: dict[str, dict]) -> list[float]:
    """Per request (ms): time the request spent reaching the instrument plus time chunk 0 spent reaching
    the client. Direct, this is the client's and the kernel's share; through the door, plus the door's."""
    out = []
    for r in res.records:
        s = sent.get(r.id)
        if r.kind != "measured" or r.status != "ok" or s is None or r.t_send is None or not r.chunk_t:
            continue
        out.append(((s["t_received"] - (r.t_send + res.t0)) + ((r.chunk_t[0] + res.t0) - s["chunk_t"][0])) * 1e3)
    return out


def point(url: str, model: str, conc: int, rounds: int, max_tokens: int, prompt_tokens: int,
          inst: InstrumentProcess | None) -> dict[str, Any]:
    if inst:
        inst.clear()
    n = max(10, conc * rounds)
    res = run_loop(drive(url, model, conc, n, max_tokens, prompt_tokens))  # uvloop when installed, as the CLI
    st = summarize_run(res)
    out = {"requests": st["counts"]["measured"], "ok": st["counts"]["ok"], "errors": st["counts"]["error"],
           "ttft_p50_ms": st["ttft_ms"]["p50"], "ttft_p99_ms": st["ttft_ms"]["p99"],
           "output_tok_s": st["output_tok_s"], "client_cpu_fraction": st["client"]["cpu_fraction"],
           "lag_p99_ms": st["client"]["lag_ms"]["p99"]}
    if inst:
        t = transit(res, inst.records())
        out.update(transit_n=len(t), transit_p50_ms=pct(t, 50), transit_p99_ms=pct(t, 99))
    return out


def pair(direct_url: str, door_url: str, model: str, conc: int, reps: int, rounds: int, max_tokens: int,
         prompt_tokens: int, inst: InstrumentProcess | None, others: dict[str, str] | None = None) -> dict[str, Any]:
    """Runs rotating over direct, door and `others` (side → url: "before", "vllm_router"), medians per side."""
    la0 = os.getloadavg()
    urls = {"direct": direct_url, "door": door_url, **(others or {})}
    runs: dict[str, list] = {side: [] for side in urls}
    sides = list(urls)
    for i in range(reps):  # rotate, so drift on a shared box falls on every side
        for side in sides[i % len(sides):] + sides[:i % len(sides)]:
            runs[side].append(point(urls[side], model, conc, rounds, max_tokens, prompt_tokens, inst))

    def med(side: str, k: str) -> float | None:
        vals = [r[k] for r in runs[side] if r.get(k) is not None]
        return float(np.median(vals)) if vals else None

    row: dict[str, Any] = {"streams": conc, "reps": reps, "load_avg_before": la0, "load_avg_after": os.getloadavg()}
    for k in ("ttft_p50_ms", "ttft_p99_ms", "output_tok_s", "transit_p50_ms", "transit_p99_ms", "lag_p99_ms"):
        for side in runs:
            row[f"{side}_{k}"] = med(side, k)
    for side in runs:
        if side == "direct":
            continue
        pre = "" if side == "door" else f"{side}_"
        if inst:
            for q in ("p50", "p99"):
                d, t = row[f"direct_transit_{q}_ms"], row[f"{side}_transit_{q}_ms"]
                row[f"{pre}added_ttft_{q}_ms"] = t - d if d is not None and t is not None else None
        row[f"{pre}tok_s_pct_of_direct"] = 100 * row[f"{side}_output_tok_s"] / row["direct_output_tok_s"] \
            if row["direct_output_tok_s"] else None
    row["errors"] = sum(r["errors"] for side in runs.values() for r in side)
    row["runs"] = runs
    return row


def fmt(x: Any, nd: int = 2) -> str:
    return "—" if x is None else f"{x:.{nd}f}" if isinstance(x, float) else str(x)


EXTRA_SIDES = ("before", "vllm_router")  # beside direct and door: --before-tree, --vllm-router


def table(title: str, rows: list[dict], instrument: bool) -> Table:
    t = Table(title=title)
    extra = [s for s in EXTRA_SIDES if rows and f"{s}_ttft_p50_ms" in rows[0]]
    sides = ["direct", "door", *extra]
    names = " / ".join(sides)
    cols = ["streams", f"TTFT p50 {names} (ms)", f"TTFT p99 {names} (ms)"]
    if instrument:
        cols += ["added TTFT p50 (ms)", "added TTFT p99 (ms)"]
        for s in extra:
            cols += [f"{s}: added p50 (ms)", f"{s}: added p99 (ms)"]
    cols += [f"tok/s {names}", "door % of direct", *(f"{s} % of direct" for s in extra), "errors", "load avg"]
    for c in cols:
        t.add_column(c, justify="right")
    for r in rows:
        cells = [str(r["streams"]), " / ".join(fmt(r[f"{s}_ttft_p50_ms"]) for s in sides),
                 " / ".join(fmt(r[f"{s}_ttft_p99_ms"]) for s in sides)]
        if instrument:
            cells += [fmt(r["added_ttft_p50_ms"], 3), fmt(r["added_ttft_p99_ms"], 3)]
            for s in extra:
                cells += [fmt(r[f"{s}_added_ttft_p50_ms"], 3), fmt(r[f"{s}_added_ttft_p99_ms"], 3)]
        cells += [" / ".join(fmt(r[f"{s}_output_tok_s"], 0) for s in sides), fmt(r["tok_s_pct_of_direct"], 1),
                  *(fmt(r[f"{s}_tok_s_pct_of_direct"], 1) for s in extra),
                  str(r["errors"]), fmt(r["load_avg_before"][0], 1)]
        t.add_row(*cells)
    return t


def bench_instrument(a: argparse.Namespace) -> list[dict]:
    inst = InstrumentProcess("--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS), "--tokens", str(TOKENS),
                             cpus=PINS.get("instrument"))
    door = before = router = None
    try:
        door = DoorProcess("", "--upstream", f"instrument={inst.url}")
        if a.before_tree:
            before = DoorProcess("", "--upstream", f"instrument={inst.url}", src=a.before_tree / "src")
        if a.vllm_router:  # the same instrument behind vllm-router, held to the door's CPUs under --pin
            from _vllm_router import VllmRouter

            router = VllmRouter([inst.url], a.vllm_router_policy, preexec=pinned("door"))
            a.vllm_router_argv = ["vllm-router", *router.argv[1:]]
        a.affinity = {"client": affinity(0), "door": affinity(door.proc.pid), "instrument": affinity(inst.proc.pid),
                      **({"before": affinity(before.proc.pid)} if before else {}),
                      **({"vllm_router": affinity(router.proc.pid)} if router else {})}
        console.log(f"CPU sets: {a.affinity}")
        others = {**({"before": before.url} if before else {}), **({"vllm_router": router.url} if router else {})}
        rows = []
        for conc in a.concurrency:
            rows.append(pair(inst.url, door.url, "instrument", conc, a.reps, a.rounds, TOKENS, 64, inst, others))
            r = rows[-1]
            console.log(f"instrument, {conc} streams: added TTFT p50 {fmt(r['added_ttft_p50_ms'], 3)} ms, "
                        f"p99 {fmt(r['added_ttft_p99_ms'], 3)} ms; tok/s {fmt(r['tok_s_pct_of_direct'], 1)} %"
                        + "".join(f"; {s}: {fmt(r[f'{s}_added_ttft_p50_ms'], 3)} / "
                                  f"{fmt(r[f'{s}_added_ttft_p99_ms'], 3)} ms" for s in others))
        return rows
    finally:
        for d in (door, before, router):
            if d:
                d.stop()
        inst.stop()


def bench_stack(a: argparse.Namespace) -> list[dict]:
    """The door against a bare Starlette/uvicorn/httpx proxy, both in front of the instrument."""
    inst = InstrumentProcess("--ttft-ms", str(TTFT_MS), "--itl-ms", str(ITL_MS), "--tokens", str(TOKENS))
    door = None
    port = free_port()
    star = subprocess.Popen([sys.executable, str(HERE / "_starlette_proxy.py"), str(port), inst.url],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        door = DoorProcess("", "--upstream", f"instrument={inst.url}")
        for _ in range(100):
            try:
                httpx.post(f"http://127.0.0.1:{port}/v1/completions", json={"model": "x", "max_tokens": 1,
                                                                              "prompt": "x", "stream": True})
                break
            except httpx.TransportError:
                time.sleep(0.1)
        rows = []
        for conc in a.concurrency:
            row = pair(f"http://127.0.0.1:{port}", door.url, "instrument", conc, a.reps, a.rounds, TOKENS, 64, inst)
            rows.append(row)  # "direct" here is the Starlette proxy
            console.log(f"stack, {conc} streams: transit p50 starlette {fmt(row['direct_transit_p50_ms'], 3)} / door "
                        f"{fmt(row['door_transit_p50_ms'], 3)} ms, p99 {fmt(row['direct_transit_p99_ms'], 3)} / "
                        f"{fmt(row['door_transit_p99_ms'], 3)} ms")
        return rows
    finally:
        if door:
            door.stop()
        os.killpg(star.pid, signal.SIGTERM)
        star.wait(10)
        inst.stop()


def bench_llama(a: argparse.Namespace) -> list[dict]:
    from servedeck.init import render_starter

    text = render_starter()
    port = free_port()
    text = text.replace("port = 8081", f"port = {port}").replace("port = 8091", f"port = {free_port()}")
    text = text.replace("port = 8082", f"port = {free_port()}")
    text = text.replace("[host]\n", '[host]\npreload = ["smollm2"]\n', 1)
    door = DoorProcess(text)
    try:
        t0 = time.monotonic()
        while door.models()["smollm2"]["state"] != "ready":
            if time.monotonic() - t0 > 120:
                raise RuntimeError(f"smollm2 did not become ready through the door: {door.models()['smollm2']}")
            time.sleep(0.2)
        rows = []
        for conc in a.llama_concurrency:
            rows.append(pair(f"http://127.0.0.1:{port}", door.url, "smollm2", conc, a.reps, 1, a.llama_max_tokens,
                             64, None))
            console.log(f"llama-server, {conc} streams: tok/s {fmt(rows[-1]['tok_s_pct_of_direct'], 1)} % of direct")
        return rows
    finally:
        door.stop()


def bench_swap(a: argparse.Namespace) -> list[dict]:
    """Switch the slot back and forth (SmolLM2 <-> Gemma 3 270M, both llama-server): for each switch the
    door's own account (eviction + memory release + boot, /door/status) and the client's time to first byte."""
    from servedeck.init import render_starter

    text = render_starter()
    for old in ("8081", "8091", "8082"):
        text = text.replace(f"port = {old}", f"port = {free_port()}")
    text = text.replace("[host]\n", "[host]\nmin_residency_s = 0\n", 1)
    door = DoorProcess(text)
    rows = []
    try:
        body = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 4, "stream": True}
        for i in range(a.swaps + 1):
            model = ("smollm2", "gemma")[i % 2]
            t0 = time.perf_counter()
            with httpx.stream("POST", door.url + "/v1/chat/completions", json=dict(body, model=model),
                              timeout=600) as r:
                first = None
                for _ in r.iter_raw():
                    first = first or time.perf_counter()
                status = r.status_code
            swaps = httpx.get(door.url + "/door/status", timeout=30).json()["swaps"]
            last = swaps[0] if swaps else {}
            rows.append({"to": model, "status": status, "first_byte_s": round((first or t0) - t0, 3),
                         "kind": last.get("kind"), "evicted": last.get("evicted"), "door_took_s": last.get("took_s"),
                         "load_avg": os.getloadavg()[0]})
            console.log(f"{last.get('kind')} to {model}: {last.get('took_s')} s (door), first byte after "
                        f"{rows[-1]['first_byte_s']} s; load {rows[-1]['load_avg']:.1f}")
        return rows
    finally:
        door.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--targets", nargs="+", choices=["instrument", "llama", "stack", "swap"], default=["instrument", "llama"],
                    help="stack: the door against a bare Starlette/uvicorn/httpx proxy (needs those installed)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--llama-concurrency", type=int, nargs="+", default=[1, 64, 256])
    ap.add_argument("--llama-max-tokens", type=int, default=32)
    ap.add_argument("--swaps", type=int, default=4, help="swap: switches to time (after the first start)")
    ap.add_argument("--reps", type=int, default=2, help="direct/door pairs per point (alternating order)")
    ap.add_argument("--rounds", type=int, default=3, help="requests per stream in each instrument run")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "door_latency.json")
    ap.add_argument("--pin", nargs="+", default=[], metavar="ROLE=CPUS",
                    help="hold client, door and instrument to CPU sets, e.g. client=0-3 door=4-7 instrument=8-11")
    ap.add_argument("--before-tree", type=Path, metavar="PATH",
                    help="instrument target: also run the door of another servedeck checkout (its src/), interleaved")
    ap.add_argument("--vllm-router", action="store_true",
                    help="instrument target: also run vllm-router (the bench extra) in front of the instrument, "
                         "interleaved: direct / door / vllm-router")
    ap.add_argument("--vllm-router-policy", default="round_robin",
                    help="its --policy with the one instrument behind it (default round_robin: no per-request "
                         "text matching, as the door's default least-outstanding)")
    a = ap.parse_args()
    if a.before_tree and not (a.before_tree / "src" / "servedeck" / "door").is_dir():
        ap.error(f"--before-tree {a.before_tree}: expected a servedeck checkout (no src/servedeck/door there); "
                 "make one with `git worktree add /tmp/door-before COMMIT`")
    for item in a.pin:
        role, _, cpus = item.partition("=")
        if role not in ("client", "door", "instrument") or not cpus:
            ap.error(f"--pin {item!r}: expected client=CPUS, door=CPUS or instrument=CPUS")
        PINS[role] = cpu_list(cpus)
    if "client" in PINS:
        try:
            os.sched_setaffinity(0, PINS["client"])
        except OSError as e:
            console.log(f"--pin client: refused ({e}); the client runs unpinned")
    # SIGTERM (e.g. `timeout`) unwinds like Ctrl-C, so every door and engine started here is stopped
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result: dict[str, Any] = {
        "tool": "bench/door_latency.py", "argv": sys.argv[1:],
        "instrument": {"ttft_ms": TTFT_MS, "itl_ms": ITL_MS, "tokens": TOKENS},
        "platform": {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
                     "load_avg_start": os.getloadavg()},
        "pins": {k: sorted(v) for k, v in PINS.items()},
        "before_tree": str(a.before_tree) if a.before_tree else None,
        "vllm_router": {"version": vllm_router_version(), "policy": a.vllm_router_policy} if a.vllm_router else None,
        "commit": git_commit(REPO), "before_commit": git_commit(a.before_tree) if a.before_tree else None,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    if "instrument" in a.targets:
        result["instrument_rows"] = bench_instrument(a)
        result["affinity"] = a.affinity
        if a.vllm_router:
            result["vllm_router"]["argv"] = a.vllm_router_argv
        console.print(table("through the door vs direct: timing instrument", result["instrument_rows"], True))
    if "llama" in a.targets:
        result["llama_rows"] = bench_llama(a)
        console.print(table("through the door vs direct: llama-server, SmolLM2-135M", result["llama_rows"], False))
    if "stack" in a.targets:
        result["stack_rows"] = bench_stack(a)
    if "swap" in a.targets:
        result["swap_rows"] = bench_swap(a)
    result["platform"]["load_avg_end"] = os.getloadavg()
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2))
    console.print(f"wrote {a.out} (load average at start {result['platform']['load_avg_start'][0]:.1f}, "
                  f"at end {result['platform']['load_avg_end'][0]:.1f}, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
