"""A benchmark: one measured point per concurrency (closed loop) or arrival rate (open loop).

Each point gets fresh prompts (a new nonce, unique per request, sized with the server's own
tokenizer including the chat template), its own warm-up requests that share no prefix with the
measured ones, and reads the engine's prefix-cache counters right before and after its measured
phase. Every request is written to requests.jsonl the moment it finishes.

`--workload decode` is the seed's decode-speed check: one fixed prompt on /v1/completions, sent for
the warm-up and then for every measured request, so that only decoding is measured: its figures are
TPOT and decode tok/s; prefill (TTFT) is excluded, and the summary says so.

If the engine dies, the first failed request notices (the shim's process is gone), the point is
cancelled and ServerDied raised; finished requests stay on disk. Ctrl-C cancels the same way and
propagates as CancelledError.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from enum import Enum
from functools import partial
from typing import Any, Callable, Iterator, Literal, Optional, Sequence

from servedeck.workloads.reporter import Reporter
from servedeck.workloads.stall import StallJudge
from servedeck.workloads.target import Target
from servedeck.engines import get_engine
from servedeck.engines.metrics import Snapshot, metrics_snapshot_async, parse_prometheus
from servedeck.errors import RunError, ServerDied, UsageError
from servedeck.gates.server import ServerTokens
from servedeck.loadgen.api import ApiClient
from servedeck.loadgen import (ClientConfig, ClosedLoop, LoadRun, OpenLoop, RequestRecord, RequestSpec,
                               Shape, Slo, StreamingClient, new_nonce, sized_requests, synthetic_requests,
                               synthetic_text)
from servedeck.loadgen.procs import ProcessLoadRun
from servedeck.loadgen.prompts import TooShort, chars_per_token, seeded_nonce
from servedeck.loadgen.schedule import shape_json
from servedeck.loadgen.spread import Spread
from servedeck.loadgen.stats import dist, tpot
from servedeck.loadgen.texts import Content
from servedeck.report.text import pct
from servedeck.runs.figures import add_figures, counter_delta, headline, point_figures
from servedeck.runs.folder import RunFolder
from servedeck.telemetry.figures import of_point as point_telemetry
from servedeck.telemetry.point import sampled
from servedeck.timeparse import seconds
from servedeck.workloads import options as O
from servedeck.workloads import outputs
from servedeck.workloads.options import ContentChoice
from servedeck.workloads.shape import Entry, Option

class ArrivalsChoice(str, Enum):
    """`--arrivals` with `--rate`: how an open loop spaces its requests."""

    poisson = "poisson"  # random gaps at the given mean rate
    constant = "constant"  # evenly spaced


@dataclass(frozen=True)
class WorkloadDefaults:
    """What `servedeck bench` uses for an option the user left out, per load-point kind."""

    output_tokens: int
    duration_s: Optional[float]  # a point's length when neither --duration nor --requests is given
    requests: Optional[int]
    request_timeout_s: Optional[float]  # None: no limit (a long prefill takes minutes)


@dataclass(frozen=True)
class PointKind:
    """What a load-point kind changes in the machinery here: its defaults, the option that sizes its prompts,
    whether that size fills the context (a long prompt), whether one fixed prompt on /v1/completions is sent
    for the warm-up and every measured call (decode speed), and the figures of its own a point gets, from its
    records ((figures, headline) added to the point's)."""

    name: str
    defaults: WorkloadDefaults
    size_flag: str = "--input-tokens"
    fills_context: bool = False
    fixed_prompt: bool = False
    figures: Optional[Callable[[list[RequestRecord]], tuple[dict[str, Any], dict[str, Any]]]] = None


def decode_figures(records: list[RequestRecord]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The decode kind's figures: TPOT and decode tok/s per measured request, nothing of prefill."""
    tp = [t for t in (tpot(r) for r in records if r.kind == "measured" and r.status == "ok") if t]
    fig = {"tpot_ms": dist([t * 1000 for t in tp]), "decode_tok_s": dist([1 / t for t in tp]),
           "requests": len(tp),
           "excluded": "prefill: TTFT, prefill tok/s and rates over the window include the prompt and are "
                       "not figures of this workload"}
    return {"decode": fig}, {"decode_tok_s_p50": (fig["decode_tok_s"] or {}).get("p50")}


# The built-in load-point kinds (their registry entries: chat.py, long_prompt.py, decode.py). A load-point
# kind from elsewhere names its own PointKind in its spec (`BenchSpec(points=...)`).
POINT_KINDS = {k.name: k for k in (
    PointKind("chat", WorkloadDefaults(output_tokens=1024, duration_s=60.0, requests=None, request_timeout_s=600.0)),
    PointKind("long-prompt", WorkloadDefaults(output_tokens=64, duration_s=None, requests=3, request_timeout_s=None),
              size_flag="--prompt-tokens", fills_context=True),
    PointKind("decode", WorkloadDefaults(output_tokens=256, duration_s=None, requests=3, request_timeout_s=None),
              fixed_prompt=True, figures=decode_figures),
)}
DEFAULTS = {name: k.defaults for name, k in POINT_KINDS.items()}

@dataclass(frozen=True)
class BenchSpec:
    workload: str  # the load-point kind: chat, long-prompt, decode (POINT_KINDS) or one naming `points`
    shapes: tuple[Shape, ...]
    output_tokens: int
    input_tokens: Optional[int] = None  # prompt tokens as the server prefills them
    prompt_tokens: Optional[int] = None  # a prompt that fills the context (long-prompt): same, near the context
    duration_s: Optional[float] = None
    requests: Optional[int] = None  # per point
    warmup: int = 1  # per point, distinct prompts
    slo: Optional[Slo] = None
    repeat_prompt: bool = False  # every measured request the same prompt: shows what the cache does
    seed: Optional[int] = None
    content: Content = "random"  # what follows each prompt's unique tag: random words, prose or code
    request_timeout_s: Optional[float] = 600.0  # per request; None: no limit (a 1M prefill takes minutes)
    stall_after_s: Optional[float] = 300.0  # no byte for this long: ask the engine's counters, stalled or slow
    check_outputs: bool = False  # answer the fixed output-check prompts first (outputs.jsonl)
    check_prompts: int = 8  # the output check: how many of its fixed prompts (the CLI always asks 8)
    check_tokens: int = 128  # and the answer room of each
    client_procs: int = 1  # client processes the streams are split across (one schedule for all)
    waves: Optional[int] = None  # closed loops: this many requests a stream (waves × concurrency per point)
    points: Optional[PointKind] = field(default=None, compare=False, repr=False)  # None: POINT_KINDS[workload]

    @property
    def kind(self) -> str:
        return self.workload

    @property
    def point_kind(self) -> PointKind:
        return self.points or POINT_KINDS[self.workload]

    @property
    def api(self) -> str:
        """The endpoint the requests use: one fixed prompt is a plain completion (no chat template), as the
        seed's decode check."""
        return "completions" if self.point_kind.fixed_prompt else "chat"

    @classmethod
    def from_options(cls, workload: Any, *, concurrency: Optional[Sequence[int]] = None,
                     rate: Optional[Sequence[float]] = None, arrivals: ArrivalsChoice | str = "poisson",
                     input_tokens: int = 1024, output_tokens: Optional[int] = None,
                     prompt_tokens: Optional[int] = None, duration_s: Optional[float] = None,
                     requests: Optional[int] = None, warmup: int = 1, slo: Optional[Slo] = None,
                     repeat_prompt: bool = False, seed: Optional[int] = None, content: Optional[str] = None,
                     request_timeout_s: Optional[float] | Literal["default"] = "default",
                     stall_after_s: Optional[float] = 300.0, check_outputs: bool = False,
                     client_procs: int = 1, waves: Optional[int] = None) -> "BenchSpec":
        """`servedeck bench`'s options, parsed (lists, seconds, the choices) → a checked spec. `workload`: a
        PointKind, or a built-in one's name. None (and "default" for the request timeout, where None means no
        limit) takes the kind's defaults. What needs the server's context (a long prompt's size, whether it
        fits) is checked when it is known."""
        pk = workload if isinstance(workload, PointKind) else POINT_KINDS.get(getattr(workload, "value", workload))
        if pk is None:
            raise ValueError(f"workload {workload!r} is not a load-point kind's (chat, long-prompt, decode): the ramp "
                             "is a RampSpec, every other kind has a spec of its own (workloads/kinds.py)")
        if concurrency and rate:
            raise UsageError("--concurrency and --rate are two different load shapes",
                             hint="give one: --concurrency 1,4,16 (closed loop) or --rate 2,4,8 (open loop)")
        gaps = ArrivalsChoice(arrivals).value
        shapes = tuple(OpenLoop(r, gaps) for r in rate) if rate else \
            tuple(ClosedLoop(c) for c in (concurrency or [1]))  # type: ignore[arg-type]
        default = pk.defaults
        if waves is not None and (duration_s is not None or requests is not None):
            raise UsageError("--waves sizes each point by its requests (waves × concurrency): it takes no "
                             f"--{'duration' if duration_s is not None else 'requests'} beside it",
                             hint="give one: --waves 3 (3 requests a stream), --requests N or --duration 60s")
        if duration_s is None and requests is None and waves is None:
            duration_s, requests = default.duration_s, default.requests
        spec = cls(workload=pk.name, shapes=shapes,
                   output_tokens=default.output_tokens if output_tokens is None else output_tokens,
                   input_tokens=None if pk.fills_context else input_tokens,
                   prompt_tokens=prompt_tokens if pk.fills_context else None,
                   duration_s=duration_s, requests=requests, warmup=warmup, slo=slo,
                   repeat_prompt=repeat_prompt, seed=seed,
                   content=ContentChoice(content or "random").value,
                   request_timeout_s=default.request_timeout_s if request_timeout_s == "default"
                   else request_timeout_s,  # type: ignore[arg-type]
                   stall_after_s=stall_after_s, check_outputs=check_outputs, client_procs=client_procs,
                   waves=waves, points=None if pk.name in POINT_KINDS and POINT_KINDS[pk.name] is pk else pk)
        spec.check(None)
        return spec

    @property
    def prompt_size(self) -> int:
        size = self.prompt_tokens if self.point_kind.fills_context else self.input_tokens
        assert size is not None
        return size

    def check(self, context: Optional[int]) -> None:
        """Every rule on the spec, once. context None: before the server is asked, so a long prompt that
        is to fill the context (prompt_tokens None) is not sized yet and only its output is checked."""
        if not self.shapes:
            raise UsageError("no load points", hint="give --concurrency 1,4 or --rate 2,4")
        sized = not self.point_kind.fills_context or self.prompt_tokens is not None
        if self.output_tokens < 1 or (sized and self.prompt_size < 16):
            raise UsageError("prompts need at least 16 tokens and outputs at least 1",
                             hint="check --input-tokens/--prompt-tokens and --output-tokens")
        if self.duration_s is None and self.requests is None and self.waves is None:
            raise UsageError("say how long each point runs", hint="--duration 60s, --requests N or --waves 3")
        if self.waves is not None and self.waves < 1:
            raise UsageError(f"--waves must be at least 1, got {self.waves}",
                             hint="--waves 3: three requests a stream, a steady state after the first wave")
        if self.waves is not None and any(isinstance(s, OpenLoop) for s in self.shapes):
            raise UsageError("--waves counts requests a stream of a closed loop; an open loop (--rate) has no streams",
                             hint="bound open-loop points with --requests N or --duration 60s")
        if self.requests is not None and self.requests < 1:
            raise UsageError(f"--requests must be at least 1, got {self.requests}",
                             hint="or bound each point by time: --duration 60s")
        if self.client_procs < 1:
            raise UsageError(f"--client-procs must be at least 1, got {self.client_procs}",
                             hint="1 runs the client in this process; N > 1 splits the streams over N processes")
        if self.warmup < 0:
            raise UsageError(f"--warmup must be 0 or more, got {self.warmup}",
                             hint="--warmup 0 skips warm-up; warm-up prompts never repeat measured ones")
        if context and sized and self.prompt_size + self.output_tokens > context:
            flag = self.point_kind.size_flag
            raise UsageError(
                f"{self.prompt_size} prompt + {self.output_tokens} output tokens do not fit the server's "
                f"context of {context} tokens per request",
                hint=f"lower {flag} or --output-tokens (their sum must stay at or under {context})")

    def to_json(self) -> dict[str, Any]:
        return {"workload": self.workload, "points": [shape_label(s) for s in self.shapes],
                "input_tokens": self.input_tokens, "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "duration_s": self.duration_s, "requests": self.requests,
                "warmup": self.warmup, "repeat_prompt": self.repeat_prompt, "seed": self.seed,
                "content": self.content, "request_timeout_s": self.request_timeout_s,
                "stall_after_s": self.stall_after_s, "check_outputs": self.check_outputs,
                "slo": None if self.slo is None else {"ttft_ms": self.slo.ttft_ms, "tpot_ms": self.slo.tpot_ms,
                                                      "e2e_ms": self.slo.e2e_ms},
                "api": self.api, "ignore_eos": True, "client_procs": self.client_procs, "waves": self.waves,
                **({"fixed_prompt": True, "excluded": "prefill (TTFT): one fixed prompt, cached after the warm-up"}
                   if self.point_kind.fixed_prompt else {})}


def shape_label(shape: Shape) -> str:
    if isinstance(shape, ClosedLoop):
        return f"c={shape.concurrency}"
    return f"rate={shape.rate:g}/s {shape.arrivals}"


@dataclass
class _Watch:
    """Per point: notices the engine's death from a failed request and cancels the point."""

    target: Target
    task: Optional[asyncio.Task[Any]] = None
    death: Optional[str] = None
    errors: int = field(default=0)

    def saw(self, rec: RequestRecord) -> None:
        if rec.status != "error" or self.death is not None:
            return
        self.errors += 1
        self.death = self.target.death()
        if self.death is not None and self.task is not None:
            self.task.cancel()


async def _prompts(spec: BenchSpec, tokens: ServerTokens, nonce: str, reporter: Reporter,
                   label: str) -> tuple[list[RequestSpec], list[RequestSpec] | Callable[[], Iterator[RequestSpec]],
                                    dict[str, Any]]:
    """Warm-up and measured requests for one point, and how they were sized. Measured requests
    without end (a duration-bounded point) come as a picklable factory, so that several client
    processes can each draw their share."""
    size, out = spec.prompt_size, spec.output_tokens

    async def count(text: str) -> int:
        return await tokens.count_chat([{"role": "user", "content": text}])

    if spec.point_kind.fixed_prompt:
        # One fixed prompt for warm-up and measured calls alike: only decoding is measured, so its
        # exact size does not matter (the server's prompt_tokens stay on record per request).
        text = synthetic_text(0, size, nonce=nonce, seed=spec.seed)
        first = RequestSpec(id=f"{nonce}-decode", prompt=text, max_tokens=out)
        warm = [RequestSpec(id=f"{nonce}-w{i}", prompt=text, max_tokens=out, kind="warmup")
                for i in range(spec.warmup)]
        how = {"sized_by": "approximate (default chars/token); the server's prompt_tokens are the record",
               "target_tokens": size, "fixed_prompt": True}
        return warm, partial(_repeat, first), how
    reporter.stage(f"{label}: sizing prompts with the server's tokenizer")
    try:
        warm = await sized_requests(size, out, spec.warmup, count, kind="warmup", seed=spec.seed, nonce=nonce,
                                    content=spec.content) if spec.warmup else []
        if spec.requests is not None:
            n = 1 if spec.repeat_prompt else spec.requests
            measured = await sized_requests(size, out, n, count, seed=spec.seed, nonce=nonce, content=spec.content)
    except TooShort as e:  # only the server's tokenizer knows how long the tag and its chat template are
        flag = spec.point_kind.size_flag
        raise UsageError(f"{flag} {size}: on this server the prompt's unique tag and the chat template alone take "
                         f"{e.fixed} tokens", hint=f"give {flag} {e.fixed + 16} or more") from None
    if spec.requests is not None:
        how = {"sized_by": "server tokenizer, exact per request (chat template included)", "target_tokens": size}
    else:
        # Duration runs need prompts without end: calibrate characters per token on the server once,
        # then size by length; the server's reported prompt_tokens stay the record of truth.
        cpt = chars_per_token(spec.content)
        for _ in range(3):
            sample = synthetic_text(0, size, nonce=nonce, seed=spec.seed, chars_per_token=cpt, content=spec.content)
            got = await count(sample)
            cpt *= size / max(got, 1)
        measured = list(synthetic_requests(size, out, n=1, seed=spec.seed, nonce=nonce, chars_per_token=cpt,
                                           content=spec.content)) \
            if spec.repeat_prompt else partial(synthetic_requests, size, out, seed=spec.seed, nonce=nonce,
                                               chars_per_token=cpt, content=spec.content)
        how = {"sized_by": "server tokenizer, calibrated chars/token (approximate per request)",
               "target_tokens": size, "chars_per_token": round(cpt, 4)}
    how["content"] = spec.content
    if spec.repeat_prompt:
        assert isinstance(measured, list)
        how["repeat_prompt"] = True
        return warm, partial(_repeat, measured[0]), how
    return warm, measured, how


def _repeat(first: RequestSpec) -> Iterator[RequestSpec]:
    i = 0
    while True:
        yield RequestSpec(id=f"{first.id}-rep{i}", prompt=first.prompt, max_tokens=first.max_tokens,
                          prompt_tokens_expected=first.prompt_tokens_expected, index=first.index,
                          digest=first.digest)
        i += 1


async def run_point(index: int, shape: Shape, spec: BenchSpec, target: Target, folder: RunFolder,
                    reporter: Reporter) -> dict[str, Any]:
    """One measured point; returns its summary entry (already written to summary.json)."""
    label = shape_label(shape)
    if spec.waves is not None and isinstance(shape, ClosedLoop):  # as vllm bench serve's --num-prompts
        spec = replace(spec, requests=spec.waves * shape.concurrency, duration_s=None)
    nonce = seeded_nonce(spec.seed, index) if spec.seed is not None else new_nonce()
    point: dict[str, Any] = {"index": index, "label": label, "shape": shape_json(shape), "nonce": nonce,
                             "status": "running"}
    put_point(folder, point)
    watch = _Watch(target)
    records: list[RequestRecord] = []

    def on_record(rec: RequestRecord) -> None:
        line = rec.to_json()
        folder.request({"point": index, **line})
        # Figures come from the record as written (times rounded to the µs), so summary.json and a
        # later `show`, which reads requests.jsonl, compute exactly the same numbers.
        records.append(RequestRecord.from_json(line))
        watch.saw(rec)

    async with ApiClient(target.base_url) as api:
        tokens = ServerTokens(api, target.served_name, target.engine)
        try:
            warm, measured, how = await _prompts(spec, tokens, nonce, reporter, label)
        except RunError as e:
            death = target.death()
            raise (ServerDied(death) if death else e) from None
        point["prompts"] = how
        conc = shape.concurrency if isinstance(shape, ClosedLoop) else None
        cfg = _config(target, spec)  # client processes (--client-procs) talk to the first replica only
        async with _client(target, spec) as client, sampled(folder.path, target, index) as telemetry:
            # With client processes the connections that matter are theirs; this one only warms up.
            await client.prewarm(min(conc or 16, 256) if spec.client_procs == 1 else max(1, len(warm)))
            if warm:
                same = "the measured prompt" if spec.point_kind.fixed_prompt else "distinct prompts"
                reporter.stage(f"{label}: warm-up ({len(warm)} requests, {same})")
                await LoadRun(client, ClosedLoop(min(len(warm), conc or 4)), [], warmup=warm,
                              on_record=on_record).run()
            before = await metrics_snapshot_async(target.engine, target.base_url)
            gen_before = await _generated(target) if isinstance(client, Spread) else None
            if isinstance(client, Spread):
                client.reset_counts()
            total = spec.requests if spec.duration_s is None else None
            reporter.point_start(label, total, spec.duration_s)
            run: LoadRun | ProcessLoadRun
            if spec.client_procs > 1:
                point["client_procs"] = spec.client_procs
                await client.aclose()  # no idle connection of ours holds a server slot meanwhile
                run = ProcessLoadRun(cfg, shape, measured, procs=spec.client_procs, max_requests=spec.requests,
                                     duration_s=spec.duration_s, on_record=on_record,
                                     on_progress=lambda p: reporter.progress(label, p))
            else:
                run = LoadRun(client, shape, measured if isinstance(measured, list) else measured(),
                              max_requests=spec.requests, duration_s=spec.duration_s,
                              on_record=on_record, on_progress=lambda p: reporter.progress(label, p))
            watch.task = asyncio.current_task()
            stalls: list[dict[str, Any]] = []
            judge = StallJudge(target, spec.stall_after_s or float("inf"))
            guard = asyncio.ensure_future(_watch_long(client, judge, spec, reporter, label, stalls))
            try:
                await run.run()
                point["status"] = "ok"
            except asyncio.CancelledError:
                if watch.death is None:
                    point.update(status="interrupted", load=run.result().meta())
                    _finish_point(folder, point, records, spec)
                    raise
                current = asyncio.current_task()
                if current is not None:
                    current.uncancel()
                point["status"] = "failed"
            finally:
                guard.cancel()
                await asyncio.gather(guard, return_exceptions=True)
                point["stalls"], point["slow"] = stalls, judge.slow
            after = await metrics_snapshot_async(target.engine, target.base_url) \
                if watch.death is None else Snapshot()
            if isinstance(client, Spread):
                point["replicas"] = client.counts()
                gen_after = await _generated(target) if watch.death is None else None
                for i, r in enumerate(point["replicas"]):
                    if gen_before and gen_after and gen_before[i] is not None and gen_after[i] is not None:
                        r["generated_tokens_by_server"] = gen_after[i] - gen_before[i]
        point["load"] = run.result().meta()
        point["telemetry"] = telemetry.facts
        point["counters"] = counter_delta(before.prefix, after.prefix)
        point["spec_counters"] = {"before": before.spec, "after": after.spec}
        point["engine_histograms"] = {"before": before.histograms, "after": after.histograms}
        point["speculation_configured"] = target.speculation
        point["spec_timing_fields"] = get_engine(target.engine).spec_timings
        if target.speculation:
            point["spec_note"] = get_engine(target.engine).spec_note
    _finish_point(folder, point, records, spec)
    reporter.point_done(label, point)
    if watch.death is not None:
        raise ServerDied(f"{watch.death} (during point {label}, after {point['headline']['ok'] or 0} "
                         "finished requests)")
    return point


def _config(t: Target, spec: BenchSpec) -> ClientConfig:
    return ClientConfig(t.base_url, t.served_name, api=spec.api,  # type: ignore[arg-type]
                        continuous_usage_stats=get_engine(t.engine).stream_usage_per_chunk,
                        extra_body=t.request, request_timeout_s=spec.request_timeout_s)


def _client(target: Target, spec: BenchSpec) -> Any:
    """One streaming client, or one per replica behind a least-outstanding-requests Spread."""
    if not target.peers:
        return StreamingClient(_config(target, spec))
    return Spread([StreamingClient(_config(t, spec)) for t in target.replicas])


async def _generated(target: Target) -> list[Optional[float]]:
    """Each replica's own count of generated tokens (its /metrics), to check the spread against."""
    name = get_engine(target.engine).metrics.get("generation_tokens")
    out: list[Optional[float]] = []
    for t in target.replicas:
        async with ApiClient(t.base_url) as api:
            r = await api.get("/metrics", timeout_s=10)
        out.append(parse_prometheus(r.body).get(name) if r.ok and name else None)
    return out


async def _watch_long(client: StreamingClient, judge: StallJudge, spec: BenchSpec, reporter: Reporter, label: str,
                      stalls: list[dict[str, Any]]) -> None:
    """While a point runs: show long requests' progress, and end those the engine's counters call stalled."""
    limits = [x for x in (spec.stall_after_s,) if x]
    tick = max(0.2, min([10.0] + [x / 4 for x in limits]))
    shown = 0.0
    while True:
        await asyncio.sleep(tick)
        busy = client.in_flight()
        now = asyncio.get_running_loop().time()
        quietest = max(busy, key=lambda b: b[1], default=None)
        if quietest is not None and quietest[1] >= 10.0 and now - shown >= 10.0:
            shown = now
            reporter.stage(f"{label}: {len(busy)} in flight; {quietest[0]}: {quietest[2]} tokens so far, "
                           f"last byte {quietest[1]:.0f} s ago")
        if spec.stall_after_s is None:
            continue
        for rid, quiet_s, chunks, conn in busy:
            verdict = await judge.check(rid, quiet_s, tick)
            if verdict is not None:
                stalls.append({"request": rid, "tokens_so_far": chunks, **verdict})
                reporter.stage(f"{label}: {rid} {verdict['detail']}")
                client.end(conn, verdict["detail"])


def finish_point(folder: RunFolder, point: dict[str, Any], records: list[RequestRecord], workload: dict[str, Any],
                 extra: Optional[Callable[[list[RequestRecord]], tuple[dict[str, Any], dict[str, Any]]]] = None
                 ) -> None:
    """A point's figures from its records as written (runs/figures.py, and the kind's own: `extra`), its
    telemetry and headline, into summary.json."""
    point["figures"] = point_figures(records, point, workload)
    more = add_figures(point["figures"], extra, records)
    point["figures"]["telemetry"] = point_telemetry(folder.path, point, records)
    point["headline"] = {**headline(point["figures"]), **more}
    put_point(folder, point)


def _finish_point(folder: RunFolder, point: dict[str, Any], records: list[RequestRecord], spec: BenchSpec) -> None:
    finish_point(folder, point, records, spec.to_json(), spec.point_kind.figures)


def put_point(folder: RunFolder, point: dict[str, Any]) -> None:
    points = [p for p in folder.summary.get("points", []) if p.get("index") != point["index"]]
    folder.update(points=sorted(points + [point], key=lambda p: p["index"]))


# --- a run of load points (chat, long-prompt, decode) ----------------------------------------------

def fitted(spec: BenchSpec, target: Target, ctx: int) -> BenchSpec:
    """A long prompt left unsized fills what the context leaves after the output; every rule against the context
    and the model's output cap."""
    if spec.point_kind.fills_context and spec.prompt_tokens is None:
        spec = replace(spec, prompt_tokens=ctx - spec.output_tokens)
    spec.check(ctx)
    target.check_output_cap(spec.output_tokens, "--output-tokens")
    return spec


async def run(spec: BenchSpec, target: Target, ctx: int, folder: RunFolder, reporter: Reporter) -> Optional[str]:
    """The output check when asked, then every point; the failure, if requests failed."""
    if spec.check_outputs:
        await outputs.check(folder, target, reporter, spec.check_prompts, spec.check_tokens)
    for i, shape in enumerate(spec.shapes):
        await run_point(i, shape, spec, target, folder, reporter)
    errors = [(p["label"], p["figures"]["counts"]) for p in folder.summary["points"]
              if p["figures"]["counts"]["error"]]
    if not errors:
        return None
    first = next((w for p in folder.summary["points"] for w in p["figures"]["warnings"] if "failed" in w), "")
    return "requests failed: " + "; ".join(f"{label}: {c['error']} of {c['measured']}" for label, c in errors) \
        + f" ({first})"


# --- options and keys, shared by the load-point kinds ------------------------------------------------

OPTIONS = (
    O.CONCURRENCY,
    Option("rate", ("--rate",), Optional[str], None, "open-loop points in requests/s, e.g. 2,4,8"),
    Option("arrivals", ("--arrivals",), ArrivalsChoice, ArrivalsChoice.poisson,
           "with --rate: poisson (random gaps at the given mean rate) | constant (evenly spaced)"),
    Option("input_tokens", ("--input-tokens",), int, 1024, "chat, decode: prompt tokens as the server counts them"),
    O.OUTPUT_TOKENS,
    Option("duration", ("--duration",), Optional[str], None, "per point, e.g. 60s (default for chat)"),
    Option("requests", ("--requests",), Optional[int], None, "per point (long-prompt and decode default 3)"),
    Option("waves", ("--waves",), Optional[int], None, "closed-loop points: N requests a stream (N × concurrency a "
           "point, as vllm bench serve's --num-prompts); 3 or more reach a steady state, 1 is a single burst"),
    Option("warmup", ("--warmup",), int, 1, "warm-up requests per point, with their own prompts"),
    Option("slo", ("--slo",), Optional[str], None, "goodput bounds, e.g. ttft=2s,tpot=50ms; with --find the "
           "target, e.g. ttft_p95<=2s,tpot_p95<=50ms,itl_p99<=100ms,error_rate<=1%"),
    Option("repeat_prompt", ("--repeat-prompt",), bool, False,
           "send one prompt over and over: shows the prefix cache at work; not a benchmark"),
    O.SEED, O.CONTENT, O.REQUEST_TIMEOUT, O.STALL_AFTER,
    Option("check_outputs", ("--check-outputs",), bool, False,
           "first answer 8 fixed prompts greedily into outputs.jsonl (see compare-outputs)"),
    Option("client_procs", ("--client-procs",), int, 1,
           "split the streams over N client processes (one schedule); for hosts with spare cores"),
)


def from_options(points: PointKind, o: Any, *, slo: bool = True) -> BenchSpec:
    """`servedeck bench --workload NAME`'s options (as typed) → the checked spec. `slo` False: --slo is a
    capacity search's target, not goodput bounds."""
    if not o.get("find") and (o.get("max_load") is not None or o.get("resolution") is not None):
        raise UsageError("--max and --resolution bound a capacity search", hint="add --find max-concurrency --slo ...")
    return BenchSpec.from_options(
        points, concurrency=O.numbers(o["concurrency"], "--concurrency") if o.get("concurrency") else None,
        rate=O.numbers(o["rate"], "--rate", float) if o.get("rate") else None, arrivals=o.get("arrivals", "poisson"),
        input_tokens=o.get("input_tokens", 1024), output_tokens=o.get("output_tokens"),
        prompt_tokens=o.get("prompt_tokens"),
        duration_s=seconds(o["duration"], "--duration") if o.get("duration") else None, requests=o.get("requests"),
        warmup=o.get("warmup", 1), slo=O.goodput_slo(o.get("slo")) if slo else None,
        repeat_prompt=bool(o.get("repeat_prompt")), seed=o.get("seed"), content=o.get("content"),
        request_timeout_s=O.request_timeout(o), stall_after_s=O.limit(o.get("stall_after") or "5m", "--stall-after"),
        check_outputs=bool(o.get("check_outputs")), client_procs=o.get("client_procs", 1), waves=o.get("waves"))


def from_entry(points: PointKind, w: Any, where: Entry) -> BenchSpec:
    """A [[workloads]] entry → what `servedeck bench` would run, with the same defaults (and, first in a
    campaign with a `reference`, the output check)."""
    if w.rate:
        shapes: tuple[Any, ...] = tuple(OpenLoop(r, w.arrivals) for r in w.rate)
    else:
        shapes = tuple(ClosedLoop(c) for c in (w.concurrency or [1]))
    default = points.defaults
    duration_s = seconds(w.duration, "duration") if w.duration else None
    requests = w.requests
    waves = getattr(w, "waves", None)
    if duration_s is None and requests is None and waves is None:
        duration_s, requests = default.duration_s, default.requests
    spec = BenchSpec(workload=points.name, shapes=shapes, output_tokens=w.output_tokens or default.output_tokens,
                     input_tokens=None if points.fills_context else w.input_tokens,
                     prompt_tokens=w.prompt_tokens if points.fills_context else None,
                     duration_s=duration_s, requests=requests, warmup=w.warmup, seed=w.seed,
                     client_procs=w.client_procs, waves=waves, points=None if POINT_KINDS.get(points.name) is points else points)
    if where.output_check:
        spec = replace(spec, check_outputs=True, check_prompts=where.output_check[0],
                       check_tokens=where.output_check[1])
    return spec


# --- the load points for people (report/render.py shows them through each kind's entry) ---------------

def describe(w: dict[str, Any], prompt: str, *, fixed: bool = False) -> str:
    """summary.md's workload line of a load-point run; `prompt` says how its prompts are sized."""
    bits = [f"workload **{w.get('workload')}**", f"points {', '.join(w.get('points') or [])}", prompt,
            f"{w.get('content', 'random')} text after a unique tag", f"output {w.get('output_tokens')} tokens (ignore_eos)",
            f"{w['waves']} requests a stream per point" if w.get("waves") else
            f"{w['requests']} requests per point" if w.get("requests") else f"{w.get('duration_s')} s per point",
            f"warm-up {w.get('warmup')} per point with that same prompt" if fixed
            else f"warm-up {w.get('warmup')} per point (prompts distinct from the measured ones)"]
    if w.get("repeat_prompt"):
        bits.append("**one repeated prompt (a prefix-cache demonstration, not a benchmark)**")
    if fixed:
        bits.append("**decode speed only: TPOT and decode tok/s; prefill (TTFT) is excluded**")
    if w.get("slo"):
        bits.append("SLO " + ", ".join(f"{k}={v}" for k, v in w["slo"].items() if v is not None))
    return "; ".join(bits) + "."


def headlines(view: dict[str, Any], line: Callable[[str, dict[str, Any]], str]) -> str:
    """`servedeck runs`' figures of a run of points: `line(label, headline)` per point, the cached share after."""
    parts = []
    for p in view.get("points") or []:
        h = p.get("headline") or {}
        parts.append(line(p["label"], h))
        if h.get("cached_fraction"):
            parts[-1] += f", cached {pct(h['cached_fraction'])}"
    return "; ".join(parts) or "-"
