"""Pure pieces of the watch loop and soak, tested without engines."""

from __future__ import annotations

import json
import sys
import threading
from types import SimpleNamespace

import pytest

from servedeck.errors import BusyError
from servedeck.soak import Conversation, foreign_gpu_processes
from servedeck.soak import windows as W
from servedeck.watch import Notices, Redactor, judge, parse_prometheus, read_notices, watch_lock


def test_prometheus_sums_label_sets():
    text = ('# HELP x\nvllm:generation_tokens_total{model_name="a"} 10\n'
            'vllm:generation_tokens_total{model_name="b"} 5\nvllm:num_requests_running 2.0\n')
    assert parse_prometheus(text) == {"vllm:generation_tokens_total": 15.0, "vllm:num_requests_running": 2.0}


def test_judge_tells_slow_from_stalled():
    before = {"prompt_tokens": 100.0, "generation_tokens": 50.0, "running": 4.0, "waiting": 2.0}
    moved = dict(before, generation_tokens=90.0)
    assert judge(True, "HTTP 200", True, 0.1, before, before)[0] == "live"
    v, detail, delta = judge(True, "HTTP 200", False, 30, before, moved)
    assert v == "slow" and delta == {"generation_tokens": 40.0} and "+40" in detail
    v, detail, _ = judge(True, "HTTP 200", False, 30, before, before)
    assert v == "stalled" and "did not move" in detail and "running=4" in detail
    assert judge(True, "HTTP 200", False, 30, None, None)[0] == "stalled"  # no metrics: cannot call it slow
    assert judge(False, "ConnectError", False, 1, None, None)[0] == "unhealthy"


def test_notices_redact_secrets_and_call_hook_without_shell(tmp_path, monkeypatch):
    monkeypatch.setenv("MY_API_KEY", "sk-verysecretvalue")
    out = tmp_path / "hook.out"
    # argv, no shell: the notice arrives on stdin and in $SERVEDECK_NOTICE
    hook = [sys.executable, "-c",
            f"import os,sys; open({str(out)!r},'w').write(sys.stdin.read()+'\\n'+os.environ['SERVEDECK_NOTICE'])"]
    n = Notices(hook, Redactor.from_config(None))
    n.emit("crashed", "m", "engine printed sk-verysecretvalue and died", log_tail=["token=sk-verysecretvalue"])
    stdin, env = out.read_text().split("\n", 1)
    assert json.loads(stdin)["kind"] == "crashed" and json.loads(env)["model"] == "m"
    text = (tmp_path / "home" / "notices.jsonl").read_text() + out.read_text()
    assert "sk-verysecretvalue" not in text and "<redacted>" in text


def test_hook_timeout_and_failure_are_notices_not_crashes():
    n = Notices([sys.executable, "-c", "import time; time.sleep(30)"], hook_timeout_s=0.5)
    n.emit("relaunch", "m", "relaunch 1/3")
    n2 = Notices(["/nonexistent/hook"])
    n2.emit("relaunch", "m", "relaunch 2/3")
    rows = read_notices()
    assert [r["kind"] for r in rows] == ["relaunch", "hook-failed", "relaunch", "hook-failed"]
    assert "did not finish in 0.5 s" in rows[1]["message"] and "could not run" in rows[3]["message"]


def test_one_watch_loop_per_state_dir():
    with watch_lock():
        got: list[BaseException] = []
        t = threading.Thread(target=lambda: _try_lock(got))
        t.start()
        t.join()
        assert isinstance(got[0], BusyError) and "already watches" in got[0].message


def _try_lock(got):
    try:
        with watch_lock():
            got.append(AssertionError("second lock acquired"))
    except BusyError as e:
        got.append(e)


def test_conversation_keeps_exactly_what_the_server_sent():
    c = Conversation("c", seed=1, max_turns=3)
    c.ask()
    kept = c.absorb({"choices": [{"message": {"role": "assistant", "content": "A", "tool_calls": None}}]})
    assert kept == {"role": "assistant", "content": "A"}  # no reasoning_content invented, nulls not echoed
    c.ask()
    kept = c.absorb({"choices": [{"message": {"role": "assistant", "content": "B", "reasoning_content": "r"}}]})
    assert kept["reasoning_content"] == "r"  # what the server did send is kept
    msgs = c.ask()
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
    assert "reasoning_content" not in msgs[1] and msgs[3]["reasoning_content"] == "r"
    assert c.turn == 3 and c.done


def test_windows_and_longest_clean_window():
    recs = [{"status": "ok", "t_send": t, "t_end": t + 0.5, "point": 0} for t in range(0, 30)]
    recs.append({"status": "error", "t_send": 12.0, "t_end": 12.2, "error": "boom", "point": 1})
    ws = W.windows(recs, 10.0, 30.0)
    assert [w["requests"] for w in ws] == [10, 11, 10] and ws[1]["errors"] == 1
    assert ws[0]["e2e_s"]["p50"] == pytest.approx(0.5)
    c = W.counts(recs)
    assert c["ok"] == 30 and c["error"] == 1 and c["errors"] == {"boom": 1}
    assert W.longest_clean([12.2], 30.0) == {"seconds": 17.8, "from_s": 12.2, "to_s": 30.0}


def test_gpu_busy_means_processes_not_in_the_models_group():
    gpu = lambda i, *pids: SimpleNamespace(index=i, processes=[SimpleNamespace(pid=p) for p in pids])  # noqa: E731
    inv = SimpleNamespace(available=True, gpus=[gpu(0, 10, 11), gpu(1, 99)])
    assert foreign_gpu_processes(inv, [0], {10, 11}) == []
    assert foreign_gpu_processes(inv, [], {10, 11}) == [(1, 99)]
    assert foreign_gpu_processes(SimpleNamespace(available=False), [0], set()) == []


def test_a_watcher_holding_the_watch_lock_runs_under_it_while_others_are_refused():
    from servedeck.watch import Watcher

    w = Watcher(None, interval_s=0.05)
    got: list[BaseException] = []
    with w.locked():
        t = threading.Thread(target=lambda: _try_lock(got))
        t.start()
        t.join()
        w.run(max_ticks=1)  # the lock it was handed: not taken again, so not refused by itself
    assert isinstance(got[0], BusyError)


def test_a_watcher_that_ran_under_a_handed_lock_started_and_stopped():
    from servedeck.watch import Watcher

    w = Watcher(None, interval_s=0.05)
    with w.locked():
        w.run(max_ticks=1)
    assert [n["kind"] for n in read_notices()] == ["started", "stopped"]
