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
from functools import partial
from typing import Any, Callable, Iterator, Literal, Optional

import httpx

from servedeck.campaign.reporter import Reporter
from servedeck.campaign.target import Target
from servedeck.engines import get_engine
from servedeck.engines.metrics import prefix_counters_async
from servedeck.errors import RunError, ServedeckError, ServerDied
from servedeck.gates.server import ServerTokens
from servedeck.loadgen import (ClientConfig, ClosedLoop, LoadRun, RequestRecord, RequestSpec,
                               Shape, Slo, StreamingClient, new_nonce, sized_requests, synthetic_requests,
                               synthetic_text)
from servedeck.loadgen.procs import ProcessLoadRun
from servedeck.loadgen.prompts import DEFAULT_CHARS_PER_TOKEN, seeded_nonce
from servedeck.loadgen.schedule import shape_json
from servedeck.runs.figures import counter_delta, headline, point_figures
from servedeck.runs.folder import RunFolder

Workload = Literal["chat", "long-prompt", "decode"]


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
    client_procs: int = 1  # client processes the streams are split across (one schedule for all)

    @property
    def api(self) -> str:
        """The endpoint the requests use: decode is a plain completion (no chat template), as the seed's check."""
        return "completions" if self.workload == "decode" else "chat"

    @property
    def prompt_size(self) -> int:
        size = self.prompt_tokens if self.workload == "long-prompt" else self.input_tokens
        assert size is not None
        return size

    def check(self, context: Optional[int]) -> None:
        if not self.shapes:
            raise ServedeckError("no load points", hint="give --concurrency 1,4 or --rate 2,4")
        if self.output_tokens < 1 or self.prompt_size < 16:
            raise ServedeckError("prompts need at least 16 tokens and outputs at least 1",
                                 hint="check --input-tokens/--prompt-tokens and --output-tokens")
        if self.duration_s is None and self.requests is None:
            raise ServedeckError("say how long each point runs", hint="--duration 60s or --requests N")
        if self.requests is not None and self.requests < 1:
            raise ServedeckError(f"--requests must be at least 1, got {self.requests}",
                                 hint="or bound each point by time: --duration 60s")
        if self.client_procs < 1:
            raise ServedeckError(f"--client-procs must be at least 1, got {self.client_procs}",
                                 hint="1 runs the client in this process; N > 1 splits the streams over N processes")
        if self.warmup < 0:
            raise ServedeckError(f"--warmup must be 0 or more, got {self.warmup}",
                                 hint="--warmup 0 skips warm-up; warm-up prompts never repeat measured ones")
        if context and self.prompt_size + self.output_tokens > context:
            flag = "--prompt-tokens" if self.workload == "long-prompt" else "--input-tokens"
            raise ServedeckError(
                f"{self.prompt_size} prompt + {self.output_tokens} output tokens do not fit the server's "
                f"context of {context} tokens per request",
                hint=f"lower {flag} or --output-tokens (their sum must stay at or under {context})")

    def to_json(self) -> dict[str, Any]:
        return {"workload": self.workload, "points": [shape_label(s) for s in self.shapes],
                "input_tokens": self.input_tokens, "prompt_tokens": self.prompt_tokens,
                "output_tokens": self.output_tokens, "duration_s": self.duration_s, "requests": self.requests,
                "warmup": self.warmup, "repeat_prompt": self.repeat_prompt, "seed": self.seed,
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
    warm = await sized_requests(size, out, spec.warmup, count, kind="warmup", seed=spec.seed, nonce=nonce) \
        if spec.warmup else []
    if spec.requests is not None:
        n = 1 if spec.repeat_prompt else spec.requests
        measured = await sized_requests(size, out, n, count, seed=spec.seed, nonce=nonce)
        how = {"sized_by": "server tokenizer, exact per request (chat template included)", "target_tokens": size}
    else:
        # Duration runs need prompts without end: calibrate characters per token on the server once,
        # then size by length; the server's reported prompt_tokens stay the record of truth.
        cpt = DEFAULT_CHARS_PER_TOKEN
        for _ in range(3):
            sample = synthetic_text(0, size, nonce=nonce, seed=spec.seed, chars_per_token=cpt)
            got = await count(sample)
            cpt *= size / max(got, 1)
        measured = list(synthetic_requests(size, out, n=1, seed=spec.seed, nonce=nonce, chars_per_token=cpt)) \
            if spec.repeat_prompt else partial(synthetic_requests, size, out, seed=spec.seed, nonce=nonce,
                                               chars_per_token=cpt)
        how = {"sized_by": "server tokenizer, calibrated chars/token (approximate per request)",
               "target_tokens": size, "chars_per_token": round(cpt, 4)}
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

    async with httpx.AsyncClient() as http:
        tokens = ServerTokens(http, target.base_url, target.served_name, target.engine)
        try:
            warm, measured, how = await _prompts(spec, tokens, nonce, reporter, label)
        except RunError as e:
            death = target.death()
            raise (ServerDied(death) if death else e) from None
        point["prompts"] = how
        cfg = ClientConfig(target.base_url, target.served_name, api=spec.api,  # type: ignore[arg-type]
                           continuous_usage_stats=get_engine(target.engine).stream_usage_per_chunk)
        conc = shape.concurrency if isinstance(shape, ClosedLoop) else None
        async with StreamingClient(cfg) as client:
            # With client processes the connections that matter are theirs; this one only warms up.
            await client.prewarm(min(conc or 16, 256) if spec.client_procs == 1 else max(1, len(warm)))
            if warm:
                same = "the measured prompt" if spec.workload == "decode" else "distinct prompts"
                reporter.stage(f"{label}: warm-up ({len(warm)} requests, {same})")
                await LoadRun(client, ClosedLoop(min(len(warm), conc or 4)), [], warmup=warm,
                              on_record=on_record).run()
            before = await prefix_counters_async(target.engine, target.base_url)
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
            after = await prefix_counters_async(target.engine, target.base_url) if watch.death is None else None
        point["load"] = run.result().meta()
        point["counters"] = counter_delta(before, after)
    _finish_point(folder, point, records, spec)
    reporter.point_done(label, point)
    if watch.death is not None:
        raise ServerDied(f"{watch.death} (during point {label}, after {point['headline']['ok'] or 0} "
                         "finished requests)")
    return point


def _finish_point(folder: RunFolder, point: dict[str, Any], records: list[RequestRecord], spec: BenchSpec) -> None:
    point["figures"] = point_figures(records, point, spec.to_json())
    point["headline"] = headline(point["figures"])
    _put_point(folder, point)


def _put_point(folder: RunFolder, point: dict[str, Any]) -> None:
    points = [p for p in folder.summary.get("points", []) if p.get("index") != point["index"]]
    folder.update(points=sorted(points + [point], key=lambda p: p["index"]))

