"""Identical output: a fixed, seeded prompt set answered greedily, saved, and compared across launches.

Speculative decoding must not change greedy output; a different build, quantization or model may.
Each launch answers the same 8 prompts (4 prose, 4 code, from texts.py at fixed places) at
temperature 0 with 128 tokens of room; `outputs.jsonl` in the run folder keeps every answer with
its token ids where the engine gives them (the adapter says how: logprobs ids on llama.cpp,
`return_tokens_as_token_ids` on vLLM), else its text. `compare` pairs two such files prompt by
prompt and says identical, or where the first difference is and how each side goes on from there.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Any, Callable, Optional

from servedeck.config.schema import merge_request
from servedeck.engines import get_engine
from servedeck.errors import RunError, ServedeckError, ServerDied
from servedeck.fsio import read_jsonl
from servedeck.loadgen import texts
from servedeck.loadgen.api import ApiClient
from servedeck.runs.folder import RunFolder
from servedeck.workloads.reporter import Reporter
from servedeck.workloads.target import Target

PROMPT_SEED = 20240610  # fixed: every launch, every host answers the same prompts
N_PROMPTS = 8
MAX_TOKENS = 128
EXCERPT_CHARS = 1200
FILE = "outputs.jsonl"


def prompts(n: int = N_PROMPTS) -> list[dict[str, Any]]:
    """The fixed prompt set: prose and code continuations alternating (the first n of the same list everywhere)."""
    rng = random.Random(PROMPT_SEED)
    out = []
    for i in range(n):
        content = "prose" if i % 2 == 0 else "code"
        excerpt = texts.piece(content, texts.start_of(content, rng), EXCERPT_CHARS)
        ask = ("Continue the following text exactly where it stops." if content == "prose"
               else "Continue the following Python source exactly where it stops.")
        text = f"{ask}\n\n{excerpt}"
        out.append({"index": i, "content": content, "prompt": text,
                    "prompt_sha": hashlib.sha256(text.encode()).hexdigest()[:16]})
    return out


async def collect(base_url: str, served_name: str, engine: str, request: dict[str, Any],
                  on_answer: Callable[[dict[str, Any]], None], timeout_s: float = 600.0, n: int = N_PROMPTS,
                  max_tokens: int = MAX_TOKENS) -> list[dict[str, Any]]:
    """Ask every prompt once, in order, greedily; `on_answer` gets each line as it finishes."""
    adapter = get_engine(engine)
    lines = []
    async with ApiClient(base_url) as api:
        for p in prompts(n):
            body = merge_request({"model": served_name, "messages": [{"role": "user", "content": p["prompt"]}],
                                  "max_tokens": max_tokens, "temperature": 0, "stream": False}, request)
            body = merge_request(body, dict(adapter.output_tokens_request))
            line: dict[str, Any] = {"index": p["index"], "content": p["content"], "prompt_sha": p["prompt_sha"]}
            try:
                r = await api.chat(body, timeout_s=timeout_s)
                if r.http_error:
                    raise RunError(r.http_error)
                if not r.ok:
                    raise RunError(r.error or "no answer")
                doc = r.doc
                msg = doc["choices"][0]["message"]
            except (ValueError, KeyError, IndexError, TypeError, RunError) as e:
                line["error"] = f"{type(e).__name__}: {e}"[:300]
            else:
                ids = adapter.output_token_ids(doc)
                line.update(text=msg.get("content") or "", token_ids=ids, tokens=adapter.logprob_tokens(doc),
                            finish_reason=doc["choices"][0].get("finish_reason"),
                            completion_tokens=(doc.get("usage") or {}).get("completion_tokens"))
            lines.append(line)
            on_answer(line)
    return lines


def read(run: Path) -> list[dict[str, Any]]:
    path = run / FILE
    if not path.exists():
        raise ServedeckError(f"{run.name} has no {FILE}",
                             hint="answer the output-check prompts with `servedeck bench MODEL --check-outputs …`")
    return read_jsonl(path)


def _first_diff(a: list[Any], b: list[Any]) -> Optional[int]:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def compare_one(a: dict[str, Any], b: dict[str, Any], show: int = 16) -> dict[str, Any]:
    """One prompt's two answers: identical, or the first diverging position and both continuations."""
    out: dict[str, Any] = {"index": a.get("index"), "content": a.get("content")}
    if a.get("prompt_sha") != b.get("prompt_sha"):
        return {**out, "verdict": "not comparable", "why": "the two runs were asked different prompts"}
    if a.get("error") or b.get("error"):
        return {**out, "verdict": "not comparable",
                "why": f"a request failed: {a.get('error') or b.get('error')}"}
    ids_a, ids_b = a.get("token_ids"), b.get("token_ids")
    if ids_a is not None and ids_b is not None:
        out["unit"] = "token"
        pos = _first_diff(ids_a, ids_b)
        if pos is None:
            return {**out, "verdict": "identical", "length": len(ids_a)}
        toks_a, toks_b = a.get("tokens"), b.get("tokens")

        def cont(toks: Optional[list[str]], ids: list[int]) -> Any:
            return "".join(toks[pos:pos + show]) if toks and len(toks) == len(ids) else ids[pos:pos + show]

        before = "".join(toks_a[max(0, pos - show):pos]) if toks_a and len(toks_a) == len(ids_a) else None
        return {**out, "verdict": "differs", "position": pos, "before": before,
                "a": cont(toks_a, ids_a), "b": cont(toks_b, ids_b)}
    out["unit"] = "character"  # an engine that gives no token ids: compare the text
    ta, tb = a.get("text") or "", b.get("text") or ""
    pos = _first_diff(list(ta), list(tb))
    if pos is None:
        return {**out, "verdict": "identical", "length": len(ta)}
    return {**out, "verdict": "differs", "position": pos, "before": ta[max(0, pos - 60):pos],
            "a": ta[pos:pos + 80], "b": tb[pos:pos + 80]}


def compare(a: list[dict[str, Any]], b: list[dict[str, Any]]) -> dict[str, Any]:
    """Two runs' outputs.jsonl, prompt by prompt. verdict: identical | differs | not comparable."""
    by_b = {line.get("index"): line for line in b}
    rows = [compare_one(line, by_b[line.get("index")]) if line.get("index") in by_b else
            {"index": line.get("index"), "verdict": "not comparable", "why": "missing from the second run"}
            for line in a]
    verdicts = {r["verdict"] for r in rows}
    verdict = "identical" if verdicts == {"identical"} and len(a) == len(b) else \
        "differs" if "differs" in verdicts else "not comparable"
    return {"verdict": verdict, "prompts": len(rows), "identical": sum(r["verdict"] == "identical" for r in rows),
            "rows": rows}


def compare_runs(run_a: Path, run_b: Path) -> dict[str, Any]:
    """compare() on two run folders: what campaign and report code call (issue 10's reference check)."""
    return {"a": run_a.name, "b": run_b.name, **compare(read(run_a), read(run_b))}


async def check(folder: RunFolder, target: Target, reporter: Reporter, n: int, max_tokens: int) -> None:
    """A run's output check: the fixed greedy prompt set into its outputs.jsonl, before any load (`bench
    --check-outputs`; a campaign's first workload when it names a `reference`)."""
    reporter.stage(f"output check: {n} fixed prompts, temperature 0, {max_tokens} tokens")
    folder.update(outputs={"status": "running", "file": FILE})
    lines = await collect(target.base_url, target.served_name, target.engine, target.request,
                                  lambda line: folder.append_jsonl(FILE, line), n=n, max_tokens=max_tokens)
    errors = [ln["error"] for ln in lines if ln.get("error")]
    death = target.death()
    if death:
        raise ServerDied(f"{death} (during the output check)")
    folder.update(outputs={"status": "failed" if errors else "ok", "file": FILE, "prompts": len(lines),
                           "errors": len(errors), "first_error": errors[0] if errors else None,
                           "unit": "token" if all(ln.get("token_ids") is not None for ln in lines if not ln.get("error"))
                           else "character", "seed": PROMPT_SEED, "max_tokens": max_tokens})
