"""Replica routing side by side, in one run (issue 25): the `conversations` workload on 2 llama.cpp
replicas of SmolLM2-135M, through the door with each of its policies (least-outstanding, session,
prefix) and through vllm-router with cache_aware and round_robin, in front of the same replicas.

The replicas: the cached llama-server and GGUF (scripts/setup.sh; servedeck.init.default_locations, as
tests/conftest.py finds them), each `--threads 1 --threads-batch 1` and held to one core of its own
(replica i on core i mod the CPU count), `--parallel` = the number of users (so a router that sends every
conversation to one replica finds a slot for each), each slot big enough for a whole conversation, prompt
cache at llama-server's defaults (on, with its host-memory prompt cache), `--metrics`.

Cold caches for every router: the replicas are started afresh for each arm and stopped after it — a
llama-server's prefix cache lives in its slots and in its host-memory prompt cache (`--cache-ram`), so a
restart is the one way that empties both (erasing slots leaves the second). The router (door or
vllm-router) is started afresh for each arm too, so its own memory (pins, recent prefixes, radix tree)
starts empty. Every arm sends the same conversations (same seed: same system prompt, same user turns;
greedy answers), and the order of the arms rotates from one rep to the next.

The client is servedeck's own conversations workload (workloads/conversations.py: its `_Run.converse`,
workloads/window.py's `calibrate`, and runs/turns.py's figures), so each turn is what `servedeck bench --workload
conversations` sends and records. Turn sizes are calibrated once, on a replica's tokenizer, before the
first arm (the replicas are restarted after). Per router:
    engine cached share   Σ llamacpp:prompt_tokens_cached_total / Σ (that + llamacpp:prompt_tokens_total)
                          over both replicas, after − before the arm (servedeck's llamacpp adapter,
                          `prefix_counters`, as workloads/window.py reads them); the issue's figure
    per-request share     Σ usage.cached_tokens / Σ prompt tokens over the turns (runs/turns.py)
    TTFT p50 / p99, output tok/s   loadgen.stats.summarize over the arm's turns and wall time
    requests per replica  tasks each replica finished (`slot release` lines in its own log)
    router CPU s          CPU seconds the router process (and its children) used during the arm (psutil):
                          time the replicas could not have on these 2 cores
Medians over --reps; every rep's figures are in the JSON, and `paired` holds door:prefix minus
vllm-router:cache_aware rep by rep (the two ran one after the other in each rep).

    .venv/bin/python bench/routing_side_by_side.py [--users 16] [--turns 6] [--system-prompt-tokens 256]
        [--turn-tokens 64] [--answer-tokens 16] [--think-time 0] [--reps 1]
        [--out bench/results/routing_side_by_side.json]
        [--llama-server PATH --gguf PATH] [--replica-arg=ARG ...] [--no-pin]   (another engine build and model,
                                                                                as scripts/gpu-routing.sh on an H200)

On 2 shared cores the defaults take about 2–5 minutes per arm. servedeck is imported from where the
script is run: run it from a snapshot (`git worktree add --detach /tmp/routing-bench HEAD`, then that tree's
bench/ with PYTHONPATH=/tmp/routing-bench/src) when others are editing the checkout.

Every process it starts (replicas, doors, vllm-router) runs in its own process group and is stopped as
one, also on Ctrl-C, SIGTERM or an exception.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import os
import platform
import random
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import psutil
from rich.console import Console
from rich.table import Table

from servedeck.workloads.conversations import MARGIN, PER_TURN_EXTRA, ConversationsSpec, _Run

from servedeck.workloads.window import calibrate as calibrate_chars
from servedeck.workloads.reporter import QuietReporter
from servedeck.engines import get_engine
from servedeck.engines.metrics import read_metrics
from servedeck.gates.server import ServerTokens
from servedeck.init import default_locations
from servedeck.loadgen import texts
from servedeck.loadgen.drawn import parse_drawn
from servedeck.loadgen.api import ApiClient
from servedeck.loadgen.loop import run as run_loop
from servedeck.loadgen.prompts import seeded_nonce
from servedeck.loadgen.stats import summarize
from servedeck.runs.folder import RunFolder
from servedeck.runs.turns import turn_figures

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _vllm_router import VllmRouter, stop_process, version as vllm_router_version, wait_healthy  # noqa: E402
from door_latency import DoorProcess, git_commit  # noqa: E402

REPO = HERE.parent
MODEL = "smol"
# What the replicas run: the cached llama-server and SmolLM2 GGUF unless --llama-server / --gguf name others
# (the GPU run: a CUDA build and a random-weight GGUF, scripts/gpu-routing.sh); main() fills it in.
ENGINE: dict[str, Any] = {"llama_server": None, "gguf": None, "pin": True, "extra_args": []}
console = Console(width=170)
ARMS = [("door", "least-outstanding"), ("door", "session"), ("door", "prefix"),
        ("vllm-router", "cache_aware"), ("vllm-router", "round_robin")]
RELEASE = re.compile(r"slot\s+release:")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Replica:
    """One llama-server in its own process group, its output in its own log (read for requests served)."""

    def __init__(self, argv_tail: list[str], core: int | None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkstemp(prefix="routing-replica-", suffix=".log")[1])
        self.argv = [ENGINE["llama_server"], "-m", ENGINE["gguf"], "--host", "127.0.0.1", "--port", str(self.port),
                     "--alias", MODEL, *argv_tail]
        cpus = None if core is None else {core % (os.cpu_count() or 1)}

        def pin() -> None:
            if cpus is None:  # --no-pin: a host with cores to spare (the GPU run)
                return
            try:
                os.sched_setaffinity(0, cpus)
            except OSError:
                pass

        with self.log.open("w") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, preexec_fn=pin)

    def wait_ready(self, timeout_s: float = 120) -> None:
        wait_healthy(self.proc, self.url, self.log, timeout_s, "llama-server")

    def counters(self) -> dict[str, float]:
        raw = read_metrics(self.url, 10.0) or {}
        pc = get_engine("llamacpp").prefix_counters(raw) or {}
        return {"queried_tokens": pc.get("queries"), "hit_tokens": pc.get("hits"),
                "tokens_predicted": raw.get("llamacpp:tokens_predicted_total")}

    def served(self) -> int:
        return len(RELEASE.findall(self.log.read_text(errors="replace")))

    def stop(self) -> None:
        stop_process(self.proc, self.log)


class Pair:
    """The two replicas of one arm, started together."""

    def __init__(self, argv_tail: list[str]) -> None:
        self.replicas: list[Replica] = []
        try:
            for core in range(2):
                self.replicas.append(Replica(argv_tail, core if ENGINE["pin"] else None))
            for r in self.replicas:
                r.wait_ready()
        except BaseException:
            self.stop()
            raise

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def stop(self) -> None:
        for r in self.replicas:
            r.stop()


def slot_context(spec: ConversationsSpec) -> int:
    """Tokens one slot needs for a whole conversation (the workload's own estimate, plus 25 %), in 256s."""
    need = spec.system_prompt_tokens + spec.turns * (spec.turn_tokens + spec.answer_tokens + PER_TURN_EXTRA) + MARGIN
    return max(1024, -(-int(need * 1.25) // 256) * 256)


def replica_argv(spec: ConversationsSpec) -> list[str]:
    slots = spec.users
    threads = ["--threads", "1", "--threads-batch", "1"] if ENGINE["pin"] else []
    return ["--parallel", str(slots), "-c", str(slots * slot_context(spec)), *threads, "--metrics",
            *ENGINE["extra_args"]]


class Texts:
    """What every arm sends: the same system prompt, the same user turns (one seed)."""

    def __init__(self, cpt: float, system: str, user_seeds: list[float]) -> None:
        self.cpt, self.system, self.user_seeds = cpt, system, user_seeds


async def calibrate(spec: ConversationsSpec, url: str) -> Texts:
    """As run_conversations does before its point: chars/token on the server's tokenizer, the system prompt,
    a seed per user — from one rng, so every arm gets the same."""
    rng = random.Random(spec.seed)
    async with ApiClient(url) as api:
        cpt = await calibrate_chars(ServerTokens(api, MODEL, "llamacpp"), spec.content, texts.start_of(spec.content, rng),
                               spec.turn_tokens)
    system = ""
    if spec.system_prompt_tokens:
        system = ("You are a careful assistant. Answer briefly. Background reading follows.\n\n"
                  + texts.piece(spec.content, texts.start_of(spec.content, rng), int(spec.system_prompt_tokens * cpt)))
    return Texts(cpt, system, [rng.random() for _ in range(spec.users)])


async def converse_all(spec: ConversationsSpec, url: str, tx: Texts, folder: RunFolder) -> tuple[_Run, float]:
    """Every user's conversation at once through `url`, servedeck's workload client; (the run, wall s)."""
    target = SimpleNamespace(served_name=MODEL, request={})  # what _Run reads of a Target: the name and extra body
    async with ApiClient(url) as api:
        run = _Run(spec, target, spec.max_context, folder, api, QuietReporter(), seeded_nonce(spec.seed, 0),  # type: ignore[arg-type]
                   tx.cpt, tx.system, time.perf_counter())
        await asyncio.gather(*(run.converse(c, random.Random(tx.user_seeds[c])) for c in range(spec.users)))
        return run, time.perf_counter() - run.start


def arm(spec: ConversationsSpec, router: str, policy: str, tx: Texts, rep: int, work: Path,
        live: list[Any]) -> dict[str, Any]:
    la0 = os.getloadavg()
    pair = Pair(replica_argv(spec))
    live.append(pair)
    front: Any = None
    try:
        if router == "door":
            front = DoorProcess("", "--upstream", f"{MODEL}={pair.urls[0]}", "--upstream", f"{MODEL}={pair.urls[1]}",
                                "--upstream-routing", f"{MODEL}={policy}")
            front_argv = ["servedeck", "serve", "--upstream", f"{MODEL}=R1", "--upstream", f"{MODEL}=R2",
                          "--upstream-routing", f"{MODEL}={policy}"]
        else:
            front = VllmRouter(pair.urls, policy)
            front_argv = ["vllm-router", *front.argv[1:]]
        live.append(front)
        cpu0 = front_cpu_s(front.proc)
        before = [r.counters() for r in pair.replicas]
        folder = RunFolder(work / f"rep{rep}-{router}-{policy}", {})
        folder.path.mkdir(parents=True)
        run, wall = run_loop(converse_all(spec, front.url, tx, folder))
        after = [r.counters() for r in pair.replicas]
        served = [r.served() for r in pair.replicas]
        front_cpu = front_cpu_s(front.proc) - cpu0
    finally:
        if front is not None:
            front.stop()
            live.remove(front)
        pair.stop()
        live.remove(pair)
    q = sum((a["queried_tokens"] or 0) - (b["queried_tokens"] or 0) for a, b in zip(after, before))
    h = sum((a["hit_tokens"] or 0) - (b["hit_tokens"] or 0) for a, b in zip(after, before))
    st = summarize(run.records, wall_s=wall)
    turns = turn_figures(run.records)
    row = {"router": router, "policy": policy, "rep": rep, "front_argv": front_argv,
           "load_avg_start": la0, "load_avg_end": os.getloadavg(), "wall_s": wall,
           "turns_sent": st["counts"]["measured"], "errors": st["counts"]["error"],
           "engine_cached_share": h / q if q else None, "engine_queried_tokens": q, "engine_hit_tokens": h,
           "request_cached_share": turns["overall"]["cached_share"],
           "ttft_p50_ms": st["ttft_ms"]["p50"], "ttft_p99_ms": st["ttft_ms"]["p99"],
           "output_tok_s": st["output_tok_s"], "requests_per_replica": served,
           "front_cpu_s": front_cpu, "front_cpu_share_of_wall": front_cpu / wall if wall else None,
           "counters_before": before, "counters_after": after,
           "per_turn": [{k: t[k] for k in ("turn", "requests", "cached_share", "ttft_ms_p50", "ttft_ms_p99")}
                        for t in turns["per_turn"]],
           "cutoffs": [c for c in run.cutoffs if c["reason"] != "every turn sent"]}
    console.log(f"rep {rep} {router} {policy}: engine cached {fmt(row['engine_cached_share'], 3)}, TTFT p50 "
                f"{fmt(row['ttft_p50_ms'], 0)} ms p99 {fmt(row['ttft_p99_ms'], 0)} ms, {fmt(row['output_tok_s'], 1)} "
                f"tok/s, per replica {served}, {row['errors']} errors, {wall:.0f} s, router CPU {front_cpu:.1f} s, "
                f"load {la0[0]:.1f}")
    return row


def front_cpu_s(proc: Any) -> float:
    """CPU seconds (user + system) the router process and its children have used: the replicas share these
    2 cores with it."""
    me = psutil.Process(proc.pid)
    return sum(t.user + t.system for t in (p.cpu_times() for p in [me, *me.children(recursive=True)]))


def paired(rows: list[dict[str, Any]], a: tuple[str, str], b: tuple[str, str]) -> Optional[dict[str, Any]]:
    """Arm a minus arm b, rep by rep (both ran in the same rep, one after the other): TTFT p50 and p99."""
    by = {(r["router"], r["policy"], r["rep"]): r for r in rows}
    reps = sorted({r["rep"] for r in rows if (*a, r["rep"]) in by and (*b, r["rep"]) in by})
    if not reps:
        return None
    out: dict[str, Any] = {"a": "%s:%s" % a, "b": "%s:%s" % b, "reps": len(reps)}
    for k in ("ttft_p50_ms", "ttft_p99_ms", "output_tok_s", "front_cpu_s"):
        d = [by[(*a, i)][k] - by[(*b, i)][k] for i in reps if by[(*a, i)].get(k) is not None
             and by[(*b, i)].get(k) is not None]
        out[k] = {"differences": d, "median": float(statistics.median(d)) if d else None,
                  "a_higher": sum(x > 0 for x in d), "of": len(d)}
    return out


def fmt(x: Any, nd: int = 2) -> str:
    return "—" if x is None else f"{x:.{nd}f}" if isinstance(x, float) else str(x)


def medians(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for router, policy in ARMS:
        mine = [r for r in rows if r["router"] == router and r["policy"] == policy]
        if not mine:
            continue

        def med(k: str) -> Optional[float]:
            vals = [r[k] for r in mine if r.get(k) is not None]
            return float(statistics.median(vals)) if vals else None

        out.append({"router": router, "policy": policy, "reps": len(mine),
                    **{k: med(k) for k in ("engine_cached_share", "request_cached_share", "ttft_p50_ms", "ttft_p99_ms",
                                           "output_tok_s", "wall_s", "front_cpu_s")},
                    "requests_per_replica": [r["requests_per_replica"] for r in mine],
                    "errors": sum(r["errors"] for r in mine),
                    "load_avg": [(round(r["load_avg_start"][0], 2), round(r["load_avg_end"][0], 2)) for r in mine]})
    return out


def table(rows: list[dict[str, Any]], title: str) -> Table:
    t = Table(title=title)
    for c in ("router", "policy", "engine cached share", "per-request cached share", "TTFT p50 (ms)", "TTFT p99 (ms)",
              "output tok/s", "router CPU s", "requests per replica", "errors", "load avg start→end"):
        t.add_column(c, justify="left" if c in ("router", "policy") else "right")
    for r in rows:
        t.add_row(r["router"], r["policy"], fmt(r["engine_cached_share"], 3), fmt(r["request_cached_share"], 3),
                  fmt(r["ttft_p50_ms"], 0), fmt(r["ttft_p99_ms"], 0), fmt(r["output_tok_s"], 1), fmt(r.get("front_cpu_s"), 1),
                  " ; ".join("/".join(map(str, x)) for x in r["requests_per_replica"]), str(r["errors"]),
                  " ; ".join(f"{a:.1f}→{b:.1f}" for a, b in r["load_avg"]))
    return t


def save(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.part")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--users", type=int, default=16)
    ap.add_argument("--turns", type=int, default=6)
    ap.add_argument("--system-prompt-tokens", type=int, default=256)
    ap.add_argument("--turn-tokens", type=int, default=64)
    ap.add_argument("--answer-tokens", type=int, default=16)
    ap.add_argument("--think-time", default="0",
                    help="between an answer and the user's next turn: fixed (2s) or drawn per turn (exp:2s), as "
                         "`servedeck bench --workload conversations`; a drawn one keeps users out of lockstep")
    ap.add_argument("--reps", type=int, default=1, help="rounds over every router, the order rotated each round")
    ap.add_argument("--seed", type=int, default=25)
    ap.add_argument("--routers", nargs="+", default=[f"{r}:{p}" for r, p in ARMS], metavar="ROUTER:POLICY",
                    help="a subset of the arms, e.g. door:prefix vllm-router:cache_aware")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "routing_side_by_side.json")
    ap.add_argument("--llama-server", help="the replicas' llama-server (default: the one scripts/setup.sh cached)")
    ap.add_argument("--gguf", help="the replicas' model (default: the cached SmolLM2-135M GGUF)")
    ap.add_argument("--replica-arg", action="append", default=[], metavar="ARG",
                    help="one more llama-server argument for each replica (repeat), e.g. --replica-arg=-ngl "
                         "--replica-arg=999")
    ap.add_argument("--no-pin", action="store_true",
                    help="leave the replicas unpinned at llama-server's own thread count (a host with cores to spare); "
                         "the default holds each to one core with --threads 1")
    a = ap.parse_args()
    loc = default_locations() if not (a.llama_server and a.gguf) else {}
    ENGINE.update(llama_server=a.llama_server or loc["llama_server"], gguf=a.gguf or loc["smollm2_gguf"],
                  pin=not a.no_pin, extra_args=list(a.replica_arg))
    arms = []
    for item in a.routers:
        router, _, policy = item.partition(":")
        if (router, policy) not in ARMS:
            ap.error(f"--routers {item!r}: expected one of {', '.join(f'{r}:{p}' for r, p in ARMS)}")
        arms.append((router, policy))
    spec = ConversationsSpec(users=a.users, turns=a.turns, turn_tokens=a.turn_tokens, answer_tokens=a.answer_tokens,
                             system_prompt_tokens=a.system_prompt_tokens, seed=a.seed, request_timeout_s=600.0)
    think = parse_drawn(a.think_time, "--think-time", least=0.0, integer=False)
    spec = dataclasses.replace(spec, think_time_s=think.mean, think_dist=None if think.fixed else think)
    spec = dataclasses.replace(spec, max_context=slot_context(spec))
    try:
        spec.check(spec.max_context)
    except Exception as e:  # a UsageError: said plainly, no traceback
        ap.error(str(e))
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    result: dict[str, Any] = {
        "tool": "bench/routing_side_by_side.py", "argv": sys.argv[1:], "commit": git_commit(REPO),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "platform": {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
                     "load_avg_start": os.getloadavg()},
        "workload": spec.to_json(), "vllm_router": vllm_router_version(),
        "replica_argv": ["llama-server", "-m", Path(ENGINE["gguf"]).name, "--alias", MODEL, *replica_argv(spec)],
        "replica_cores": "replica i on core i (sched_setaffinity)" if ENGINE["pin"] else "unpinned",
        "cold_caches": "replicas and router started afresh for every arm",
    }
    live: list[Any] = []
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="routing-bench-") as tmp:
        work = Path(tmp)
        try:
            pair = Pair(replica_argv(spec))
            live.append(pair)
            tx = run_loop(calibrate(spec, pair.urls[0]))
            pair.stop()
            live.remove(pair)
            result["chars_per_token"] = tx.cpt
            for rep in range(a.reps):
                order = arms[rep % len(arms):] + arms[:rep % len(arms)]
                for router, policy in order:
                    rows.append(arm(spec, router, policy, tx, rep, work, live))
                    save(a.out, {**result, "rows": rows, "partial": True})  # an arm that fails later loses nothing
        finally:
            for thing in reversed(live):
                thing.stop()
    result["platform"]["load_avg_end"] = os.getloadavg()
    result["rows"] = rows
    result["medians"] = medians(rows)
    result["paired"] = paired(rows, ("door", "prefix"), ("vllm-router", "cache_aware"))
    save(a.out, result)
    console.print(table(result["medians"], f"conversations {spec.users} users × {spec.turns} turns, system prompt "
                        f"{spec.system_prompt_tokens} tokens, turns {spec.turn_tokens}, answers {spec.answer_tokens}, "
                        f"think {a.think_time}; "
                        f"2 llama.cpp replicas ({Path(ENGINE['gguf']).name}); medians of {a.reps} rep(s)"))
    if result["paired"]:
        pr = result["paired"]
        for k in ("ttft_p50_ms", "ttft_p99_ms"):
            console.print(f"{pr['a']} minus {pr['b']}, {k}, rep by rep: "
                          f"{', '.join(f'{x:+.0f}' for x in pr[k]['differences'])} (median {pr[k]['median']:+.0f} ms; "
                          f"{pr['a']} higher in {pr[k]['a_higher']} of {pr[k]['of']})")
    console.print(f"wrote {a.out} (load average at start {result['platform']['load_avg_start'][0]:.1f}, at end "
                  f"{result['platform']['load_avg_end'][0]:.1f}, {os.cpu_count()} CPUs)")


if __name__ == "__main__":
    main()
