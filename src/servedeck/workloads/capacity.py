"""`servedeck bench MODEL --find max-concurrency|max-rate --slo ...` (a campaign file's `kind = "capacity"`): the
most load the server carries within an SLO, found by the search in search.py, every step an ordinary measured
point of one run folder, of the chat or long-prompt kind.

    run folder/
        requests.jsonl, summary.json   every measured point, as `servedeck bench` writes them
        search.json                    every step (load, figures against each threshold, its energy where
                                       the GPUs were sampled, why up or down),
                                       the boundary, the binding constraint, cliff or smooth, and where a
                                       `stop_below` floor ended it, `below_floor`; rewritten after each
                                       step, so an interrupted search keeps what it found

Each step is `bench.run_point` with fresh prompts (a new point index, a new nonce), judged from the
records it wrote (servedeck.slo.judge). An open-loop point the server cannot keep up with is ended
early as failed (overload.py says when).
"""

from __future__ import annotations

import asyncio
import time
from enum import Enum
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar, Literal, Optional

from servedeck.engines import get_engine
from servedeck.errors import UsageError
from servedeck.fsio import atomic_write_json, read_jsonl
from servedeck.loadgen import ClosedLoop, OpenLoop, Progress, RequestRecord
from servedeck.report.capacity import run_section
from servedeck.runs.folder import RunFolder
from servedeck.slo import SloSpec, judge
from servedeck.workloads import chat, long_prompt
from servedeck.workloads.overload import OverloadJudge
from servedeck.workloads.points import BenchSpec, from_entry as points_from_entry, from_options as points_from_options
from servedeck.workloads.points import fitted as points_fitted, run_point, shape_label
from servedeck.workloads.reporter import Reporter
from servedeck.workloads.search import Resolution, Search, SearchOptions, parse_resolution
from servedeck.workloads.shape import Entry, Key, Kind, Option
from servedeck.workloads.target import Target, layout_facts

Find = Literal["max-concurrency", "max-rate"]
FINDS = ("max-concurrency", "max-rate")


class FindChoice(str, Enum):
    """`servedeck bench --find`: what the search looks for."""

    max_concurrency = "max-concurrency"  # closed loop: streams at once
    max_rate = "max-rate"  # open loop: requests per second
SEARCH_FILE = "search.json"
SEARCH_SCHEMA = 1
DEFAULT_MAX = {"max-concurrency": 512.0, "max-rate": 256.0}


@dataclass(frozen=True)
class CapacitySpec:
    """What to find, against which SLO, and how each step is measured (`bench`: its shapes are unused)."""

    kind: ClassVar[str] = "capacity"
    find: Find
    slo: SloSpec
    bench: BenchSpec
    max_load: Optional[float] = None  # --max; default DEFAULT_MAX
    resolution: Resolution = field(default_factory=lambda: Resolution(0.1))
    start: Optional[float] = None  # the smallest load (default 1)
    arrivals: Literal["poisson", "constant"] = "poisson"
    max_steps: int = 30
    cap: Optional[float] = None  # once fitted to the server: the highest load the search may try
    cap_reason: Optional[str] = None  # and what set it
    stop_below: Optional[float] = None  # good req/s per GPU (per launch on CPU) it must be able to carry (search.py)

    @property
    def kind_of_steps(self) -> str:
        return self.bench.workload

    @property
    def prompt_seed(self) -> Optional[int]:
        return self.bench.seed

    @property
    def label(self) -> str:
        return f"{self.find} under {self.slo.name}"

    def check(self) -> None:
        if self.find not in FINDS:
            raise UsageError(f"--find: {self.find!r} is not one of {', '.join(FINDS)}",
                             hint="--find max-concurrency (closed loop) or --find max-rate (open loop)")
        if self.max_load is not None and not self.max_load > 0:
            raise UsageError(f"--max must be above 0, got {self.max_load:g}", hint="like --max 512")
        start = self.start or 1.0
        if self.max_load is not None and start > self.max_load:
            raise UsageError(f"the smallest load {start:g} is above --max {self.max_load:g}", hint="raise --max")
        if self.bench.workload == "decode":
            raise UsageError("--find needs the chat or long-prompt workload",
                             hint="decode's one fixed prompt measures decoding only, not a user's latency")

    def search_json(self) -> dict[str, Any]:
        """What search.json says of the search."""
        return {"find": self.find, "slo": self.slo.to_json(), "max": self.max_load,
                "resolution": self.resolution.text, "start": self.start or 1.0, "arrivals": self.arrivals,
                "max_steps": self.max_steps, **({"stop_below": self.stop_below} if self.stop_below is not None else {})}

    def to_json(self) -> dict[str, Any]:
        """The run's workload entry: its steps' load points, the search beside them (its cap once fitted)."""
        cap = {"cap": self.cap, "cap_reason": self.cap_reason} if self.cap is not None else {}
        return {**self.bench.to_json(), "points": [], "capacity": {**self.search_json(), **cap}}


def spec_from_options(find: str, slo_text: Optional[str], bench: BenchSpec, *, max_load: Optional[float] = None,
                      resolution: Optional[str] = None, start: Optional[float] = None,
                      arrivals: str = "poisson") -> CapacitySpec:
    """`servedeck bench --find ... --slo ... --max ... --resolution ...` → a checked CapacitySpec."""
    from servedeck.slo import parse_slo

    if not slo_text:
        raise UsageError(f"--find {find} needs --slo: the latency target the capacity is measured against",
                         hint='like --slo "ttft_p95<=2s,tpot_p95<=50ms,error_rate<=1%"')
    spec = CapacitySpec(find=find, slo=parse_slo(slo_text, name="slo"), bench=bench,  # type: ignore[arg-type]
                        max_load=max_load, resolution=parse_resolution(resolution or "10%"), start=start,
                        arrivals=arrivals)  # type: ignore[arg-type]
    spec.check()
    return spec


def caps(spec: CapacitySpec, target: Target, ctx: int) -> tuple[float, str]:
    """The highest load the search may try, and what set it: --max, the engine's slots, the KV cache."""
    asked = spec.max_load if spec.max_load is not None else DEFAULT_MAX[spec.find]
    found = [(asked, f"--max {asked:g}" if spec.max_load is not None else f"the default --max {asked:g}")]
    if spec.find == "max-concurrency":
        n = len(target.replicas)
        model, boot = target.cfg.models[target.name], target.record.boot or {}
        slots = get_engine(target.engine).concurrency_cap(model, boot)
        if slots:
            found.append((float(slots * n), f"the engine's {slots * n} slots" + (f" ({n} replicas)" if n > 1 else "")))
        kv = boot.get("kv_tokens")
        per_request = spec.bench.prompt_size + spec.bench.output_tokens
        if kv and per_request:
            fits = max(1, int(kv) // per_request) * n
            found.append((float(fits), f"the KV cache ({int(kv)} tokens: {fits} requests of {per_request} at once)"))
    return min(found, key=lambda f: f[0])


class _Tap:
    """The run folder as run_point sees it, telling the overload judge of every measured request."""

    def __init__(self, folder: RunFolder, on_request: Any):
        self._folder, self._on_request = folder, on_request

    def request(self, record: dict[str, Any]) -> None:
        self._folder.request(record)
        self._on_request(record)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._folder, name)


class _Watching:
    """A reporter that also starts the point's clock for the overload judge."""

    def __init__(self, inner: Reporter):
        self.inner = inner
        self.started: Optional[float] = None

    def point_start(self, label: str, total: Optional[int], duration_s: Optional[float]) -> None:
        self.started = time.monotonic()
        self.inner.point_start(label, total, duration_s)

    def progress(self, label: str, p: Progress) -> None:
        self.inner.progress(label, p)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def measure(index: int, load: float, cspec: CapacitySpec, spec: BenchSpec, target: Target,
                  folder: RunFolder, reporter: Reporter) -> dict[str, Any]:
    """One step: an ordinary point at `load` (fresh prompts), ended early when an open loop overloads, judged."""
    shape = ClosedLoop(int(load)) if cspec.find == "max-concurrency" else \
        OpenLoop(load, cspec.arrivals, seed=index)
    watching = _Watching(reporter)
    overload: Optional[OverloadJudge] = OverloadJudge(load) if isinstance(shape, OpenLoop) else None
    reason: list[str] = []

    def on_request(line: dict[str, Any]) -> None:
        if overload is None or line.get("kind") != "measured" or watching.started is None:
            return
        ttft = (line["t_first_token"] - line["t_send"]) if line.get("status") == "ok" and \
            line.get("t_first_token") is not None and line.get("t_send") is not None else None
        overload.saw(time.monotonic() - watching.started, ttft)

    task = asyncio.ensure_future(run_point(index, shape, spec, target, _Tap(folder, on_request),  # type: ignore[arg-type]
                                           watching))
    try:
        while overload is not None and not task.done():
            await asyncio.wait({task}, timeout=0.5)
            if watching.started is not None and not task.done():
                why = overload.check(time.monotonic() - watching.started)
                if why:
                    reason.append(why)
                    reporter.stage(f"{shape_label(shape)}: {why}")
                    task.cancel()
                    break
        await task
    except asyncio.CancelledError:
        me = asyncio.current_task()
        if not reason or (me is not None and me.cancelling()):
            raise  # Ctrl-C: run_point recorded the point as interrupted
        _mark_failed(folder, index, reason[0])
    records = [RequestRecord.from_json({k: v for k, v in ln.items() if k != "point"})
               for ln in read_jsonl(folder.path / "requests.jsonl") if ln.get("point") == index]
    point = next(p for p in folder.summary["points"] if p["index"] == index)
    figures = point.get("figures") or {}
    judged = judge(records, cspec.slo, client=figures.get("client"), output_tok_s=figures.get("output_tok_s"),
                   closed_loop=isinstance(shape, ClosedLoop))
    judged.update(point=index, label=point["label"], energy=step_energy(figures))
    if reason:
        judged.update(passed=False, overloaded=reason[0], missed=judged["missed"] or ["overloaded"])
    return judged


def step_energy(figures: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The step's energy from its telemetry figures (telemetry/figures.py), or None where its GPUs were
    not sampled: J per output token and per request, and where the joules came from."""
    gpu = (figures.get("telemetry") or {}).get("gpu") or {}
    if gpu.get("energy_j") is None:
        return None
    return {k: gpu.get(k) for k in ("energy_j", "energy_source", "j_per_output_token", "j_per_request",
                                    "mean_power_w", "max_share_of_limit")}


def _floor(cspec: CapacitySpec, target: Target) -> Optional[float]:
    """stop_below (per GPU, as reports rank) as good req/s of the whole launch, which the search measures."""
    if cspec.stop_below is None:
        return None
    gpus = target.extra.get("gpus_used")
    if gpus is None:
        gpus = layout_facts([target.cfg.models[t.name] for t in target.replicas])["gpus_used"]
    return cspec.stop_below * (gpus or 1)


def _mark_failed(folder: RunFolder, index: int, reason: str) -> None:
    points = [dict(p, status="failed", reason=reason) if p.get("index") == index else p
              for p in folder.summary.get("points", [])]
    folder.update(points=points)


def _write_search(folder: RunFolder, cspec: CapacitySpec, search: Search) -> dict[str, Any]:
    result = search.result()
    doc = {"schema": SEARCH_SCHEMA, **cspec.search_json(), **result}
    atomic_write_json(folder.path / SEARCH_FILE, doc)
    return doc


def headline(doc: dict[str, Any]) -> dict[str, Any]:
    """What summary.json keeps of search.json: the answer without the steps."""
    at = next((s["judged"] for s in reversed(doc.get("steps") or [])
               if s["load"] == doc.get("capacity") and s["passed"]), {})
    return {"find": doc["find"], "slo": doc["slo"]["name"], "slo_text": doc["slo"]["text"],
            "verdict": doc["verdict"], "capacity": doc["capacity"], "boundary": doc["boundary"],
            "binding": doc["binding"], "shape": (doc.get("shape") or {}).get("kind"), "cap": doc["cap"],
            "notes": doc["notes"], "steps": len(doc.get("steps") or []),
            "requests": sum(s["judged"].get("measured", 0) for s in doc.get("steps") or []),
            "goodput_request_s": at.get("goodput_request_s"), "output_tok_s": at.get("output_tok_s"),
            "j_per_output_token": (at.get("energy") or {}).get("j_per_output_token"),
            "energy_source": (at.get("energy") or {}).get("energy_source"),
            "point": at.get("point"), "client_procs": doc.get("client_procs"), "file": SEARCH_FILE,
            **({"below_floor": doc["below_floor"]} if doc.get("below_floor") else {})}


def fitted(cspec: CapacitySpec, target: Target, ctx: int) -> CapacitySpec:
    """Its steps' spec fitted as a load point's (a long prompt sized to the context), and the highest load it may
    try, with what set it, recorded in its workload entry."""
    cspec.check()
    spec = cspec.bench
    if not spec.shapes:  # the search picks each step's load; the spec's own list only has to pass its check
        spec = replace(spec, shapes=(ClosedLoop(1),))
    spec = points_fitted(spec, target, ctx)
    cspec = replace(cspec, bench=spec)
    cap, cap_reason = caps(cspec, target, ctx)
    return replace(cspec, cap=cap, cap_reason=cap_reason)


async def run(cspec: CapacitySpec, target: Target, ctx: int, folder: RunFolder, reporter: Reporter) -> Optional[str]:
    assert cspec.cap is not None and cspec.cap_reason is not None
    spec, cap = cspec.bench, cspec.cap
    start = min(cspec.start or 1.0, cap)
    search = Search(SearchOptions(start=start, cap=cap, cap_reason=cspec.cap_reason, resolution=cspec.resolution,
                                  integer=cspec.find == "max-concurrency", max_steps=cspec.max_steps,
                                  procs=spec.client_procs, floor=_floor(cspec, target)))
    index = 0
    while (load := search.next_load()) is not None:
        reporter.stage(f"capacity step {index + 1}: {search.why_next}")
        judged = await measure(index, load, cspec, replace(spec, client_procs=search.procs), target, folder, reporter)
        search.tell(load, judged)
        _write_search(folder, cspec, search)
        reporter.stage(f"{judged['label']}: {search.steps[-1].then}")
        index += 1
    doc = _write_search(folder, cspec, search)
    folder.update(capacity=headline(doc),
                  workload={**folder.summary["workload"], "points": [p["label"] for p in folder.summary["points"]]})
    return None


# --- the capacity search as a kind: options, keys, figures --------------------------------------------

KIND_NAME = "capacity"
BASES = {p.name: p for p in (chat.POINTS, long_prompt.POINTS)}  # what a search's steps may send
OPTIONS = (
    Option("find", ("--find",), Optional[FindChoice], None, "max-concurrency (closed loop) | max-rate (open loop): "
           "search for the most load within --slo; --workload says what each step sends (chat, long-prompt)"),
    Option("max_load", ("--max",), Optional[float], None, "--find: the highest load to try (default 512 streams, "
           "256 req/s; the engine's slots and KV cache also cap it)"),
    Option("resolution", ("--resolution",), Optional[str], None, "--find: how close the boundary must be, 10% "
           "(default) of the first failing load, or a step like 2"),
)
CAPACITY_KEYS = ("find", "slo", "max", "resolution", "start", "stop_below")
KEYS = (Key("find", Optional[Literal["max-concurrency", "max-rate"]]), Key("slo", list[str], []),
        Key("max", Optional[float]), Key("resolution", Optional[str]), Key("start", Optional[float]),
        Key("stop_below", Optional[dict[str, float]]))


def from_options(o: Any) -> CapacitySpec:
    """`servedeck bench [--workload chat|long-prompt] --find ... --slo ... --max ... --resolution ...`: everything
    checked before anything launches."""
    find = getattr(o.get("find"), "value", o.get("find"))
    if not find:
        raise UsageError("--workload capacity searches for the most load within an SLO: give --find",
                         hint="--find max-concurrency (closed loop) or --find max-rate (open loop), with --slo")
    if o.get("concurrency") or o.get("rate"):
        raise UsageError("--find chooses the loads itself: drop --concurrency/--rate",
                         hint="bound the search with --max (and its step with --resolution)")
    base = getattr(o.get("workload"), "value", o.get("workload")) or KIND_NAME
    steps = chat.POINTS if base == KIND_NAME else BASES.get(base)
    if steps is None:
        raise UsageError("--find needs the chat or long-prompt workload",
                         hint="decode's one fixed prompt measures decoding only, not a user's latency"
                         if base == "decode" else f"each step of a search is a load point; --workload {base} sends "
                                                  "no load points: give --workload chat or long-prompt")
    bench = points_from_options(steps, o, slo=False)
    return spec_from_options(find, o.get("slo"), bench, max_load=o.get("max_load"), resolution=o.get("resolution"),
                             arrivals=getattr(o.get("arrivals"), "value", o.get("arrivals")) or "poisson")


def check_entry(w: Any) -> None:
    """One [[workloads]] entry's capacity keys (a ValueError names what is wrong; pydantic adds the path)."""
    if w.find is None:
        raise ValueError('a capacity workload says what to find: find = "max-concurrency" or "max-rate"')
    if not w.slo:
        raise ValueError('a capacity workload names its SLOs: slo = ["interactive"] with an [slo.interactive] table')
    if w.concurrency or w.rate:
        raise ValueError("a capacity workload chooses its loads itself: drop concurrency/rate (bound them with max)")
    if w.resolution is not None:
        try:
            parse_resolution(w.resolution)
        except UsageError as e:
            raise ValueError(e.message.replace("--resolution", "resolution")) from None
    for name, floor in (w.stop_below or {}).items():
        if name not in w.slo:
            raise ValueError(f"stop_below.{name}: not an SLO this workload searches under (slo = {w.slo}): "
                             f'key it by one of them, like stop_below = {{ {(w.slo or ["interactive"])[0]} = 2.5 }}')
        if not floor > 0:
            raise ValueError(f"stop_below.{name}: expected good requests/s per GPU above 0, got {floor:g}")


def file_problems(w: Any, i: int, where: Entry) -> list[str]:
    """Every SLO a capacity workload names is one of the file's [slo.NAME] tables."""
    known = ", ".join(where.slos) or "none"
    return [f"workloads[{i}].slo: no [slo.{name}] table (tables: {known})" for name in w.slo if name not in where.slos]


def campaign_specs(w: Any, slos: dict[str, SloSpec]) -> list[CapacitySpec]:
    """A campaign's `kind = "capacity"` workload → one search per SLO it names, each step sending chat
    requests as `servedeck bench --workload chat` would with the same keys."""
    bench = replace(points_from_entry(chat.POINTS, w, Entry()), shapes=())
    return [CapacitySpec(find=w.find, slo=slos[name], bench=bench, max_load=w.max,
                         resolution=parse_resolution(w.resolution or "10%"), start=w.start, arrivals=w.arrivals,
                         stop_below=(w.stop_below or {}).get(name))
            for name in w.slo]


def owns(workload: Any) -> bool:
    """A search's workload entry is its steps' (chat or long-prompt) with the search beside it."""
    return isinstance(workload.get("capacity"), dict)


def describe(w: dict[str, Any]) -> str:
    """Its steps' workload line (chat or long-prompt), then the search."""
    c = w.get("capacity") or {}
    steps = (long_prompt.KIND if w.get("workload") == long_prompt.KIND.name else chat.KIND).describe
    return ((steps(w) + " " if steps else "") + f"Every point is a step of a capacity search: {c.get('find')} under "
            f"SLO {(c.get('slo') or {}).get('name')}, loads up to {c.get('cap')} ({c.get('cap_reason')}).")


KIND = Kind(
    name=KIND_NAME, help="the most load within an SLO (--find), each step a load point of --workload chat or "
                          "long-prompt",
    options=OPTIONS, from_options=from_options, takes_over="find",
    keys=KEYS, check_entry=check_entry, file_problems=file_problems,
    from_entry=lambda w, where: campaign_specs(w, dict(where.slos)),
    fitted=fitted, run=run, owns=owns, describe=describe, head_sections=run_section, curve=None,
)
