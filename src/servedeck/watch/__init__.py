"""The watch loop (reconcile, relaunch with notices, liveness/stall detection) and its notices."""

from servedeck.watch.liveness import ProbeResult, judge, parse_prometheus, probe
from servedeck.watch.loop import Watcher, watch_lock
from servedeck.watch.notices import Notices, Redactor, read_notices

__all__ = ["Notices", "ProbeResult", "Redactor", "Watcher", "judge", "parse_prometheus", "probe",
           "read_notices", "watch_lock"]
