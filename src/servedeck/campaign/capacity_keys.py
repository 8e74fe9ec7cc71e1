"""A campaign file's capacity keys, checked where the file is read (campaign/file.py calls these):
a `kind = "capacity"` workload's find/slo/max/resolution/start, and the [slo.NAME] tables it names."""

from __future__ import annotations

from typing import Any

from servedeck.errors import UsageError
from servedeck.slo import slo_of_table

CAPACITY_KEYS = ("find", "slo", "max", "resolution", "start")


def check_workload(w: Any) -> None:
    """One [[workloads]] entry's capacity keys (a ValueError names what is wrong; pydantic adds the path)."""
    if w.kind != "capacity":
        given = [k for k in CAPACITY_KEYS if getattr(w, k) not in (None, [])]
        if given:
            raise ValueError(f"{', '.join(given)}: only a kind = \"capacity\" workload takes "
                             f"{', '.join(CAPACITY_KEYS)}")
        return
    if w.find is None:
        raise ValueError('a capacity workload says what to find: find = "max-concurrency" or "max-rate"')
    if not w.slo:
        raise ValueError('a capacity workload names its SLOs: slo = ["interactive"] with an [slo.interactive] table')
    if w.concurrency or w.rate:
        raise ValueError("a capacity workload chooses its loads itself: drop concurrency/rate (bound them with max)")
    if w.resolution is not None:
        from servedeck.campaign.search import parse_resolution

        try:
            parse_resolution(w.resolution)
        except UsageError as e:
            raise ValueError(e.message.replace("--resolution", "resolution")) from None


def campaign_problems(cf: Any) -> list[str]:
    """Across the file: each [slo.NAME] parses, and every SLO a capacity workload names exists."""
    problems = []
    for name, table in cf.slo.items():
        try:
            slo_of_table(name, table)
        except UsageError as e:
            problems.append(e.message)
    for i, w in enumerate(cf.workloads):
        for name in w.slo:
            if name not in cf.slo:
                known = ", ".join(cf.slo) or "none"
                problems.append(f"workloads[{i}].slo: no [slo.{name}] table (tables: {known})")
    return problems
