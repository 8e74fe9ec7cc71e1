"""Process groups a test started, looked at and stopped only while their number is still theirs.

A test that kills a shim or reaps a leader and later asks `group_members(pgid)` may be asking about a
number the kernel has since given to another process: on a busy machine pid_max's 32,768 numbers go by in
minutes, and the next holder may be another xdist worker's shim leading a group of its own. Stopping that
group stops a stranger's engine (a fresh-clone CI lost both workers' shared servers this way). A group with
a recorded leader start time goes through servedeck.supervisor.process (`members_if_ours`, `stop_group`'s
`leader_create_time`); `NotedGroups` is for the groups a test only knows by number."""

from __future__ import annotations

import time

from servedeck.supervisor.process import members_if_ours, start_time_of, stop_group


class NotedGroups:
    """The process groups a test started or found, each noted with its leader's start time (or, when the
    leader is already gone, the time it was noted: a later holder of the number started after that)."""

    def __init__(self) -> None:
        self.noted: list[tuple[int, float | None, float]] = []

    def append(self, pgid: int) -> None:
        self.noted.append((pgid, start_time_of(pgid), time.time()))

    def extend(self, pgids) -> None:
        for pgid in pgids:
            self.append(pgid)

    def __getitem__(self, i: int) -> int:
        return self.noted[i][0]

    def members(self, i: int) -> list[int]:
        pgid, leader_born, at = self.noted[i]
        if leader_born is None:
            now = start_time_of(pgid)
            if now is not None and now > at:  # the number was given to a process started after the note
                return []
        return members_if_ours(pgid, leader_born)

    def stop_all(self, grace_s: float) -> None:
        for i, (pgid, leader_born, _at) in enumerate(self.noted):
            if self.members(i):
                stop_group(pgid, grace_s, leader_create_time=leader_born)
