"""Soak: a short real one on llama.cpp, its conversations, refusals, and the faults it must survive."""

from __future__ import annotations

import asyncio

import json
import os
import signal
import socket
import threading
import time
from pathlib import Path

import httpx
import pytest

from servedeck.deck import Deck
from servedeck.errors import RefusedError, RunError
from servedeck.runs import read as runs_read
from servedeck.soak import SoakSpec, open_soak
from servedeck.watch import Watcher
from watchkit import SECRET, add_instrument, edit, free_port, kinds, wait_for, with_host

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]


@pytest.fixture
def results(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results"))
    return tmp_path / "results"


def run_soak(cfg, spec: SoakSpec) -> dict:
    """`servedeck soak` as the CLI runs it: preflight, the load under asyncio.run, the verdict."""
    run = open_soak(cfg, spec)
    asyncio.run(run.main())
    return run.finish()


def _all_text(folder: Path) -> str:
    return "".join(p.read_text(errors="replace") for p in folder.rglob("*") if p.is_file())


def test_short_soak_on_llama_cpp(deck_config, results, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", SECRET)
    cfg = edit(deck_config, "args = { parallel = 4 }", 'args = { parallel = 4 }\nenv = { HF_TOKEN = "%s" }' % SECRET)
    spec = SoakSpec("smollm2", duration_s=24, concurrency=2, burst_every_s=8, burst_for_s=4, sample_every_s=4,
                    window_s=8, max_tokens=16, turns=3, stall_after_s=8)
    s = run_soak(cfg, spec)
    if s["faults"] and s["faults"][0]["kind"] == "stalled":
        # llama.cpp 11434 wedged once here mid-suite (2026-12-04: two requests launched, /metrics answered,
        # tokens_predicted_total still for 20 s; ggml-org/llama.cpp#27388). The soak must call that a
        # stall, which it did; the healthy soak this test is about then runs on a fresh launch.
        assert s["status"] == "failed" and "computed nothing" in s["reason"], s["reason"]
        Deck(cfg).stop(["smollm2"])
        s = run_soak(cfg, spec)
    assert s["status"] == "ok", s["reason"]
    c = s["counts"]
    assert c["ok"] >= 8 and c["error"] == 0 and c["http"] == {"200": c["ok"]}
    assert len(s["windows"]) == 3 and all(w["ok"] > 0 and w["e2e_s"]["p50"] for w in s["windows"])
    assert sum(w["burst_requests"] for w in s["windows"]) > 0  # bursts at the cap (4 slots) happened
    assert s["longest_clean_window_s"] == pytest.approx(s["elapsed_s"], abs=0.01) and s["faults"] == []
    assert len(s["samples"]) >= 5 and all(x["healthy"] for x in s["samples"])
    folder = Path(s["path"])
    for f in ("summary.json", "requests.jsonl", "cmd.sh", "boot.json", "server.log", "config.json", "telemetry.jsonl"):
        assert (folder / f).exists(), f
    tele = json.loads((folder / "summary.json").read_text())["telemetry"]  # the engine sampled beside the soak
    assert tele["point"] == "soak" and tele["figures"]["engine"]["max_running"] >= 1
    frozen = json.loads((folder / "config.json").read_text())
    assert frozen["model"]["env"]["HF_TOKEN"] == "<redacted>" and frozen["host"]["relaunch_tries"] == 3
    assert SECRET not in _all_text(folder)  # secrets never reach a run folder
    view = runs_read.load(folder)
    assert view["status"] == "ok" and view["requests"]["unreadable"] == 0
    assert view["requests"]["lines"] == c["total"]


@pytest.mark.parametrize("reasoning", [False, True])
def test_conversations_never_resend_fields_the_server_did_not_send(deck_config, tmp_path, results, reasoning):
    port = free_port()
    cfg = add_instrument(deck_config, tmp_path, port, "--answer", "1000", *(["--reasoning"] if reasoning else []))
    s = run_soak(cfg, SoakSpec("stuck", duration_s=3, concurrency=2, burst_every_s=0, sample_every_s=1, turns=3))
    assert s["status"] == "ok" and s["counts"]["ok"] >= 6
    bodies = httpx.get(f"http://127.0.0.1:{port}/bodies").json()
    later = [b for b in bodies if len(b["messages"]) > 1]
    assert later, "no multi-turn request was sent"
    for b in later:
        for m in b["messages"]:
            if m["role"] == "assistant":
                # exactly what the instrument sent: content (+ reasoning_content when it sent one); its
                # null tool_calls is not echoed, and no reasoning_content is invented
                assert set(m) == ({"role", "content", "reasoning_content"} if reasoning else {"role", "content"})
                if reasoning:
                    assert m["reasoning_content"].replace("thinking", "fact") == m["content"]


def test_progress_is_a_counter_that_grew_and_a_stall_needs_readable_counters():
    from servedeck.soak.run import stalled
    from servedeck.watch.liveness import progress_made

    before = {"prompt_tokens": 10.0, "generation_tokens": 5.0, "running": 2.0}
    assert progress_made(before, {**before, "generation_tokens": 6.0})
    assert progress_made(before, {**before, "prompt_tokens": 11.0})
    assert not progress_made(before, {**before, "running": 4.0})  # requests held, none served
    assert not progress_made(before, dict(before)) and not progress_made(None, before) and not progress_made(before, None)
    assert stalled(2, 8.0, 8.0, True) and not stalled(2, 7.9, 8.0, True)
    assert not stalled(0, 100.0, 8.0, True)  # nothing asked, nothing owed
    assert not stalled(2, 100.0, 8.0, False)  # /metrics unreadable: a long answer looks the same


def test_an_engine_that_answers_health_but_computes_nothing_is_a_stall_fault(deck_config, tmp_path, results):
    """The stall instrument answers /health and /metrics, then no completion, its counters frozen: before
    the soak watched the counters it waited out its whole duration and said ok with nothing answered."""
    cfg = add_instrument(deck_config, tmp_path, free_port(), "--answer", "1", "--stall-chat")
    t0 = time.monotonic()
    s = run_soak(cfg, SoakSpec("stuck", duration_s=120, concurrency=2, burst_every_s=0, sample_every_s=1,
                               stall_after_s=3))
    assert time.monotonic() - t0 < 60 and s["elapsed_s"] < 60  # stopped at the stall, not at its end
    f = s["faults"][0]
    assert s["status"] == "failed" and f["kind"] == "stalled", s
    assert "2 requests in flight" in f["message"] and "computed nothing for" in f["message"]
    assert f["counters"]["generation_tokens"] == 5.0 and f["quiet_s"] >= 3 and f["stall_after_s"] == 3
    assert s["counts"]["ok"] == 0 and s["counts"]["cancelled"] == 2
    assert runs_read.load(Path(s["path"]))["status"] == "failed"


def test_an_engine_busy_with_others_is_not_a_stall(deck_config, tmp_path, results):
    """Its counters grow (work, just not ours yet): the liveness judge's "slow", not a fault."""
    cfg = add_instrument(deck_config, tmp_path, free_port(), "--answer", "1", "--moving", "--stall-chat")
    s = run_soak(cfg, SoakSpec("stuck", duration_s=6, concurrency=2, burst_every_s=0, sample_every_s=1,
                               stall_after_s=2))
    assert s["status"] == "ok" and s["faults"] == [], s["reason"]


def test_soak_refuses_a_port_held_by_something_else(deck_config, results):
    port = deck_config.models["smollm2"].port
    with socket.socket() as srv:
        srv.bind(("127.0.0.1", port))
        srv.listen()
        with pytest.raises(RefusedError) as e:
            run_soak(deck_config, SoakSpec("smollm2", duration_s=5))
    assert f"port {port} is held by pid {os.getpid()}" in e.value.message and "not smollm2's engine" in e.value.message
    assert not results.exists() or not any(results.rglob("summary.json"))  # nothing started, no run folder


def test_disk_full_during_a_soak_is_a_clear_error_and_not_a_result(deck_config, tmp_path, results):
    cfg = add_instrument(deck_config, tmp_path, free_port(), "--answer", "100000")

    def fill_disk():  # from now on every append to requests.jsonl gets ENOSPC from the kernel
        f = wait_for(lambda: next(results.rglob("requests.jsonl"), None), 30, step=0.05, what="requests.jsonl")
        tmp = f.with_name("requests.jsonl.new")
        tmp.symlink_to("/dev/full")
        os.replace(tmp, f)

    t = threading.Thread(target=fill_disk)
    t.start()
    with pytest.raises(RunError) as e:
        run_soak(cfg, SoakSpec("stuck", duration_s=30, concurrency=2, burst_every_s=0, sample_every_s=1))
    t.join()
    assert "requests.jsonl" in e.value.message and "No space left on device" in e.value.message
    folder = next(results.rglob("summary.json")).parent
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["status"] == "failed" and "No space left" in summary["reason"]
    (folder / "requests.jsonl").unlink()  # space freed (reading /dev/full would never end)
    assert runs_read.load(folder)["label"].startswith("FAILED")


def test_engine_sigkilled_during_a_soak(deck_config, results):
    """The run keeps every finished request and is marked failed with the cause; the loop relaunches."""
    cfg = with_host(deck_config, relaunch_spacing_s=0.5, liveness_interval_s=60.0)
    rec = Deck(cfg).start("smollm2").record

    def kill_later():
        folder = wait_for(lambda: next(results.rglob("requests.jsonl"), None), 120, step=0.05, what="requests")
        wait_for(lambda: folder.read_text().count("\n") >= 3, 120, step=0.05, what="3 requests")
        os.kill(rec.engine_pid, signal.SIGKILL)

    t = threading.Thread(target=kill_later)
    t.start()
    t0 = time.monotonic()
    s = run_soak(cfg, SoakSpec("smollm2", duration_s=400, concurrency=2, burst_every_s=0, sample_every_s=30,
                               max_tokens=16))
    t.join()
    assert time.monotonic() - t0 < 300 and s["elapsed_s"] < 300  # stopped at the first fault, not at its end
    assert s["status"] == "failed" and s["faults"][0]["kind"] == "engine-died"
    assert "SIGKILL" in s["faults"][0]["detail"] and s["faults"][0]["cause"]
    folder = Path(s["path"])
    lines = [json.loads(x) for x in (folder / "requests.jsonl").read_text().splitlines()]
    assert sum(x["status"] == "ok" for x in lines) >= 3 and len(lines) == s["counts"]["total"]
    assert runs_read.load(folder)["status"] == "failed"
    Watcher(cfg, interval_s=0.1).tick()
    assert kinds("smollm2")[-3:] == ["crashed", "relaunch", "relaunched"]
