"""Replica routing side by side, in one run (issue 25; on vLLM, issue 32): the `conversations` workload on
replicas of one model, through the door with each of its policies (least-outstanding, session, prefix) and
through vllm-router with cache_aware and round_robin, in front of the same replicas.

Two kinds of replicas (bench/_routing_replicas.py):

  llama.cpp (the default) two llama-servers the bench starts itself: the cached llama-server and GGUF
      (scripts/setup.sh; servedeck.init.default_locations, as tests/conftest.py finds them), each `--threads 1
      --threads-batch 1` and held to one core of its own (replica i on core i mod the CPU count), `--parallel` =
      the number of users (so a router that sends every conversation to one replica finds a slot for each),
      each slot big enough for a whole conversation, prompt cache at llama-server's defaults (on, with its
      host-memory prompt cache), `--metrics`. The door gets them as `--upstream`s.
  --config FILE --model NAME   a models.toml entry with replicas = N (any engine; typically vLLM, each
      replica with its own gpu_memory_utilization share of one GPU), started and stopped by servedeck's own
      deck (`Deck(cfg).start/stop`) in the bench's own SERVEDECK_HOME. The door is `servedeck serve` on a copy
      of FILE whose entry routes by the arm's policy (bench/_routing_door.py says what else the copy changes),
      finding the replicas where the deck recorded them; vllm-router gets their URLs. The entry decides the
      context, CPUs or GPUs and the engine's flags.

Cold caches for every router. The router (door or vllm-router) is started afresh for each arm, so its own
memory (pins, recent prefixes, radix tree) starts empty; the replicas:
  --between-arms restart (the default)   started afresh for each arm and stopped after it. A llama-server's
      prefix cache lives in its slots and in its host-memory prompt cache (`--cache-ram`), so a restart is the
      one way that empties both (erasing slots leaves the second).
  --between-arms reset (--config only)   started once; before every arm each replica's prefix cache is emptied
      in place, where its engine's adapter says a running server can be (`prefix_cache_reset`: vLLM with
      VLLM_SERVER_DEV_MODE=1 in the model's env, POST /reset_prefix_cache; refused before any boot otherwise).
      A vLLM boot costs 30-90 s, which a GPU call's time cannot pay per arm.
Every arm sends the same conversations (same seed: same system prompt, same user turns; greedy answers), and
the order of the arms rotates from one rep to the next. --config: one 1-token request to each replica after
each boot, before its counters are read, so what an engine does on its first request falls on no arm.

The client is servedeck's own conversations workload (workloads/conversations.py: its `_Run.converse`,
workloads/window.py's `calibrate`, and runs/turns.py's figures), so each turn is what `servedeck bench --workload
conversations` sends and records. Turn sizes are calibrated once, on a replica's tokenizer, before the
first arm (with restart, the replicas are restarted after). Per router:
    engine cached share   Σ prompt tokens found in the prefix cache / Σ prompt tokens looked up, over every
                          replica, after − before the arm, through the engine's adapter (`prefix_counters`, as
                          workloads/window.py reads them: llama.cpp llamacpp:prompt_tokens_cached_total / (that +
                          llamacpp:prompt_tokens_total); vLLM vllm:prefix_cache_hits_total /
                          vllm:prefix_cache_queries_total); the issue's figure
    per-request share     Σ usage.cached_tokens / Σ prompt tokens over the turns (runs/turns.py)
    TTFT p50 / p99, output tok/s   loadgen.stats.summarize over the arm's turns and wall time
    requests per replica  requests each replica finished during the arm, through its adapter
                          (`requests_finished`: vLLM's vllm:request_success_total on its own /metrics;
                          llama.cpp's `slot release` lines in its own log, its /metrics counting none)
    router CPU s          CPU seconds the router process (and its children) used during the arm (psutil):
                          time the replicas could not have on these 2 cores
Medians over --reps; every rep's figures are in the JSON, and `paired` holds door:prefix minus
vllm-router:cache_aware rep by rep (the two ran one after the other in each rep). --time-budget: no rep
starts once the time since the first arm began plus the longest rep so far would pass it (the JSON says
how many ran), so a device call's limit ends the run between reps, not inside one.

    .venv/bin/python bench/routing_side_by_side.py [--users 16] [--turns 6] [--system-prompt-tokens 256]
        [--turn-tokens 64] [--answer-tokens 16] [--think-time 0] [--reps 1] [--time-budget 4m]
        [--routers door:prefix vllm-router:cache_aware ...] [--out bench/results/routing_side_by_side.json]
        [--llama-server PATH --gguf PATH] [--replica-arg=ARG ...] [--no-pin]   (another engine build and model,
                                                                                as scripts/gpu-routing.sh on an H200)
        [--config models.toml --model NAME [--between-arms reset]]              (an entry with replicas = N)

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
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import httpx
import psutil
from rich.console import Console
from rich.table import Table

from servedeck.workloads.conversations import MARGIN, PER_TURN_EXTRA, ConversationsSpec, _Run

from servedeck.workloads.window import calibrate as calibrate_chars
from servedeck.workloads.reporter import QuietReporter
from servedeck.engines import get_engine
from servedeck.errors import ServedeckError, UsageError
from servedeck.gates.server import ServerTokens, server_context
from servedeck.init import default_locations
from servedeck.loadgen import texts
from servedeck.loadgen.drawn import parse_drawn
from servedeck.loadgen.api import ApiClient
from servedeck.loadgen.loop import run as run_loop
from servedeck.loadgen.prompts import seeded_nonce
from servedeck.loadgen.stats import summarize
from servedeck.modelsfile import load as load_config
from servedeck.redact import redact_env, redact_settings_args
from servedeck.runs.folder import RunFolder
from servedeck.runs.turns import turn_figures
from servedeck.timeparse import seconds

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _routing_door import DoorOnDeck, tomllib  # noqa: E402
from _routing_replicas import (DeckReplicas, LlamaPair, replicated_entry, requests_source,  # noqa: E402
                               reset_check)
from _vllm_router import VllmRouter, version as vllm_router_version  # noqa: E402
from door_latency import DoorProcess, git_commit  # noqa: E402

REPO = HERE.parent
MODEL = "smol"  # the llama-servers' alias
# What the llama.cpp replicas run: the cached llama-server and SmolLM2 GGUF unless --llama-server / --gguf name
# others (the GPU run: a CUDA build and a random-weight GGUF, scripts/gpu-routing.sh); main() fills it in.
ENGINE: dict[str, Any] = {"llama_server": None, "gguf": None, "pin": True, "extra_args": []}
console = Console(width=170)
ARMS = [("door", "least-outstanding"), ("door", "session"), ("door", "prefix"),
        ("vllm-router", "cache_aware"), ("vllm-router", "round_robin")]


def slot_context(spec: ConversationsSpec) -> int:
    """Tokens one slot needs for a whole conversation (the workload's own estimate, plus 25 %), in 256s."""
    need = spec.system_prompt_tokens + spec.turns * (spec.turn_tokens + spec.answer_tokens + PER_TURN_EXTRA) + MARGIN
    return max(1024, -(-int(need * 1.25) // 256) * 256)


def replica_argv(spec: ConversationsSpec) -> list[str]:
    slots = spec.users
    threads = ["--threads", "1", "--threads-batch", "1"] if ENGINE["pin"] else []
    return ["--parallel", str(slots), "-c", str(slots * slot_context(spec)), *threads, "--metrics",
            *ENGINE["extra_args"]]


class LlamaSetup:
    """--llama-server mode (the default): the bench's own two llama-servers, fresh for every arm."""

    between = "restart"  # llama-server's caches empty only by a restart
    kept = None  # replicas kept across arms: none

    def __init__(self, spec: ConversationsSpec) -> None:
        self.spec = spec

    def start(self) -> LlamaPair:
        return LlamaPair(ENGINE["llama_server"], ENGINE["gguf"], MODEL, replica_argv(self.spec), ENGINE["pin"])

    def door(self, replicas: Any, policy: str, work: Path) -> tuple[Any, list[str]]:
        name = replicas.served_name
        ups = [x for u in replicas.urls for x in ("--upstream", f"{name}={u}")]
        front = DoorProcess("", *ups, "--upstream-routing", f"{name}={policy}")
        return front, ["servedeck", "serve", "--upstream", f"{name}=R1", "--upstream", f"{name}=R2",
                       "--upstream-routing", f"{name}={policy}"]

    def limit(self, replicas: Any) -> int:
        return slot_context(self.spec)

    def describe(self, replicas: Any) -> dict[str, Any]:
        return {"mode": "llama-server", "engine": "llamacpp",
                "replica_argv": ["llama-server", "-m", Path(ENGINE["gguf"]).name, "--alias", MODEL,
                                 *replica_argv(self.spec)],
                "replica_cores": "replica i on core i (sched_setaffinity)" if ENGINE["pin"] else "unpinned",
                "requests_per_replica_from": requests_source(get_engine("llamacpp")),
                "cold_caches": "replicas and router started afresh for every arm"}

    def title(self) -> str:
        return f"2 llama.cpp replicas ({Path(ENGINE['gguf']).name})"


class DeckSetup:
    """--config mode: the entry's replicas through servedeck's deck, in the bench's own SERVEDECK_HOME."""

    def __init__(self, config: Path, name: str, between: str, home: Path) -> None:
        self.config, self.home, self.between = config, home, between
        self.cfg = load_config(config)
        self.entry, self.members = replicated_entry(self.cfg, name)
        self.reset_paths = reset_check(self.cfg, self.members) if between == "reset" else {}
        self.kept: Optional[DeckReplicas] = None

    def start(self) -> DeckReplicas:
        return DeckReplicas(self.cfg, self.entry, self.reset_paths)

    def door(self, replicas: Any, policy: str, work: Path) -> tuple[Any, list[str]]:
        front = DoorOnDeck(self.config, self.entry, policy, len(self.members), self.home, work)
        return front, front.front_argv

    def context(self) -> Optional[int]:
        return self.cfg.models[self.members[0]].context

    def limit(self, replicas: Any) -> int:
        got = self.context() or run_loop(_served_context(replicas.urls[0]))
        if not got:
            raise UsageError(f"{self.members[0]} did not say its context on /v1/models, and models.{self.entry} "
                             f"in {self.config} sets none", hint=f"set models.{self.entry}.context")
        return got

    def describe(self, replicas: Any) -> dict[str, Any]:
        reps = replicas.describe()
        if self.between == "reset":
            cold = ("replicas started once; every replica's prefix cache emptied before each arm (POST "
                    f"{sorted(set(self.reset_paths.values()))}), router started afresh for every arm")
        else:
            cold = "replicas and router started afresh for every arm"
        return {"mode": "deck", "config": str(self.config), "model": self.entry, "members": list(self.members),
                "engine": replicas.engine, "engine_version": _version(replicas), "between_arms": self.between,
                "first_start_s": round(replicas.ready_s, 1),  # Deck.start of every replica, one after the other
                "replicas": reps, "replica_argv": reps[0]["argv"],
                "replica_cores": {r["model"]: r["cpus"] for r in reps},
                "requests_per_replica_from": requests_source(replicas.adapter), "cold_caches": cold,
                "models_toml_entry": self.entry_as_written()}

    def entry_as_written(self) -> dict[str, Any]:
        """models.NAME as the file has it, for the results: secret-named keys and token-shaped values of
        its env, args and request hidden (servedeck.redact), as launch.json and desired.json keep them."""
        entry = dict(tomllib.loads(self.config.read_text())["models"][self.entry])
        if isinstance(entry.get("env"), dict):
            entry["env"] = redact_env({k: str(v) for k, v in entry["env"].items()})
        for key in ("args", "request"):
            if isinstance(entry.get(key), dict):
                entry[key] = redact_settings_args(entry[key])
        return entry

    def title(self) -> str:
        return f"{len(self.members)} replicas of {self.entry} ({self.cfg.models[self.members[0]].build})"


async def _served_context(url: str) -> Optional[int]:
    async with ApiClient(url) as api:
        return await server_context(api)


def _version(replicas: DeckReplicas) -> Optional[str]:
    """The engine's version as the first replica states it (the adapter's version path), else its boot log."""
    vp = replicas.adapter.version_path
    if vp:
        try:
            got = httpx.get(replicas.urls[0] + vp[0], timeout=10).json().get(vp[1])
            if got:
                return str(got)
        except (httpx.HTTPError, ValueError, AttributeError):
            pass
    return (replicas.records[0].boot or {}).get("engine_version")


class Texts:
    """What every arm sends: the same system prompt, the same user turns (one seed)."""

    def __init__(self, cpt: float, system: str, user_seeds: list[float]) -> None:
        self.cpt, self.system, self.user_seeds = cpt, system, user_seeds


async def calibrate(spec: ConversationsSpec, url: str, served: str, engine: str) -> Texts:
    """As run_conversations does before its point: chars/token on the server's tokenizer, the system prompt,
    a seed per user — from one rng, so every arm gets the same."""
    rng = random.Random(spec.seed)
    async with ApiClient(url) as api:
        cpt = await calibrate_chars(ServerTokens(api, served, engine), spec.content, texts.start_of(spec.content, rng),
                               spec.turn_tokens)
    system = ""
    if spec.system_prompt_tokens:
        system = ("You are a careful assistant. Answer briefly. Background reading follows.\n\n"
                  + texts.piece(spec.content, texts.start_of(spec.content, rng), int(spec.system_prompt_tokens * cpt)))
    return Texts(cpt, system, [rng.random() for _ in range(spec.users)])


async def converse_all(spec: ConversationsSpec, url: str, tx: Texts, folder: RunFolder, served: str,
                       request: dict[str, Any]) -> tuple[_Run, float]:
    """Every user's conversation at once through `url`, servedeck's workload client; (the run, wall s)."""
    target = SimpleNamespace(served_name=served, request=request)  # what _Run reads of a Target: name and extra body
    async with ApiClient(url) as api:
        run = _Run(spec, target, spec.max_context, folder, api, QuietReporter(), seeded_nonce(spec.seed, 0),  # type: ignore[arg-type]
                   tx.cpt, tx.system, time.perf_counter())
        await asyncio.gather(*(run.converse(c, random.Random(tx.user_seeds[c])) for c in range(spec.users)))
        return run, time.perf_counter() - run.start


def diff(after: list[dict[str, Any]], before: list[dict[str, Any]], key: str) -> list[Optional[float]]:
    """Per replica: after − before of one counter (None where either read lacks it)."""
    return [None if a.get(key) is None or b.get(key) is None else a[key] - b[key] for a, b in zip(after, before)]


def settled_counters(replicas: Any, before: list[dict[str, Any]], answered: int,
                     wait_s: float = 10.0) -> list[dict[str, Any]]:
    """The replicas' counters once they account for the `answered` requests the client saw end. An engine
    counts a request after its last chunk has gone out (llama.cpp writes its `slot release` line then, and
    through the deck that line reaches the launch's log by the shim), so a read at once can miss the last
    one (seen as 3 of 4 on a busy 2-core box). Polls up to `wait_s`; past it, what the engines say."""
    deadline = time.monotonic() + wait_s
    while True:
        after = replicas.counters()
        served = diff(after, before, "requests_finished")
        if any(x is None for x in served) or sum(served) >= answered or time.monotonic() > deadline:  # type: ignore[arg-type]
            return after
        time.sleep(0.1)


def arm(setup: Any, spec: ConversationsSpec, router: str, policy: str, tx: Texts, rep: int, work: Path,
        live: list[Any]) -> dict[str, Any]:
    la0 = os.getloadavg()
    reset = None
    fresh = setup.kept is None
    if fresh:
        replicas = setup.start()
        live.append(replicas)
    else:
        replicas = setup.kept
        reset = replicas.reset()
    front: Any = None
    try:
        if router == "door":
            front, front_argv = setup.door(replicas, policy, work)
        else:
            front = VllmRouter(replicas.urls, policy)
            front_argv = ["vllm-router", *front.argv[1:]]
        live.append(front)
        cpu0 = front_cpu_s(front.proc)
        before = replicas.counters()
        folder = RunFolder(work / f"rep{rep}-{router}-{policy}", {})
        folder.path.mkdir(parents=True)
        run, wall = run_loop(converse_all(spec, front.url, tx, folder, replicas.served_name, replicas.request))
        after = settled_counters(replicas, before, sum(1 for r in run.records if r.status == "ok"))
        front_cpu = front_cpu_s(front.proc) - cpu0
    finally:
        if front is not None:
            front.stop()
            live.remove(front)
        if fresh:
            replicas.stop()
            live.remove(replicas)
    q = sum(x or 0 for x in diff(after, before, "queried_tokens"))
    h = sum(x or 0 for x in diff(after, before, "hit_tokens"))
    served = [None if x is None else int(x) for x in diff(after, before, "requests_finished")]
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
           "replicas_ready_s": getattr(replicas, "ready_s", None) if fresh else None, "cache_reset": reset,
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
                  " ; ".join("/".join(map(fmt, x)) for x in r["requests_per_replica"]), str(r["errors"]),
                  " ; ".join(f"{a:.1f}→{b:.1f}" for a, b in r["load_avg"]))
    return t


def save(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.part")
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(path)


def budget_left(budget_s: Optional[float], since: float, longest_rep_s: float, now: float) -> bool:
    """Whether one more rep fits: no budget, or the time so far plus the longest rep so far stays inside it."""
    return budget_s is None or (now - since) + longest_rep_s <= budget_s


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised where the bench is, as a Ctrl-C is: the deck stops a replica it is starting on a
    KeyboardInterrupt (deck/foreground.py turns SIGTERM into one too); a SystemExit would leave it booting."""


def _terminated(*_: Any) -> None:
    raise Terminated()


def reps(a: argparse.Namespace, setup: Any, spec: ConversationsSpec, tx: Texts, budget: Optional[float],
         result: dict[str, Any], rows: list[dict[str, Any]], work: Path, live: list[Any]) -> None:
    """Every rep of every arm, the order rotated from rep to rep, the JSON saved after each arm; none
    started that the time budget says will not fit."""
    since, longest = time.monotonic(), 0.0
    for rep in range(a.reps):
        if rep and not budget_left(budget, since, longest, time.monotonic()):
            result["stopped_by_budget"] = {"reps_done": rep, "elapsed_s": round(time.monotonic() - since, 1),
                                           "longest_rep_s": round(longest, 1)}
            console.log(f"time budget: {rep} rep(s) done in {time.monotonic() - since:.0f} s, the longest "
                        f"{longest:.0f} s: no more fit in {budget:g} s")
            return
        t_rep = time.monotonic()
        order = a.arms[rep % len(a.arms):] + a.arms[:rep % len(a.arms)]
        for router, policy in order:
            rows.append(arm(setup, spec, router, policy, tx, rep, work, live))
            save(a.out, {**result, "rows": rows, "partial": True})  # an arm that fails later loses nothing
        longest = max(longest, time.monotonic() - t_rep)


def parse_args(argv: Optional[list[str]] = None) -> argparse.Namespace:
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
    ap.add_argument("--time-budget", metavar="DURATION",
                    help="start no rep once the time since the first arm plus the longest rep so far would pass "
                         "this (e.g. 4m): a device call's limit then ends the run between reps")
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
    ap.add_argument("--config", type=Path, metavar="MODELS_TOML",
                    help="replicas from this models.toml instead: the entry --model names (replicas = 2 or more), "
                         "started and stopped by servedeck's deck")
    ap.add_argument("--model", metavar="NAME", help="with --config: the entry whose replicas the routers share")
    ap.add_argument("--between-arms", choices=("restart", "reset"), default="restart",
                    help="how every arm meets cold caches: restart the replicas (default), or (--config, where the "
                         "engine allows: vLLM with VLLM_SERVER_DEV_MODE=1) empty their prefix caches in place")
    a = ap.parse_args(argv)
    if (a.config is None) != (a.model is None):
        ap.error("--config and --model go together: the models.toml and the entry with replicas in it")
    if a.config is not None and (a.llama_server or a.gguf or a.replica_arg or a.no_pin):
        ap.error("--llama-server, --gguf, --replica-arg and --no-pin are for the bench's own llama-servers; with "
                 "--config the entry says what its replicas run (args, cpus, gpus)")
    if a.between_arms == "reset" and a.config is None:
        ap.error("--between-arms reset needs --config: llama-server's caches empty only by a restart")
    arms = []
    for item in a.routers:
        router, _, policy = item.partition(":")
        if (router, policy) not in ARMS:
            ap.error(f"--routers {item!r}: expected one of {', '.join(f'{r}:{p}' for r, p in ARMS)}")
        arms.append((router, policy))
    a.arms = arms
    return a


def main() -> None:
    a = parse_args()
    signal.signal(signal.SIGTERM, _terminated)
    try:
        run(a)
    except ServedeckError as e:  # a user's mistake, said plainly: no traceback
        console.print(f"[red]error:[/] {e.message}", highlight=False)
        if e.hint:
            console.print(f"hint: {e.hint}", highlight=False)
        sys.exit(e.exit_code)
    except KeyboardInterrupt as e:
        console.print(f"stopped by {'SIGTERM' if isinstance(e, Terminated) else 'Ctrl-C'}: every process it "
                      f"started is stopped; the arms that finished, if any, are in {a.out}", highlight=False)
        sys.exit(143 if isinstance(e, Terminated) else 130)


def run(a: argparse.Namespace) -> None:
    spec = ConversationsSpec(users=a.users, turns=a.turns, turn_tokens=a.turn_tokens, answer_tokens=a.answer_tokens,
                             system_prompt_tokens=a.system_prompt_tokens, seed=a.seed, request_timeout_s=600.0)
    think = parse_drawn(a.think_time, "--think-time", least=0.0, integer=False)
    spec = dataclasses.replace(spec, think_time_s=think.mean, think_dist=None if think.fixed else think)
    budget = seconds(a.time_budget, "--time-budget") if a.time_budget else None
    live: list[Any] = []
    rows: list[dict[str, Any]] = []
    # --config: the deck's state (each replica's launch folder: engine.log, and how it ended) outside the work
    # folder, kept when the run fails, so that a replica that would not start or died can still be read
    home = Path(tempfile.mkdtemp(prefix="routing-bench-home-")) if a.config is not None else None
    finished = False
    try:
        with tempfile.TemporaryDirectory(prefix="routing-bench-") as tmp:
            work = Path(tmp)
            if a.config is not None:
                os.environ["SERVEDECK_HOME"] = str(home)  # the bench's own deck: the user's is not touched
                setup: Any = DeckSetup(a.config.resolve(), a.model, a.between_arms, home)
                spec = dataclasses.replace(spec, max_context=setup.context())
            else:
                loc = default_locations() if not (a.llama_server and a.gguf) else {}
                ENGINE.update(llama_server=a.llama_server or loc["llama_server"], gguf=a.gguf or loc["smollm2_gguf"],
                              pin=not a.no_pin, extra_args=list(a.replica_arg))
                setup = LlamaSetup(spec)
                spec = dataclasses.replace(spec, max_context=slot_context(spec))
            setup_spec = spec
            spec.check(spec.max_context)  # what can be refused is refused before any boot
            result: dict[str, Any] = {
                "tool": "bench/routing_side_by_side.py", "argv": sys.argv[1:], "commit": git_commit(REPO),
                "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                "platform": {"python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
                             "load_avg_start": os.getloadavg()},
                "vllm_router": vllm_router_version(),
            }
            try:
                first = setup.start()
                live.append(first)
                spec = dataclasses.replace(setup_spec, max_context=setup.limit(first))
                spec.check(spec.max_context)
                tx = run_loop(calibrate(spec, first.urls[0], first.served_name, first.engine))
                result.update(workload=spec.to_json(), **setup.describe(first), chars_per_token=tx.cpt,
                              time_budget_s=budget)
                if setup.between == "reset":
                    setup.kept = first  # booted once: emptied in place before every arm
                else:
                    first.stop()
                    live.remove(first)
                reps(a, setup, spec, tx, budget, result, rows, work, live)
            finally:
                for thing in reversed(live):
                    thing.stop()
        finished = True
    finally:
        if home is not None and finished:
            shutil.rmtree(home, ignore_errors=True)
        elif home is not None:
            console.print(f"the replicas' launch folders are kept in {home}/launches (`SERVEDECK_HOME={home} "
                          "servedeck logs NAME` reads one)", highlight=False)
    result["platform"]["load_avg_end"] = os.getloadavg()
    result["rows"] = rows
    result["medians"] = medians(rows)
    result["paired"] = paired(rows, ("door", "prefix"), ("vllm-router", "cache_aware"))
    save(a.out, result)
    done = len({r["rep"] for r in rows})
    console.print(table(result["medians"], f"conversations {spec.users} users × {spec.turns} turns, system prompt "
                        f"{spec.system_prompt_tokens} tokens, turns {spec.turn_tokens}, answers {spec.answer_tokens}, "
                        f"think {a.think_time}; {setup.title()}; medians of {done} rep(s)"))
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
