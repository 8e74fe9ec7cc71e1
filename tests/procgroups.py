"""Process groups a test started, looked at and stopped only while their number is still theirs.

A test that kills a shim or reaps a leader and later asks `group_members(pgid)` may be asking about a
number the kernel has since given to another process: on a busy machine pid_max's 32,768 numbers go by in
minutes, and the next holder may be another xdist worker's shim leading a group of its own. Stopping that
group stops a stranger's engine (a fresh-clone CI lost both workers' shared servers this way). Each helper
here goes by the leader's start time as well as its number (servedeck.supervisor.process.group_is_ours)."""

from __future__ import annotations

import time

import psutil

from servedeck.supervisor.process import group_is_ours, group_members, stop_group


def born(pid: int) -> float | None:
    """When process `pid` started; None when it is gone."""
    try:
        return psutil.Process(pid).create_time()
    except psutil.NoSuchProcess:
        return None


def members_of(pgid: int, leader_born: float | None) -> list[int]:
    """The group's live members while it is still the group its leader (started at `leader_born`) led."""
    return group_members(pgid) if group_is_ours(pgid, leader_born) else []


def stop_if_ours(pgid: int, leader_born: float | None, grace_s: float) -> None:
    if members_of(pgid, leader_born):
        stop_group(pgid, grace_s, leader_create_time=leader_born)


class NotedGroups:
    """The process groups a test started or found, each noted with its leader's start time (or, when the
    leader is already gone, the time it was noted: a later holder of the number started after that)."""

    def __init__(self) -> None:
        self.noted: list[tuple[int, float | None, float]] = []

    def append(self, pgid: int) -> None:
        self.noted.append((pgid, born(pgid), time.time()))

    def extend(self, pgids) -> None:
        for pgid in pgids:
            self.append(pgid)

    def __getitem__(self, i: int) -> int:
        return self.noted[i][0]

    def members(self, i: int) -> list[int]:
        pgid, leader_born, at = self.noted[i]
        if leader_born is None:
            now = born(pgid)
            if now is not None and now > at:  # the number was given to a process started after the note
                return []
        return members_of(pgid, leader_born)

    def stop_all(self, grace_s: float) -> None:
        for i, (pgid, leader_born, _at) in enumerate(self.noted):
            if self.members(i):
                stop_group(pgid, grace_s, leader_create_time=leader_born)
