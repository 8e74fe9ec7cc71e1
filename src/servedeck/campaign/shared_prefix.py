"""The shared-prefix workload: G groups of K requests, the requests of a group sharing one P-token prefix.

Each group's prefix opens with its own unique tag (no group shares anything with another) and goes on
with real text; each request then adds its own unique tag and U tokens of text and asks a question.
Requests go group after group, `concurrency` at a time (1 by default: a group's first request finds
its prefix cold and the others can find it in the engine's cache). What the engine served from its
prefix cache is its own account per request, kept in requests.jsonl with `group` and `in_group`; the
figures split the first request of each group from the rest (runs/turns.py's place_figures).

To measure the cache off: llama.cpp takes `cache_prompt = false` per request (models.toml's
`request = { cache_prompt = false }`); vLLM's prefix caching is a server flag (`args =
{ no-enable-prefix-caching = true }`).
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass
from typing import Any, Optional

from servedeck.campaign.bench import _finish_point, _put_point
from servedeck.campaign.conversations import QUESTION, _calibrate
from servedeck.campaign.reporter import QuietReporter, Reporter
from servedeck.campaign.session import (Outcome, _finish, _gate_or_inherit, _guarded, _open_run, _served_context,
                                        check_output_cap)
from servedeck.campaign.target import Target
from servedeck.campaign.window import engine_window, to_run_clock
from servedeck.config.schema import merge_request
from servedeck.errors import ServerDied, UsageError
from servedeck.gates.niah import GateSpec
from servedeck.gates.server import ServerTokens
from servedeck.loadgen import texts
from servedeck.loadgen.api import ApiClient
from servedeck.loadgen.prompts import _tag, new_nonce, seeded_nonce
from servedeck.loadgen.records import RequestRecord
from servedeck.loadgen.texts import Content
from servedeck.runs.folder import RunFolder
from servedeck.runs.turns import place_figures


@dataclass(frozen=True)
class SharedPrefixSpec:
    groups: int = 4
    group_size: int = 4  # requests per group
    prefix_tokens: int = 1024  # shared by the requests of a group
    suffix_tokens: int = 64  # each request's own part
    output_tokens: int = 16
    concurrency: int = 1
    content: Content = "prose"
    seed: Optional[int] = None
    request_timeout_s: Optional[float] = 600.0

    def check(self, context: Optional[int]) -> None:
        for flag, value, least in (("--groups", self.groups, 1), ("--group-size", self.group_size, 1),
                                   ("--prefix-tokens", self.prefix_tokens, 16),
                                   ("--suffix-tokens", self.suffix_tokens, 1),
                                   ("--output-tokens", self.output_tokens, 1), ("--concurrency", self.concurrency, 1)):
            if value < least:
                raise UsageError(f"{flag} must be at least {least}, got {value}",
                                 hint="e.g. --groups 4 --group-size 4 --prefix-tokens 1024 --suffix-tokens 64")
        if self.content == "random":
            raise UsageError("the shared prefix is real text; --content random is not for it",
                             hint="--content prose (default) or --content code")
        total = self.prefix_tokens + self.suffix_tokens + self.output_tokens + 64
        if context and total > context:
            raise UsageError(f"prefix {self.prefix_tokens} + suffix {self.suffix_tokens} + output "
                             f"{self.output_tokens} tokens (+ 64 for the template and question) do not fit the "
                             f"server's context of {context}", hint="lower --prefix-tokens")

    @property
    def label(self) -> str:
        return f"{self.groups} groups x {self.group_size}, prefix {self.prefix_tokens}"

    def to_json(self) -> dict[str, Any]:
        return {"workload": "shared-prefix", "points": [self.label], "groups": self.groups,
                "group_size": self.group_size, "prefix_tokens": self.prefix_tokens,
                "suffix_tokens": self.suffix_tokens, "output_tokens": self.output_tokens,
                "concurrency": self.concurrency, "content": self.content, "seed": self.seed,
                "request_timeout_s": self.request_timeout_s, "warmup": 0, "api": "chat", "temperature": 0}


async def run_shared_prefix(spec: SharedPrefixSpec, target: Target, folder: RunFolder, reporter: Reporter
                            ) -> dict[str, Any]:
    rng = random.Random(spec.seed)
    nonce = seeded_nonce(spec.seed, 0) if spec.seed is not None else new_nonce()
    point: dict[str, Any] = {"index": 0, "label": spec.label, "shape": {"concurrency": spec.concurrency},
                             "nonce": nonce, "status": "running"}
    _put_point(folder, point)
    records: list[RequestRecord] = []
    async with ApiClient(target.base_url) as api:
        tokens = ServerTokens(api, target.served_name, target.engine)
        reporter.stage("shared-prefix: sizing prompts with the server's tokenizer")
        cpt = await _calibrate(tokens, spec.content, texts.start_of(spec.content, rng), spec.prefix_tokens)
        point["prompts"] = {"sized_by": "server tokenizer, calibrated chars/token (approximate)",
                            "chars_per_token": round(cpt, 4), "content": spec.content}
        jobs: asyncio.Queue[tuple[int, int, str]] = asyncio.Queue()
        for g in range(spec.groups):
            prefix = _tag(nonce, "measured", g) + texts.piece(spec.content, texts.start_of(spec.content, rng),
                                                              int(spec.prefix_tokens * cpt))
            for k in range(1, spec.group_size + 1):
                own = _tag(nonce, "warmup", g * spec.group_size + k) + texts.piece(
                    spec.content, texts.start_of(spec.content, rng), int(spec.suffix_tokens * cpt))
                jobs.put_nowait((g, k, f"{prefix}\n\n{own}\n\n{QUESTION}"))

        async def worker() -> None:
            while not jobs.empty():
                g, k, text = jobs.get_nowait()
                body = merge_request({"model": target.served_name, "messages": [{"role": "user", "content": text}],
                                      "max_tokens": spec.output_tokens, "temperature": 0, "stream": True,
                                      "stream_options": {"include_usage": True}}, target.request)
                t_target = time.perf_counter()
                reply = await api.chat(body, timeout_s=spec.request_timeout_s)
                rec = reply.record
                rec.id, rec.kind, rec.group, rec.in_group = f"{nonce}-g{g}-r{k}", "measured", g, k
                to_run_clock(rec, start, t_target)
                line = rec.to_json()
                folder.request({"point": 0, **line})
                records.append(RequestRecord.from_json(line))
                reporter.stage(f"group {g} request {k}: {rec.status}, cached {rec.cached_tokens}/{rec.prompt_tokens}")

        async with engine_window(target, folder, point) as window:
            start = time.perf_counter()
            try:
                await asyncio.gather(*(worker() for _ in range(spec.concurrency)))
                point["status"] = "ok"
            finally:
                point["load"] = window.load(start)
                folder.update(shared_prefix=place_figures(records))
    _finish_point(folder, point, records, spec)  # type: ignore[arg-type]
    reporter.point_done(spec.label, point)
    if window.death is not None:
        raise ServerDied(f"{window.death} (during the shared-prefix workload, after {len(records)} requests)")
    return point


async def shared_prefix(target: Target, spec: SharedPrefixSpec, *, gate_mode: Optional[bool] = None,
                        gate_spec: Optional[GateSpec] = None, reporter: Optional[Reporter] = None,
                        outcome: Optional[Outcome] = None) -> Outcome:
    """`servedeck bench MODEL --workload shared-prefix`: gate (as bench), then every group, one run folder."""
    outcome = outcome or Outcome(target=target)
    reporter = reporter or QuietReporter()
    ctx = await _served_context(target)
    spec.check(ctx)
    check_output_cap(target.cfg, target.name, spec.output_tokens, "--output-tokens")
    folder, gate_spec_, inherited = _open_run(target, ctx, spec.to_json(), gate_spec or GateSpec(context=0),
                                              gate_mode, outcome, prompt_seed=spec.seed)

    async def work() -> None:
        await _gate_or_inherit(folder, target, gate_mode, gate_spec_, inherited, reporter, outcome)
        point = await run_shared_prefix(spec, target, folder, reporter)
        counts = point["figures"]["counts"]
        _finish(folder, "failed" if counts["error"] else "ok",
                f"requests failed: {counts['error']} of {counts['measured']}" if counts["error"] else None)

    await _guarded(folder, work())
    return outcome


def spec_from_options(*, groups: int, group_size: int, prefix_tokens: int, suffix_tokens: int,
                      output_tokens: Optional[int], concurrency: Optional[list[int]], content: Optional[str],
                      seed: Optional[int], request_timeout_s: Any) -> SharedPrefixSpec:
    """`servedeck bench --workload shared-prefix`' options → a spec checked before anything launches."""
    if concurrency and len(concurrency) > 1:
        raise UsageError(f"--workload shared-prefix runs one point; --concurrency {','.join(map(str, concurrency))} "
                         "gives several", hint="give one value, e.g. --concurrency 1 (a group's first request "
                                               "then finds its prefix cold, the others cached)")
    spec = SharedPrefixSpec(groups=groups, group_size=group_size, prefix_tokens=prefix_tokens,
                            suffix_tokens=suffix_tokens, output_tokens=16 if output_tokens is None else output_tokens,
                            concurrency=concurrency[0] if concurrency else 1,
                            content=content or "prose", seed=seed,  # type: ignore[arg-type]
                            request_timeout_s=600.0 if request_timeout_s == "default" else request_timeout_s)
    spec.check(None)
    return spec
