"""The replicas bench/routing_side_by_side.py routes to, two kinds with one face (`urls`, `served_name`,
`engine`, `request`, `counters()`, `reset()`, `stop()`):

  LlamaPair    two llama-server processes the bench starts itself (the cached build and GGUF, or --llama-server
               and --gguf), each pinned to one core: issue 25's setting, unchanged
  DeckReplicas a models.toml entry with replicas = N, started by servedeck's own deck (`Deck(cfg).start(entry)`:
               every replica, recorded in the bench's own SERVEDECK_HOME) and stopped by it; any engine

Every engine-specific figure comes through the engine's adapter: the prefix-cache counters
(`prefix_counters`), requests finished (`requests_finished`: vLLM's `vllm:request_success_total`, llama.cpp's
`slot release` log lines) and whether and how a running replica's prefix cache is emptied
(`prefix_cache_reset`)."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any, Optional

import httpx

from servedeck.config import Config
from servedeck.config.schema import merge_request
from servedeck.deck import Deck
from servedeck.deck.records import LiveRecord
from servedeck.engines import get_engine
from servedeck.engines.base import Engine, LaunchSpec
from servedeck.engines.metrics import read_metrics
from servedeck.errors import UsageError
from servedeck.supervisor.process import engine_env
from servedeck.testing.ports import free_port  # below the ephemeral range: that module says why

from _vllm_router import stop_process, wait_healthy

RESET_WAIT_S = 30.0  # vLLM refuses a reset while blocks are held (requests still finishing): retried this long


def replica_counters(adapter: Engine, url: str, log_text: Optional[str] = None) -> dict[str, Any]:
    """One replica's counters now, through its engine's adapter: prompt tokens looked up and found in the
    prefix cache, tokens generated, requests finished (/metrics, else its log's per-request lines)."""
    raw = read_metrics(url, 10.0) or {}
    pc = adapter.prefix_counters(raw) or {}
    gen = adapter.metrics.get("generation_tokens")
    return {"queried_tokens": pc.get("queries"), "hit_tokens": pc.get("hits"),
            "tokens_predicted": raw.get(gen) if gen else None,
            "requests_finished": adapter.requests_finished(raw, log_text)}


def requests_source(adapter: Engine) -> str:
    """Where requests per replica come from, as the results say."""
    if adapter.metrics.get("requests_finished"):
        return f"/metrics {adapter.metrics['requests_finished']}"
    if adapter.finished_request_line is not None:
        return f"log lines matching {adapter.finished_request_line.pattern!r}"
    return "not counted: the engine's adapter names no counter or log line"


# --- llama.cpp, as issue 25 ran it ---------------------------------------------------------------------

class LlamaServer:
    """One llama-server in its own process group, its output in its own log (read for requests served)."""

    def __init__(self, binary: str, gguf: str, alias: str, argv_tail: list[str], core: int | None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = Path(tempfile.mkstemp(prefix="routing-replica-", suffix=".log")[1])
        self.argv = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(self.port), "--alias", alias, *argv_tail]
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

    def counters(self) -> dict[str, Any]:
        return replica_counters(get_engine("llamacpp"), self.url, self.log.read_text(errors="replace"))

    def stop(self) -> None:
        stop_process(self.proc, self.log)


class LlamaPair:
    """The two llama-servers of one arm, started together (replica i on core i unless `pin` is off)."""

    engine = "llamacpp"
    request: dict[str, Any] = {}
    can_reset = False

    def __init__(self, binary: str, gguf: str, alias: str, argv_tail: list[str], pin: bool) -> None:
        self.served_name = alias
        self.replicas: list[LlamaServer] = []
        try:
            for core in range(2):
                self.replicas.append(LlamaServer(binary, gguf, alias, argv_tail, core if pin else None))
            for r in self.replicas:
                r.wait_ready()
        except BaseException:
            self.stop()
            raise

    @property
    def urls(self) -> list[str]:
        return [r.url for r in self.replicas]

    def counters(self) -> list[dict[str, Any]]:
        return [r.counters() for r in self.replicas]

    def stop(self) -> None:
        for r in self.replicas:
            r.stop()


# --- a models.toml entry with replicas = N, through the deck --------------------------------------------

def replicated_entry(cfg: Config, name: str) -> tuple[str, tuple[str, ...]]:
    """The entry `name` (its name or an alias) and its replicas' model names; a UsageError naming the file
    and the entry when it has fewer than two."""
    group = cfg.group_named(name)
    if group is None:
        known = ", ".join(f"{g.name} ({len(g.members)} replicas)" for g in cfg.groups.values()) or "none"
        single = name in cfg.models or any(name in m.aliases for m in cfg.models.values())
        raise UsageError(
            f"--model {name!r}: {cfg.path} has " + (f"{name!r} as a single server" if single else f"no entry {name!r}")
            + f"; routing compares replicas of one entry (entries with replicas: {known})",
            hint=f"give models.{name} replicas = 2 (and one `cpus` or `gpus` list per replica, or none to share "
                 "the default GPU), see docs/config.md#replicas")
    return group.name, group.members


def launch_env(spec: LaunchSpec, image: str | None) -> dict[str, str]:
    """The environment the engine will see: servedeck's own plus the launch's (supervisor/process.py), or
    only the launch's for a container (its argv passes those keys alone)."""
    return dict(engine_env(spec)) if image else {**os.environ, **engine_env(spec)}


def reset_check(cfg: Config, members: tuple[str, ...]) -> dict[str, str]:
    """Each replica's reset path, from its engine's adapter; a UsageError (the adapter's why and hint)
    before anything starts when one of them cannot be reset while it runs."""
    deck = Deck(cfg)
    paths = {}
    for m in members:
        spec = deck.render(m)
        build = cfg.deck.builds[cfg.models[m].build]
        how = get_engine(spec.engine).prefix_cache_reset(launch_env(spec, build.image))
        if how.path is None:
            raise UsageError(f"--between-arms reset: {m} ({spec.engine}, {cfg.path}): {how.why_not}",
                             hint=f"{how.hint}; or leave --between-arms at restart (a fresh start per arm)")
        paths[m] = how.path
    return paths


class DeckReplicas:
    """Every replica of one models.toml entry, started by the deck and stopped by it (SERVEDECK_HOME is the
    bench's own: nothing of the user's deck is touched). `reset_paths` (from `reset_check`) lets `reset()`
    empty their prefix caches in place."""

    def __init__(self, cfg: Config, entry: str, reset_paths: dict[str, str] | None = None) -> None:
        self.cfg, self.entry, self.reset_paths = cfg, entry, reset_paths or {}
        self.deck = Deck(cfg)
        t0 = time.monotonic()
        res = self.deck.start(entry, reason="routing bench")  # every replica, or none (start_all stops the rest)
        self.ready_s = time.monotonic() - t0
        self.records: list[LiveRecord] = res.records
        first = cfg.models[self.records[0].model]
        self.engine = self.records[0].engine
        self.adapter = get_engine(self.engine)
        self.served_name = self.records[0].served_name or first.served_name or entry
        self.request = dict(first.request)
        try:
            self.warm_up()
        except BaseException:  # a Ctrl-C too: the caller never gets them to stop
            self.stop()
            raise

    @property
    def can_reset(self) -> bool:
        return bool(self.reset_paths)

    @property
    def urls(self) -> list[str]:
        return [(r.base_url or f"http://{r.host}:{r.port}").rstrip("/") for r in self.records]

    def describe(self) -> list[dict[str, Any]]:
        """What each replica runs, for the results: argv (redacted), CPUs, GPUs, its boot facts."""
        out = []
        for rec, url in zip(self.records, self.urls):
            spec = rec.spec or {}
            out.append({"model": rec.model, "url": url, "argv": spec.get("argv"), "cpus": rec.cpus, "gpus": rec.gpus,
                        "boot": rec.boot, "launch_dir": Path(rec.launch_dir).name})
        return out

    def warm_up(self) -> None:
        """One 1-token chat request to each replica, before its counters are first read: what an engine
        does on its first request (lazy set-up) then falls on no arm. Its short prompt shares no
        workload's prefix."""
        body = merge_request({"model": self.served_name, "messages": [{"role": "user", "content": "Say OK."}],
                              "max_tokens": 1, "temperature": 0}, self.request)
        for url in self.urls:
            r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
            if r.status_code != 200:
                raise RuntimeError(f"warm-up request to {url} answered {r.status_code}: {r.text[:300]}")

    def counters(self) -> list[dict[str, Any]]:
        return [replica_counters(self.adapter, url, self._log(rec) if self.adapter.finished_request_line else None)
                for rec, url in zip(self.records, self.urls)]

    @staticmethod
    def _log(rec: LiveRecord) -> str:
        return (Path(rec.launch_dir) / "engine.log").read_text(errors="replace")

    def reset(self) -> dict[str, Any]:
        """Empty every replica's prefix cache (POST the adapter's path); retried while the engine says it
        cannot yet. Returns how long it took and how many tries each replica needed."""
        t0 = time.monotonic()
        tries: dict[str, int] = {}
        for rec, url in zip(self.records, self.urls):
            path = self.reset_paths[rec.model]
            n, deadline = 0, time.monotonic() + RESET_WAIT_S
            while True:
                n += 1
                r = httpx.post(url + path, timeout=30)
                if self.adapter.prefix_cache_reset_done(r.status_code, r.text):
                    break
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{rec.model} ({url}) did not empty its prefix cache within "
                                       f"{RESET_WAIT_S:g} s: POST {path} answered {r.status_code} {r.text[:200]}")
                time.sleep(0.5)
            tries[rec.model] = n
        return {"took_s": round(time.monotonic() - t0, 3), "tries": tries}

    def stop(self) -> None:
        self.deck.stop([self.entry], grace_s=30)
