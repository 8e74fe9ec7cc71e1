"""The seed's correctness gate: find a planted access code in a prompt the size of the context.

For each repeat (`key`) and depth, one probe: its own haystack (own seed, own code), sized with
the server's tokenizer so the whole chat request (template included) is the context minus room
for the answer; asked at temperature 0; scored by substring match. Score = share of probes found.
Pass when the score, rounded to two decimals as printed on the `GATE niah score=` line, is at
least the threshold: with three probes and the seed's 0.67, two of three pass.

A probe that fails (HTTP error, timeout, server gone) is a probe not found: it is logged with its
error and counted, never dropped.

`NeedleGate` is this check as one gate kind among the others (gates/kinds.py): the same shape as the
accuracy gates (`check`, `spec_json`, `run` writing one sample line per probe), its record niah.log
(the seed's fields first, then `id` = repeat/depth, `prompt_digest`, `expected` = the code, `correct`),
read back by `view` (a run folder written before the kinds existed reads the same way: niah.log lines
without the sample fields are still probes).
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from time import perf_counter
from typing import Any, Awaitable, Callable, Mapping, Optional, Sequence

from servedeck.config.schema import merge_request
from servedeck.engines.base import Endpoint
from servedeck.engines.metrics import prefix_counters_async
from servedeck.errors import RunError, ServedeckError, UsageError
from servedeck.gates import haystack
from servedeck.gates.samples import prompt_digest
from servedeck.gates.server import ServerTokens
from servedeck.loadgen.api import ApiClient

LOG = "niah.log"

Counters = Callable[[], Awaitable[Optional[dict[str, float]]]]


@dataclass(frozen=True)
class GateSpec:
    context: int  # tokens one probe fills: template + haystack + question + answer room
    depths: tuple[float, ...] = (0.1, 0.5, 0.9)
    repeats: int = 1
    threshold: float = 0.67
    answer_tokens: int = 32  # room left for the answer; also the request's max_tokens
    seed: Optional[int] = None  # None: fresh randomness (a gate should not replay old prompts)
    timeout_s: float = 3600.0  # one probe; a long prompt on a CPU takes minutes

    def check(self) -> None:
        if not self.depths or any(not 0.0 <= d <= 1.0 for d in self.depths):
            raise UsageError(f"--depths: each depth must be between 0 and 1, got {list(self.depths)}",
                             hint="write them like 0.1,0.5,0.9")
        if self.repeats < 1:
            raise UsageError(f"--repeats must be at least 1, got {self.repeats}",
                             hint="each repeat adds one probe per depth, e.g. --repeats 3")
        if not 0.0 <= self.threshold <= 1.0:
            raise UsageError(f"--threshold must be between 0 and 1, got {self.threshold}",
                             hint="the seed's publication threshold is 0.67 (two of three probes)")
        if self.answer_tokens < 1:
            raise UsageError(f"--answer-tokens must be at least 1, got {self.answer_tokens}",
                             hint="the gate's answer room; a reasoning model needs more (or a models.toml "
                                  "`request` table turning thinking off)")
        if self.context < self.answer_tokens + 128:
            raise UsageError(f"--context {self.context} leaves no room for a haystack",
                             hint=f"use at least {self.answer_tokens + 128} tokens")


@dataclass
class ProbeResult:
    key: int
    depth: float
    prompt_tokens: Optional[int]  # as the server reported it (usage); the sized count if it did not say
    ok: bool
    latency_s: Optional[float]
    answer: str
    cached_tokens: Optional[int]
    code: str
    seed: int
    sized_tokens: int  # what the server's /tokenize counted before sending
    error: Optional[str] = None
    prompt_digest: Optional[str] = None  # of the chat sent (gates/samples.py), as every gate's samples carry

    def log_line(self) -> dict[str, Any]:
        """The niah.log line: the seed's fields first, then what makes a probe reproducible, then the
        sample fields every gate kind writes (id, prompt_digest, expected, correct)."""
        d = {"key": self.key, "depth": self.depth, "prompt_tokens": self.prompt_tokens, "ok": self.ok,
             "latency_s": self.latency_s, "answer": self.answer, "cached_tokens": self.cached_tokens,
             "code": self.code, "seed": self.seed, "sized_tokens": self.sized_tokens}
        if self.error:
            d["error"] = self.error
        d.update({"id": f"{self.key}/{self.depth}", "prompt_digest": self.prompt_digest, "expected": self.code,
                  "correct": self.ok})
        return d

    @classmethod
    def from_line(cls, line: Mapping[str, Any]) -> "ProbeResult":
        return cls(**{k: line.get(k) for k in cls.__dataclass_fields__})


@dataclass
class GateResult:
    score: float
    found: int
    probes: int
    errors: int
    threshold: float
    passed: bool
    context: int
    depths: list[float]
    repeats: int
    prompt_tokens: list[int] = field(default_factory=list)  # min, max reported
    cached_tokens: int = 0
    name: str = "niah"

    @property
    def line(self) -> str:
        return f"GATE {self.name} score= {round(self.score, 2)}"

    @property
    def verdict(self) -> str:
        return "passed" if self.passed else "failed"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "GateResult":
        return cls(**{k: v for k, v in d.items() if k in cls.__dataclass_fields__})


def tally(probes: Sequence[Mapping[str, Any]], threshold: float) -> dict[str, Any]:
    """The verdict from probe lines (niah.log's dicts), pure: the one scoring rule, used when a gate
    finishes and whenever a run folder is read back."""
    found = sum(bool(p.get("ok")) for p in probes)
    n = len(probes)
    s = found / n if n else 0.0
    toks = [p["prompt_tokens"] for p in probes if isinstance(p.get("prompt_tokens"), int) and p["prompt_tokens"] > 0]
    return {"score": s, "found": found, "probes": n, "errors": sum(bool(p.get("error")) for p in probes),
            "threshold": threshold, "passed": n > 0 and round(s, 2) >= threshold,
            "prompt_tokens": [min(toks), max(toks)] if toks else [],
            "cached_tokens": sum(p.get("cached_tokens") or 0 for p in probes)}


def score(results: list[ProbeResult], spec: GateSpec) -> GateResult:
    """The gate's verdict from its probes (pure)."""
    return GateResult(**tally([r.log_line() for r in results], spec.threshold), context=spec.context,
                      depths=list(spec.depths), repeats=spec.repeats)


def read_log(text: str) -> tuple[list[dict[str, Any]], Optional[float]]:
    """niah.log back into probe lines and the printed score (None when no GATE line was written)."""
    probes, printed = [], None
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("GATE "):
            try:
                printed = float(line.split("score=", 1)[1])
            except (IndexError, ValueError):
                pass
        elif line.startswith("{"):
            try:
                probes.append(json.loads(line))
            except json.JSONDecodeError:
                continue  # a torn last line after a crash
    return probes, printed


async def size_prompt(tokens: ServerTokens, target: int, seed: int, depth: float, code: str) -> tuple[str, int]:
    """The longest haystack whose chat request is at most `target` tokens, by the server's count.

    Filler is nearly additive in tokens, so a straight-line estimate from two counts lands within a
    sentence or two; a few corrections then find the last whole sentence that fits.
    """
    async def count(n: int) -> int:
        return await tokens.count_chat([{"role": "user", "content": haystack.build(seed, n, depth, code)}])

    small, big = 8, 128
    c_small, c_big = await count(small), await count(big)
    per = max((c_big - c_small) / (big - small), 1.0)
    if c_small > target:
        raise RunError(f"a prompt of {target} tokens cannot even hold the question ({c_small} tokens)",
                       hint="raise --context")
    n = max(small, int((target - c_small) / per) + small)
    best: tuple[int, int] = (small, c_small)
    for _ in range(24):
        c = await count(n)
        if c <= target:
            if c > best[1] or n > best[0]:
                best = (n, c)
            if target - c < per:  # one more sentence would not fit (or just barely)
                nxt = await count(n + 1)
                if nxt <= target:
                    best = (n + 1, nxt)
                break
            n += max(1, int((target - c) / per))
        else:
            n -= max(1, math.ceil((c - target) / per))
    n, c = best
    return haystack.build(seed, n, depth, code), c


async def ask(client: ApiClient, server: Endpoint, text: str, answer_tokens: int,
              timeout_s: float) -> dict[str, Any]:
    """One probe request. Never raises for a server-side failure: the error comes back in the dict."""
    body = merge_request({"model": server.served_name, "messages": [{"role": "user", "content": text}],
                          "max_tokens": answer_tokens, "temperature": 0, "stream": False}, server.request)
    t0 = perf_counter()
    r = await client.chat(body, timeout_s=timeout_s)
    latency = perf_counter() - t0
    if r.http_error or not r.ok:  # an error status; or no answer, or one cut off
        return {"latency_s": latency, "error": r.http_error or r.error or "no answer"}
    try:
        doc = r.doc
        msg = doc["choices"][0]["message"]
    except (KeyError, IndexError, TypeError) as e:
        return {"latency_s": latency, "error": f"malformed answer ({type(e).__name__} {e}): {r.body[:200]}"}
    # A reasoning model may put everything in reasoning_content when the answer room runs out.
    answer = msg.get("content") or msg.get("reasoning_content") or msg.get("reasoning") or ""
    return {"latency_s": latency, "answer": answer, "usage": doc.get("usage") or {}, "timings": doc.get("timings")}


def _cached(reply: dict[str, Any]) -> Optional[int]:
    details = (reply.get("usage") or {}).get("prompt_tokens_details") or {}
    if isinstance(details.get("cached_tokens"), int):
        return details["cached_tokens"]
    timings = reply.get("timings") or {}
    return timings.get("cache_n") if isinstance(timings.get("cache_n"), int) else None


async def run_gate(server: Endpoint, spec: GateSpec, on_probe: Callable[[ProbeResult], None],
                   counters: Optional[Counters] = None) -> GateResult:
    """Probe every (repeat, depth), in order, one at a time; call `on_probe` as each finishes.

    `counters` (optional) reads the engine's prefix-cache hit counter; probes run one at a time,
    so the counter's change across a probe is that probe's cached tokens, for engines that do not
    report it per request (vLLM without --enable-prompt-tokens-details).
    """
    spec.check()
    rng = random.Random(spec.seed)
    target = spec.context - spec.answer_tokens
    results: list[ProbeResult] = []
    async with ApiClient(server.base_url) as client:
        tokens = ServerTokens(client, server.served_name, server.engine)
        for key in range(spec.repeats):
            for depth in spec.depths:
                seed, code = rng.getrandbits(48), haystack.new_code(rng)
                text, sized = await size_prompt(tokens, target, seed, depth, code)
                digest = prompt_digest([{"role": "user", "content": text}])
                before = await counters() if counters else None
                reply = await ask(client, server, text, spec.answer_tokens, spec.timeout_s)
                cached = _cached(reply)
                if cached is None and before is not None and counters is not None:
                    after = await counters()
                    if after is not None and "hits" in after and "hits" in before:
                        cached = int(after["hits"] - before["hits"])
                err = reply.get("error")
                answer = (reply.get("answer") or "").strip()
                usage = reply.get("usage") or {}
                res = ProbeResult(
                    key=key, depth=depth,
                    prompt_tokens=usage.get("prompt_tokens") if isinstance(usage.get("prompt_tokens"), int) else sized,
                    ok=err is None and code in answer,
                    latency_s=round(reply["latency_s"], 3),
                    answer=f"ERROR {err}"[:300] if err else answer[:200],
                    cached_tokens=cached, code=code, seed=seed, sized_tokens=sized, error=err,
                    prompt_digest=digest)
                results.append(res)
                on_probe(res)
    return score(results, spec)


@dataclass(frozen=True)
class NeedleGate:
    """The needle as a gate kind (gates/kinds.py): `servedeck gate MODEL`, a campaign's `gate.niah`, and the
    gate a bench runs first. `spec.context` 0: what the server serves per request (`fitted`)."""

    spec: GateSpec
    name: str = "niah"  # its name among a run's gates (its summary.json entry: `gate`, gates/kinds.py)
    kind: str = "niah"
    file: str = LOG
    every_replica: bool = True  # each replica is a launch of its own, whose whole context is checked

    @property
    def threshold(self) -> float:
        return self.spec.threshold

    def check(self, engine: Optional[str] = None) -> int:
        """Every option, before any launch (a context of 0 is settled by `fitted`); the probes it will ask."""
        self.spec.check() if self.spec.context else replace(self.spec, context=self.spec.answer_tokens + 128).check()
        return len(self.spec.depths) * self.spec.repeats

    def fitted(self, served: int, max_output_tokens: Optional[int], model: str) -> "NeedleGate":
        """Sized to the running server: its context where none was asked (above it is refused), the answer
        room capped by the model's max_output_tokens."""
        asked = self.spec.context or served
        if asked > served:
            raise ServedeckError(
                f"--context {asked} is above what {model} serves per request ({served} tokens)",
                hint=f"restart it with a larger context (models.{model}.context), or gate at --context {served}")
        spec = replace(self.spec, context=asked)
        if max_output_tokens and spec.answer_tokens > max_output_tokens:  # servedeck asks for no more than that
            spec = replace(spec, answer_tokens=max_output_tokens)
        spec.check()
        return replace(self, spec=spec)

    def spec_json(self) -> dict[str, Any]:
        return {"context": self.spec.context, "depths": list(self.spec.depths), "repeats": self.spec.repeats,
                "threshold": self.spec.threshold, "answer_tokens": self.spec.answer_tokens}

    async def run(self, server: Endpoint, folder: Path, record: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Every probe, one at a time, `record`ed as it finishes; then the `GATE niah score=` line (the seed's
        format: a niah.log without it is a gate that never finished)."""
        async def hits() -> Optional[dict[str, float]]:
            return await prefix_counters_async(server.engine, server.base_url)

        result = await run_gate(server, self.spec, lambda res: record(res.log_line()), counters=hits)
        with open(folder / self.file, "a") as fh:
            fh.write(result.line + "\n")
        return result.to_json()


def view(path: Path, rec: Mapping[str, Any]) -> dict[str, Any]:
    """The needle of a run as niah.log tells it: passed | failed | incomplete | not run. `rec` is its entry in
    summary.json (`gate`). A cited needle's
    niah.log is copied into the citing run, so the file is always read here."""
    log = path / LOG
    if not log.exists():
        return {"status": "not run", **{k: v for k, v in rec.items() if k in ("source", "note")}}
    probes, printed = read_log(log.read_text())
    result = dict(rec.get("result") or {})
    result.update(tally(probes, result.get("threshold", (rec.get("spec") or {}).get("threshold", 0.67))))
    # probes logged but no GATE line: the run stopped before the gate finished
    status = "incomplete" if printed is None else "passed" if result["passed"] else "failed"
    return {"status": status, "result": result, "probes": probes, "printed_score": printed,
            "source": rec.get("source", "this run"), "note": rec.get("note"), "kind": "niah",
            **{k: rec[k] for k in ("spec", "wall_s") if rec.get(k) is not None}}
