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
from typing import Any, ClassVar, Optional

from servedeck.config.schema import merge_request
from servedeck.errors import ServerDied, UsageError
from servedeck.gates.server import ServerTokens
from servedeck.loadgen import texts
from servedeck.loadgen.api import ApiClient
from servedeck.loadgen.prompts import _tag, new_nonce, seeded_nonce
from servedeck.loadgen.records import RequestRecord
from servedeck.loadgen.texts import Content
from servedeck.runs.folder import RunFolder
from servedeck.runs.turns import place_figures
from servedeck.workloads import options as O
from servedeck.workloads.conversations import QUESTION
from servedeck.workloads.points import finish_point, put_point
from servedeck.workloads.reporter import Reporter
from servedeck.workloads.shape import Key, Kind, Option
from servedeck.workloads.target import Target
from servedeck.workloads.window import calibrate, engine_window, keep


@dataclass(frozen=True)
class SharedPrefixSpec:
    kind: ClassVar[str] = "shared-prefix"
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
    put_point(folder, point)
    records: list[RequestRecord] = []
    async with ApiClient(target.base_url) as api:
        tokens = ServerTokens(api, target.served_name, target.engine)
        reporter.stage("shared-prefix: sizing prompts with the server's tokenizer")
        cpt = await calibrate(tokens, spec.content, texts.start_of(spec.content, rng), spec.prefix_tokens)
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
                keep(folder, records, rec, start, t_target)
                reporter.stage(f"group {g} request {k}: {rec.status}, cached {rec.cached_tokens}/{rec.prompt_tokens}")

        async with engine_window(target, folder, point) as window:
            start = time.perf_counter()
            try:
                await asyncio.gather(*(worker() for _ in range(spec.concurrency)))
                point["status"] = "ok"
            finally:
                point["load"] = window.load(start)
                folder.update(shared_prefix=place_figures(records))
    finish_point(folder, point, records, spec.to_json())
    reporter.point_done(spec.label, point)
    if window.death is not None:
        raise ServerDied(f"{window.death} (during the shared-prefix workload, after {len(records)} requests)")
    return point


def fitted(spec: SharedPrefixSpec, target: Target, ctx: int) -> SharedPrefixSpec:
    spec.check(ctx)
    target.check_output_cap(spec.output_tokens, "--output-tokens")
    return spec


async def run(spec: SharedPrefixSpec, target: Target, ctx: int, folder: RunFolder, reporter: Reporter
              ) -> Optional[str]:
    point = await run_shared_prefix(spec, target, folder, reporter)
    counts = point["figures"]["counts"]
    return f"requests failed: {counts['error']} of {counts['measured']}" if counts["error"] else None


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


# --- the shared prefix as a kind: options, keys, figures --------------------------------------------

OPTIONS = (
    Option("groups", ("--groups",), int, 4, "shared-prefix: groups of requests, each its own prefix"),
    Option("group_size", ("--group-size",), int, 4, "shared-prefix: requests per group"),
    Option("prefix_tokens", ("--prefix-tokens",), int, 1024, "shared-prefix: tokens the requests of a group share"),
    Option("suffix_tokens", ("--suffix-tokens",), int, 64, "shared-prefix: each request's own tokens after the prefix"),
    O.OUTPUT_TOKENS, O.CONCURRENCY, O.CONTENT, O.SEED, O.REQUEST_TIMEOUT,
)
SHARED_PREFIX_KEYS = ("groups", "group_size", "prefix_tokens", "suffix_tokens")
KEYS = tuple(Key(k, Optional[int]) for k in SHARED_PREFIX_KEYS)


def from_options(o: Any) -> SharedPrefixSpec:
    return spec_from_options(
        groups=o.get("groups", 4), group_size=o.get("group_size", 4), prefix_tokens=o.get("prefix_tokens", 1024),
        suffix_tokens=o.get("suffix_tokens", 64), output_tokens=o.get("output_tokens"),
        concurrency=O.numbers(o["concurrency"], "--concurrency") if o.get("concurrency") else None,
        content=o.get("content"), seed=o.get("seed"), request_timeout_s=O.request_timeout(o))


def shared_prefix_spec(w: Any) -> SharedPrefixSpec:
    """A kind = "shared-prefix" entry → the SharedPrefixSpec `servedeck bench` would run, same defaults."""
    d = SharedPrefixSpec()
    return spec_from_options(groups=d.groups if w.groups is None else w.groups,
                             group_size=d.group_size if w.group_size is None else w.group_size,
                             prefix_tokens=d.prefix_tokens if w.prefix_tokens is None else w.prefix_tokens,
                             suffix_tokens=d.suffix_tokens if w.suffix_tokens is None else w.suffix_tokens,
                             output_tokens=w.output_tokens, concurrency=w.concurrency, content=None, seed=w.seed,
                             request_timeout_s="default")


def check_entry(w: Any) -> None:
    if w.rate:
        raise ValueError("a shared-prefix workload runs closed loop: drop rate (concurrency = [1])")
    O.entry_rules(lambda: shared_prefix_spec(w), SHARED_PREFIX_KEYS + ("output_tokens", "concurrency"))


def view(path: Any, v: dict[str, Any], records: list[RequestRecord]) -> dict[str, Any]:
    """The first request of each group apart from the rest, rebuilt from requests.jsonl."""
    if not isinstance(v.get("shared_prefix"), dict):
        return {}
    return {"shared_prefix": {**v["shared_prefix"], **place_figures(records)}}


def describe(w: dict[str, Any]) -> str:
    return (f"workload **shared-prefix** ({w.get('content')}): {w.get('groups')} groups of {w.get('group_size')} "
            f"requests, each group sharing a prefix of {w.get('prefix_tokens')} tokens, each request {w.get('suffix_tokens')} "
            f"tokens of its own, output {w.get('output_tokens')} tokens, {w.get('concurrency')} at a time.")


KIND = Kind(
    name="shared-prefix", help="--groups of --group-size requests sharing --prefix-tokens",
    options=OPTIONS, from_options=from_options,
    keys=KEYS, check_entry=check_entry, from_entry=lambda w, where: [shared_prefix_spec(w)],
    fitted=fitted, run=run,
    view=view, describe=describe,
)
