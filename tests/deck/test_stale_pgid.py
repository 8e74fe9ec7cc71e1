"""A record's process-group number is only its engine's while the group's leader is the shim it recorded.

A fresh-clone CI run lost both xdist workers' shared servers within a minute: on a 2-core box, one run
spawns enough processes to go round pid_max (32,768) in minutes, so a number a test's record kept for an
engine that had since ended could name another worker's new shim, and stopping "that record's group"
stopped a stranger's engine. These start real process groups of their own (a leader and a child) and ask
`stop_group` to stop one by a start time that is not its leader's."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil

from servedeck.supervisor.process import group_is_ours, group_members, stop_group

LEADER_WITH_CHILD = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; "
                     "time.sleep(60)']); time.sleep(60)")


def _group() -> tuple[subprocess.Popen, float]:
    leader = subprocess.Popen([sys.executable, "-c", LEADER_WITH_CHILD], start_new_session=True)
    born = psutil.Process(leader.pid).create_time()
    deadline = time.monotonic() + 20
    while len(group_members(leader.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(group_members(leader.pid)) == 2
    return leader, born


def test_a_group_whose_leader_started_at_another_time_is_not_signalled():
    leader, born = _group()
    try:
        assert not group_is_ours(leader.pid, born - 30.0)  # the record's shim started 30 s before this one
        result = stop_group(leader.pid, 1.0, leader_create_time=born - 30.0)
        assert result["already_gone"] and not result["killed"]
        assert len(group_members(leader.pid)) == 2 and leader.poll() is None  # untouched
        assert group_is_ours(leader.pid, born)
        result = stop_group(leader.pid, 5.0, leader_create_time=born)  # its own start time: stopped
        assert not result["already_gone"] and not group_members(leader.pid)
    finally:
        if leader.poll() is None and group_members(leader.pid):
            stop_group(leader.pid, 5.0, leader_create_time=born)
        leader.wait(10)


def test_members_left_by_a_leader_that_is_gone_are_still_its_group():
    leader, born = _group()
    try:
        leader.kill()
        leader.wait(10)  # reaped: its number stays taken while its child has it as the group id
        assert psutil.pid_exists(leader.pid) is False or psutil.Process(leader.pid).create_time() != born
        assert len(group_members(leader.pid)) == 1 and group_is_ours(leader.pid, born)
        result = stop_group(leader.pid, 5.0, leader_create_time=born)
        assert not result["already_gone"] and not group_members(leader.pid)
    finally:
        stop_group(leader.pid, 5.0, leader_create_time=born)  # signals nothing once the group is gone
