"""The built-in exact-answer gate: questions from a local JSONL file, asked greedily, scored here.

One question per line, a JSON object:

    {"id": "add-1", "prompt": "What is 3 + 4? Answer with the number only.", "answer": "7", "match": "number"}
    {"messages": [{"role": "user", "content": "..."}], "answer": "B", "match": "choice"}

    id        optional; default: the line number
    prompt    the user message (or `messages`: a chat, as OpenAI takes it); exactly one of the two
    answer    what a correct reply holds (a string or a number)
    match     how the reply is scored (default exact):
              exact   the reply, trimmed, without a trailing full stop, equals the answer (case ignored)
              number  the reply's last number equals the answer's (commas and a trailing .0 ignored)
              regex   the answer is a regular expression found in the reply
              choice  the letter A–J the reply names ("Answer: B", "(B)", a reply starting "B", else the
                      first standalone capital A–J but the pronoun I) is the answer's letter

Every line is read and checked before any request: a bad file is refused naming the file, the line
and what was expected. A question whose request fails is counted as an error (and as not correct),
never dropped.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass
from pathlib import Path
from time import perf_counter
from typing import Any, Callable, Optional

import httpx

from servedeck.config.schema import merge_request
from servedeck.engines.base import Endpoint
from servedeck.errors import UsageError
from servedeck.gates import samples as S

MATCH_RULES = ("exact", "number", "regex", "choice")
_KEYS = {"id", "prompt", "messages", "answer", "match"}
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?")
# Where a reply names its letter, most explicit first; the pronoun "I" is not a choice.
_CHOICE = [re.compile(r"(?i:answer)\s*(?:is)?\s*[:\-]?\s*\(?([A-J])(?![A-Za-z])"), re.compile(r"\(([A-J])\)"),
           re.compile(r"^\s*([A-J])(?![A-Za-z])"), re.compile(r"(?<![A-Za-z])([A-J])(?![A-Za-z])(?! [a-z])")]


@dataclass(frozen=True)
class Question:
    id: str
    messages: list[dict[str, str]]
    answer: str
    match: str


def _refuse(path: Path, line: int, what: str) -> UsageError:
    return UsageError(f"{path}:{line}: {what}",
                      hint='each line is one JSON object like {"prompt": "What is 3 + 4?", "answer": "7", '
                           '"match": "number"} (match: exact, number, regex or choice)')


def _question(path: Path, n: int, doc: Any) -> Question:
    if not isinstance(doc, dict):
        raise _refuse(path, n, f"expected a JSON object, got {type(doc).__name__}")
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise _refuse(path, n, f"unknown key(s) {', '.join(unknown)}; the keys are {', '.join(sorted(_KEYS))}")
    if ("prompt" in doc) == ("messages" in doc):
        raise _refuse(path, n, "expected exactly one of 'prompt' (a string) or 'messages' (a chat)")
    if "prompt" in doc:
        if not isinstance(doc["prompt"], str) or not doc["prompt"].strip():
            raise _refuse(path, n, "'prompt' must be a non-empty string")
        messages = [{"role": "user", "content": doc["prompt"]}]
    else:
        messages = doc["messages"]
        if not isinstance(messages, list) or not messages or not all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages):
            raise _refuse(path, n, "'messages' must be a non-empty list of {\"role\": ..., \"content\": ...}")
    if "answer" not in doc or isinstance(doc["answer"], (bool, list, dict)) or doc["answer"] is None:
        raise _refuse(path, n, "expected 'answer': a string or a number")
    answer = str(doc["answer"])
    rule = doc.get("match", "exact")
    if rule not in MATCH_RULES:
        raise _refuse(path, n, f"'match' is {rule!r}; expected one of {', '.join(MATCH_RULES)}")
    if rule == "number" and _number(answer) is None:
        raise _refuse(path, n, f"match 'number' needs a numeric answer, got {answer!r}")
    if rule == "regex":
        try:
            re.compile(answer)
        except re.error as e:
            raise _refuse(path, n, f"answer {answer!r} is not a regular expression: {e}") from None
    if rule == "choice" and not re.fullmatch(r"[A-J]", answer.strip()):
        raise _refuse(path, n, f"match 'choice' needs one capital letter A–J as the answer, got {answer!r}")
    qid = doc.get("id", f"line-{n}")
    if not isinstance(qid, (str, int)) or isinstance(qid, bool):
        raise _refuse(path, n, "'id' must be a string or an integer")
    return Question(str(qid), messages, answer, rule)


def load_questions(path: Path, limit: Optional[int] = None) -> list[Question]:
    """Every question of the file (all lines are checked, even past `limit`), then the first `limit`."""
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UsageError(f"{path}: no such question file", hint="give the path of a .jsonl file of questions, one JSON object a line") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UsageError(f"{path}: cannot read it: {e}", hint="a UTF-8 .jsonl file, one question per line") from None
    out: list[Question] = []
    seen: dict[str, int] = {}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            doc = json.loads(line)
        except json.JSONDecodeError as e:
            raise _refuse(path, n, f"not JSON ({e.msg} at column {e.colno})") from None
        q = _question(path, n, doc)
        if q.id in seen:
            raise _refuse(path, n, f"id {q.id!r} is already used on line {seen[q.id]} (ids must be unique)")
        seen[q.id] = n
        out.append(q)
    if not out:
        raise UsageError(f"{path}: no questions in it", hint='one JSON object a line, like {"prompt": "What is 3 + 4?", "answer": "7", "match": "number"}')
    return out[:limit] if limit else out


def _number(text: str) -> Optional[float]:
    found = _NUMBER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def _plain(text: str) -> str:
    return " ".join(text.strip().rstrip(".").strip().strip("\"'`").split()).casefold()


def is_correct(rule: str, expected: str, reply: str) -> bool:
    """Whether `reply` holds `expected` by `rule` (pure)."""
    if rule == "exact":
        return _plain(reply) == _plain(expected)
    if rule == "number":
        got, want = _number(reply), _number(expected)
        return got is not None and want is not None and got == want
    if rule == "regex":
        return re.search(expected, reply) is not None
    if rule == "choice":
        for pattern in _CHOICE:
            m = pattern.search(reply)
            if m:
                return m.group(1) == expected.strip()
        return False
    raise ValueError(f"unknown match rule {rule!r}")


@dataclass(frozen=True)
class ExactGate:
    """`--eval PATH.jsonl`: the share of questions answered correctly must be at least `threshold`."""

    path: Path
    threshold: float
    limit: Optional[int] = None
    concurrency: int = 8
    answer_tokens: int = 32
    timeout_s: float = 600.0  # one question
    name: str = "eval"
    kind: str = "exact"
    file: str = S.FILE
    every_replica: bool = False  # a campaign asks the first replica: the answers are the configuration's

    def fitted(self, served: int, max_output_tokens: Optional[int], model: str) -> "ExactGate":
        return self  # asks the same whatever the server serves

    def check(self, engine: Optional[str] = None) -> list[Question]:
        """Every option and every line of the file, before any launch; the questions it will ask."""
        S.check_threshold(self.threshold)
        if self.limit is not None and self.limit < 1:
            raise UsageError(f"--limit must be at least 1, got {self.limit}", hint="or leave it out to ask every question")
        if self.concurrency < 1:
            raise UsageError(f"--concurrency must be at least 1, got {self.concurrency}", hint="e.g. --concurrency 8")
        if self.answer_tokens < 1:
            raise UsageError(f"--answer-tokens must be at least 1, got {self.answer_tokens}")
        return load_questions(self.path, self.limit)

    def spec_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "path": str(self.path), "limit": self.limit, "threshold": self.threshold,
                "concurrency": self.concurrency, "answer_tokens": self.answer_tokens, "temperature": 0}

    async def run(self, server: Endpoint, folder: Path, record: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
        """Ask every question (`concurrency` at a time), `record` each scored line as it finishes; the tally."""
        questions = self.check(server.engine)
        gate = asyncio.Semaphore(self.concurrency)
        lines: list[dict[str, Any]] = []
        limits = httpx.Limits(max_connections=self.concurrency, max_keepalive_connections=self.concurrency)
        async with httpx.AsyncClient(limits=limits) as client:
            async def one(q: Question) -> None:
                async with gate:
                    reply = await _ask(client, server, q.messages, self.answer_tokens, self.timeout_s)
                err = reply.get("error")
                answer = reply.get("answer") or ""
                line = S.sample_line(q.id, q.messages, q.answer, answer, err is None and is_correct(
                    q.match, q.answer, answer), match=q.match, latency_s=reply["latency_s"], error=err)
                lines.append(line)
                record(line)
            await asyncio.gather(*(one(q) for q in questions))
        return S.tally(lines, self.threshold)


async def _ask(client: httpx.AsyncClient, server: Endpoint, messages: list[dict[str, str]], max_tokens: int,
               timeout_s: float) -> dict[str, Any]:
    """One greedy chat request. Never raises for a server-side failure: the error comes back in the dict."""
    body = merge_request({"model": server.served_name, "messages": messages, "max_tokens": max_tokens,
                          "temperature": 0, "stream": False}, server.request)
    t0 = perf_counter()
    try:
        r = await client.post(server.base_url.rstrip("/") + "/v1/chat/completions", json=body, timeout=timeout_s)
    except httpx.HTTPError as e:
        return {"latency_s": perf_counter() - t0, "error": f"{type(e).__name__}: {e}".rstrip(": ")}
    latency = perf_counter() - t0
    if r.status_code != 200:
        return {"latency_s": latency, "error": f"HTTP {r.status_code}: {r.text[:300]}"}
    try:
        msg = r.json()["choices"][0]["message"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        return {"latency_s": latency, "error": f"malformed answer ({type(e).__name__} {e}): {r.text[:200]}"}
    return {"latency_s": latency, "answer": msg.get("content") or msg.get("reasoning_content") or ""}
