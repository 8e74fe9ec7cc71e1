"""bench/routing_side_by_side.py end to end on real llama-servers (SmolLM2-135M), in both of its modes, with the
smallest workload that still shares a system prompt and continues conversations (2 users x 2 turns), door:prefix
against vllm-router:cache_aware:
  - its own two llama-servers (issue 25's setting): the JSON keeps its shape, requests per replica still come
    from each replica's `slot release` lines;
  - --config --model: a models.toml entry with replicas = 2, started and stopped by servedeck's deck, the door
    being `servedeck serve` on a copy of that file (routing = "prefix"), which finds the deck's replicas.
Each arm's turns all reach the replicas (the per-replica counts add up to users x turns) and nothing is left
running (the session's guard)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from benchkit import BENCH as BENCH_DIR, pair_toml
from ports import free_port_pair

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp, pytest.mark.slow]
BENCH = BENCH_DIR / "routing_side_by_side.py"
SMALL = ["--users", "2", "--turns", "2", "--system-prompt-tokens", "160", "--turn-tokens", "32",
         "--answer-tokens", "8", "--reps", "1", "--routers", "door:prefix", "vllm-router:cache_aware"]
# what the llama.cpp mode's JSON has always held (issue 25's results are read by these names)
KEYS = {"tool", "argv", "commit", "started", "platform", "workload", "vllm_router", "replica_argv", "replica_cores",
        "cold_caches", "chars_per_token", "rows", "medians", "paired"}
ROW_KEYS = {"router", "policy", "rep", "front_argv", "load_avg_start", "load_avg_end", "wall_s", "turns_sent", "errors",
            "engine_cached_share", "engine_queried_tokens", "engine_hit_tokens", "request_cached_share", "ttft_p50_ms",
            "ttft_p99_ms", "output_tok_s", "requests_per_replica", "front_cpu_s", "front_cpu_share_of_wall",
            "counters_before", "counters_after", "per_turn", "cutoffs"}


def bench(tmp_path: Path, *args: str) -> dict:
    out = tmp_path / "out.json"
    r = subprocess.run([sys.executable, str(BENCH), *SMALL, "--out", str(out), *args], capture_output=True,
                       text=True, timeout=900, env=dict(os.environ))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text())


def check_arms(doc: dict) -> None:
    assert [(r["router"], r["policy"]) for r in doc["rows"]] == [("door", "prefix"), ("vllm-router", "cache_aware")]
    for row in doc["rows"]:
        assert ROW_KEYS <= set(row)
        assert row["errors"] == 0 and row["turns_sent"] == 4
        assert sum(row["requests_per_replica"]) == 4, row["requests_per_replica"]
        assert row["engine_queried_tokens"] > 0 and row["engine_hit_tokens"] > 0
        # turn 2 continues turn 1, so some of it comes from a cache, as the requests themselves say. How much
        # is the bench's measurement, not an invariant: with 2 users a turn may land on a replica or slot that
        # does not hold its history (CI, 2026-12-03: one of the two turn-2 requests found nothing cached and
        # the turn's share was 0.41; the bench's own 16-user runs measure 0.81, bench/results/)
        assert row["per_turn"][1]["cached_share"] > 0
    assert doc["paired"]["reps"] == 1


def test_its_own_llama_servers_as_before(tmp_path, engines_ready):
    doc = bench(tmp_path)
    assert KEYS <= set(doc) and "partial" not in doc
    assert doc["mode"] == "llama-server" and "slot" in doc["requests_per_replica_from"]
    check_arms(doc)


def test_an_entry_with_replicas_through_the_deck_and_the_door_on_its_models_toml(tmp_path, engines_ready):
    port = free_port_pair()
    (tmp_path / "models.toml").write_text(pair_toml(engines_ready, port))
    doc = bench(tmp_path, "--config", str(tmp_path / "models.toml"), "--model", "smol")
    assert doc["mode"] == "deck" and doc["members"] == ["smol.r1", "smol.r2"] and doc["between_arms"] == "restart"
    assert [r["url"] for r in doc["replicas"]] == [f"http://127.0.0.1:{port}", f"http://127.0.0.1:{port + 1}"]
    assert doc["replica_cores"] == {"smol.r1": [0], "smol.r2": [1]}
    check_arms(doc)
    door = doc["rows"][0]
    assert "routing = 'prefix'" in door["front_argv"][-1]
    assert all(b["requests_finished"] == 2 for b in door["counters_before"])  # readiness probe + warm-up each


def test_sigterm_while_the_deck_starts_the_replicas_leaves_nothing_running(tmp_path, engines_ready):
    """The bench's SIGTERM is a KeyboardInterrupt where it lands, as the deck expects of an interrupt: a replica
    booting in `Deck.start` is stopped by the deck itself (a SystemExit left it running, its live record in
    the bench's temp home, which was then removed: nobody could find it again)."""
    port = free_port_pair()
    (tmp_path / "models.toml").write_text(pair_toml(engines_ready, port))
    proc = subprocess.Popen([sys.executable, str(BENCH), *SMALL, "--out", str(tmp_path / "out.json"), "--config",
                             str(tmp_path / "models.toml"), "--model", "smol"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=dict(os.environ))
    try:
        t0 = time.monotonic()
        while not listening(port) and proc.poll() is None and time.monotonic() - t0 < 120:
            time.sleep(0.05)
        assert proc.poll() is None, proc.stdout.read()
        proc.send_signal(signal.SIGTERM)  # replica 1 is up (loading, or being probed): the deck's start is on
        out, _ = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, out[-3000:]
    assert "stopped by SIGTERM" in out and "Traceback" not in out, out[-3000:]
    kept = re.search(r"launch folders are kept in (\S+)/launches", out)  # the evidence of the start cut short
    assert kept and (Path(kept.group(1)) / "launches" / "smol.r1").is_dir(), out[-3000:]
    shutil.rmtree(kept.group(1))
    left = [p.info for p in psutil.process_iter(["pid", "cmdline"])
            if any(f"--port {q} " in " ".join(p.info["cmdline"] or []) + " " for q in (port, port + 1))]
    assert not left, left
    assert not listening(port) and not listening(port + 1)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0
