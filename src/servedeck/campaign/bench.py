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
from dataclasses import dataclass, field
from enum import Enum
from functools import partial
from typing import Any, Callable, Iterator, Literal, Optional, Sequence


from servedeck.campaign.reporter import Reporter
from servedeck.campaign.stall import StallJudge
from servedeck.campaign.target import Target
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
from servedeck.loadgen.texts import CONTENTS, Content
from servedeck.runs.figures import counter_delta, headline, point_figures
from servedeck.runs.folder import RunFolder
from servedeck.telemetry.figures import of_point as point_telemetry
from servedeck.telemetry.point import sampled

Workload = Literal["chat", "long-prompt", "decode"]


class WorkloadChoice(str, Enum):
    """`servedeck bench --workload`: the three kinds a BenchSpec runs, the ramp (campaign/ramp.py's
    RampSpec, also `servedeck ramp`) and the conversations (campaign/conversations.py's ConversationsSpec)."""

    chat = "chat"  # --input-tokens of prompt, --output-tokens of answer, per request
    long_prompt = "long-prompt"  # a prompt near the context
    decode = "decode"  # one fixed prompt: decode speed only
    ramp = "ramp"  # one conversation grown turn by turn
    conversations = "conversations"  # many users, each a multi-turn conversation (campaign/conversations.py)
    shared_prefix = "shared-prefix"  # groups of requests sharing a prefix (campaign/shared_prefix.py)
    trace = "trace"  # a recorded trace replayed on its own schedule (campaign/trace.py)


class ArrivalsChoice(str, Enum):
    """`--arrivals` with `--rate`: how an open loop spaces its requests."""

    poisson = "poisson"  # random gaps at the given mean rate
    constant = "constant"  # evenly spaced


# `--content`: what follows each prompt's unique tag (loadgen/texts.py says what each one is)
ContentChoice = Enum("ContentChoice", {c: c for c in CONTENTS}, type=str)  # type: ignore[misc]


@dataclass(frozen=True)
class WorkloadDefaults:
    """What `servedeck bench` uses for an option the user left out, per workload."""

    output_tokens: int
    duration_s: Optional[float]  # a point's length when neither --duration nor --requests is given
    requests: Optional[int]
    request_timeout_s: Optional[float]  # None: no limit (a long prefill takes minutes)


DEFAULTS: dict[str, WorkloadDefaults] = {
    "chat": WorkloadDefaults(output_tokens=1024, duration_s=60.0, requests=None, request_timeout_s=600.0),
    "long-prompt": WorkloadDefaults(output_tokens=64, duration_s=None, requests=3, request_timeout_s=None),
    "decode": WorkloadDefaults(output_tokens=256, duration_s=None, requests=3, request_timeout_s=None),
}


@dataclass(frozen=True)
class BenchSpec:
    workload: Workload
    shapes: tuple[Shape, ...]
    output_tokens: int
    input_tokens: Optional[int] = None  # chat: prompt tokens as the server prefills them
    prompt_tokens: Optional[int] = None  # long-prompt: same, near the context
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

    @property
    def api(self) -> str:
        """The endpoint the requests use: decode is a plain completion (no chat template), as the seed's check."""
        return "completions" if self.workload == "decode" else "chat"

    @classmethod
    def from_options(cls, workload: WorkloadChoice | str, *, concurrency: Optional[Sequence[int]] = None,
                     rate: Optional[Sequence[float]] = None, arrivals: ArrivalsChoice | str = "poisson",
                     input_tokens: int = 1024, output_tokens: Optional[int] = None,
                     prompt_tokens: Optional[int] = None, duration_s: Optional[float] = None,
                     requests: Optional[int] = None, warmup: int = 1, slo: Optional[Slo] = None,
                     repeat_prompt: bool = False, seed: Optional[int] = None, content: Optional[str] = None,
                     request_timeout_s: Optional[float] | Literal["default"] = "default",
                     stall_after_s: Optional[float] = 300.0, check_outputs: bool = False,
                     client_procs: int = 1) -> "BenchSpec":
        """`servedeck bench`'s options, parsed (lists, seconds, the choices) → a checked spec. None (and
        "default" for the request timeout, where None means no limit) takes the workload's DEFAULTS.
        What needs the server's context (a long prompt's size, whether it fits) is checked when it is known."""
        kind = WorkloadChoice(workload).value
        if kind not in DEFAULTS:
            raise ValueError(f"workload {kind!r} is not a BenchSpec's (the ramp is a RampSpec)")
        if concurrency and rate:
            raise UsageError("--concurrency and --rate are two different load shapes",
                             hint="give one: --concurrency 1,4,16 (closed loop) or --rate 2,4,8 (open loop)")
        gaps = ArrivalsChoice(arrivals).value
        shapes = tuple(OpenLoop(r, gaps) for r in rate) if rate else \
            tuple(ClosedLoop(c) for c in (concurrency or [1]))  # type: ignore[arg-type]
        default = DEFAULTS[kind]
        if duration_s is None and requests is None:
            duration_s, requests = default.duration_s, default.requests
        spec = cls(workload=kind, shapes=shapes,  # type: ignore[arg-type]
                   output_tokens=default.output_tokens if output_tokens is None else output_tokens,
                   input_tokens=input_tokens if kind in ("chat", "decode") else None,
                   prompt_tokens=prompt_tokens if kind == "long-prompt" else None,
                   duration_s=duration_s, requests=requests, warmup=warmup, slo=slo,
                   repeat_prompt=repeat_prompt, seed=seed,
                   content=ContentChoice(content or "random").value,
                   request_timeout_s=default.request_timeout_s if request_timeout_s == "default"
                   else request_timeout_s,  # type: ignore[arg-type]
                   stall_after_s=stall_after_s, check_outputs=check_outputs, client_procs=client_procs)
        spec.check(None)
        return spec

    @property
    def prompt_size(self) -> int:
        size = self.prompt_tokens if self.workload == "long-prompt" else self.input_tokens
        assert size is not None
        return size

    def check(self, context: Optional[int]) -> None:
        """Every rule on the spec, once. context None: before the server is asked, so a long prompt that
        is to fill the context (prompt_tokens None) is not sized yet and only its output is checked."""
        if not self.shapes:
            raise UsageError("no load points", hint="give --concurrency 1,4 or --rate 2,4")
        sized = self.workload != "long-prompt" or self.prompt_tokens is not None
        if self.output_tokens < 1 or (sized and self.prompt_size < 16):
            raise UsageError("prompts need at least 16 tokens and outputs at least 1",
                             hint="check --input-tokens/--prompt-tokens and --output-tokens")
        if self.duration_s is None and self.requests is None:
            raise UsageError("say how long each point runs", hint="--duration 60s or --requests N")
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
            flag = "--prompt-tokens" if self.workload == "long-prompt" else "--input-tokens"
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
                "api": self.api, "ignore_eos": True, "client_procs": self.client_procs,
                **({"fixed_prompt": True, "excluded": "prefill (TTFT): one fixed prompt, cached after the warm-up"}
                   if self.workload == "decode" else {})}


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

    if spec.workload == "decode":
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
        flag = "--prompt-tokens" if spec.workload == "long-prompt" else "--input-tokens"
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
    nonce = seeded_nonce(spec.seed, index) if spec.seed is not None else new_nonce()
    point: dict[str, Any] = {"index": index, "label": label, "shape": shape_json(shape), "nonce": nonce,
                             "status": "running"}
    _put_point(folder, point)
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
                same = "the measured prompt" if spec.workload == "decode" else "distinct prompts"
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


def _finish_point(folder: RunFolder, point: dict[str, Any], records: list[RequestRecord], spec: BenchSpec) -> None:
    point["figures"] = point_figures(records, point, spec.to_json())
    point["figures"]["telemetry"] = point_telemetry(folder.path, point, records)
    point["headline"] = headline(point["figures"])
    _put_point(folder, point)


def _put_point(folder: RunFolder, point: dict[str, Any]) -> None:
    points = [p for p in folder.summary.get("points", []) if p.get("index") != point["index"]]
    folder.update(points=sorted(points + [point], key=lambda p: p["index"]))

