"""What a campaign tells its user while it runs. The CLI draws it with rich; tests stay quiet."""

from __future__ import annotations

from typing import Any, Optional, Protocol

from servedeck.gates.niah import ProbeResult
from servedeck.loadgen import Progress


class Reporter(Protocol):
    def stage(self, text: str) -> None: ...
    def gate_start(self, probes: int, context: int) -> None: ...
    def gate_probe(self, result: ProbeResult) -> None: ...
    def point_start(self, label: str, total: Optional[int], duration_s: Optional[float]) -> None: ...
    def progress(self, label: str, p: Progress) -> None: ...
    def point_done(self, label: str, point: dict[str, Any]) -> None: ...


class QuietReporter:
    def stage(self, text: str) -> None:
        pass

    def gate_start(self, probes: int, context: int) -> None:
        pass

    def gate_probe(self, result: ProbeResult) -> None:
        pass

    def point_start(self, label: str, total: Optional[int], duration_s: Optional[float]) -> None:
        pass

    def progress(self, label: str, p: Progress) -> None:
        pass

    def point_done(self, label: str, point: dict[str, Any]) -> None:
        pass
