"""The supervisor shim leaves nothing of its group behind when the process it supervises ends.

On vLLM (CPU here; CUDA on the H200) a SIGKILLed EngineCore makes the API server exit 0 while helpers of
its group live on; the shim then exited beside them, and the deck read "its supervisor died and left its
engine running" where the engine had in fact ended. What the shim supervises here is a process that
leaves a child of its own running and exits, the shape that matters: the shim must end that child before
it writes exit.json, and say which it ended."""

from __future__ import annotations

import json
import subprocess
import sys

from servedeck.supervisor.process import members_if_ours, start_time_of, stop_group

LEAVES_A_CHILD = ("import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
                  "sys.exit(0)")


def test_what_the_supervised_process_leaves_in_the_group_ends_before_exit_json(tmp_path):
    shim = subprocess.Popen([sys.executable, "-m", "servedeck.supervisor.shim", str(tmp_path), "--",
                             sys.executable, "-c", LEAVES_A_CHILD], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    shim_born = start_time_of(shim.pid)  # once reaped, its number may be given to another process's group
    try:
        assert shim.wait(timeout=60) == 0
        exit_info = json.loads((tmp_path / "exit.json").read_text())
        assert exit_info["returncode"] == 0
        assert len(exit_info["stragglers"]) == 1  # the sleeping child, named in the record
        assert not members_if_ours(shim.pid, shim_born), "the shim exited with its group still running"
    finally:
        stop_group(shim.pid, 5, leader_create_time=shim_born)


def test_a_process_that_leaves_nothing_records_no_stragglers(tmp_path):
    shim = subprocess.run([sys.executable, "-m", "servedeck.supervisor.shim", str(tmp_path), "--",
                           sys.executable, "-c", "pass"], start_new_session=True, timeout=60)
    assert shim.returncode == 0
    assert "stragglers" not in json.loads((tmp_path / "exit.json").read_text())


def test_the_deck_names_stragglers_of_an_ended_engine_as_such(tmp_path, servedeck_home):
    """A group whose leader exited after writing its exit record (a shim before this fix, or stragglers that
    outlived the shim's SIGKILL) is the engine's leftovers, not an engine whose supervisor was killed."""
    import psutil

    from servedeck.deck import Deck
    from servedeck.deck import state as S
    from servedeck.deck.records import LaunchState, LiveRecord

    leader = subprocess.Popen([sys.executable, "-c", LEAVES_A_CHILD], start_new_session=True)
    created = psutil.Process(leader.pid).create_time()
    d = tmp_path / "launch"
    d.mkdir()
    (d / "engine.log").write_text("")
    (d / "launch.json").write_text("{}")
    try:
        assert leader.wait(timeout=30) == 0
        (d / "exit.json").write_text(json.dumps({"returncode": 0, "signal": None, "engine_pid": leader.pid}))
        S.write_live(LiveRecord(model="m", engine="llamacpp", build="b", slot="main", port=1, launch_dir=str(d),
                                pid=leader.pid, pgid=leader.pid, create_time=created, owner_pid=1,
                                state=LaunchState.READY, stop_timeout_s=5))
        with Deck(None).locked("test") as ops:
            [(_, end)] = ops.settle_dead().values()
        assert "its engine ended (exited with code 0) and left 1 process(es) of its group" in end.detail
        assert "supervisor" not in end.detail
        assert not members_if_ours(leader.pid, created)
    finally:
        stop_group(leader.pid, 5, leader_create_time=created)
