"""Options and keys several kinds share (one object each, so `servedeck bench --help` says each once), and the
parsing of option text every kind uses: lists of loads, time limits, whole numbers, goodput bounds. Each
refusal names the option and shows how to write it."""

from __future__ import annotations

from enum import Enum
from typing import Any, Optional, Union

from servedeck.errors import UsageError
from servedeck.loadgen import Slo
from servedeck.loadgen.texts import CONTENTS
from servedeck.timeparse import seconds
from servedeck.workloads.shape import Key, Option

# `--content`: what follows each prompt's unique tag (loadgen/texts.py says what each one is)
ContentChoice = Enum("ContentChoice", {c: c for c in CONTENTS}, type=str)  # type: ignore[misc]
CONTENT_HELP = ("what follows each prompt's unique tag: random (common words, cache-free baselines), prose "
                "(Python's documentation topics) or code (the standard library's sources)")

SEED = Option("seed", ("--seed",), Optional[int], None,
              "the same prompts in every launch with the same seed (compare pairs them); on a server that already "
              "saw them they come from the prefix cache")
CONTENT = Option("content", ("--content",), Optional[ContentChoice], None,
                 CONTENT_HELP + "; default random for load points, prose for the kinds that send real text")
REQUEST_TIMEOUT = Option("request_timeout", ("--request-timeout",), Optional[str], None,
                         "per request (a ramp's or a conversation's turn), e.g. 30m, or none (default 10m for "
                         "chat, none for long-prompt and decode)")
STALL_AFTER = Option("stall_after", ("--stall-after",), str, "5m",
                     "no byte for this long: the engine's counters tell stalled (ended, recorded) from slow")
CONCURRENCY = Option("concurrency", ("--concurrency",), Optional[str], None, "closed-loop points, e.g. 1,4,16")
OUTPUT_TOKENS = Option("output_tokens", ("--output-tokens",), Optional[int], None,
                       "answer tokens per request (ignore_eos); each kind's default says its --help line")
TURN_TOKENS = Option("turn_tokens", ("--turn-tokens",), Optional[str], None,
                     "ramp, conversations: text tokens each turn adds (default 2000 for the ramp, 256 for "
                     "conversations); conversations also take a distribution drawn per turn: uniform:128-384, "
                     "normal:256,64, exp:256")
ANSWER_TOKENS = Option("answer_tokens", ("--answer-tokens",), str, "64",
                       "ramp, conversations: room for each answer; conversations also take a distribution, as "
                       "--turn-tokens")
MAX_CONTEXT = Option("max_context", ("--max-context",), Optional[int], None,
                     "ramp, conversations: stop before a conversation passes this (default: the server's context)")

# campaign-file keys of more than one kind (their types must agree wherever they are declared)
TURN_TOKENS_KEY = Key("turn_tokens", Optional[Union[int, str]])  # conversations: a number or a distribution
ANSWER_TOKENS_KEY = Key("answer_tokens", Optional[Union[int, str]])
MAX_CONTEXT_KEY = Key("max_context", Optional[int])


def numbers(text: str, what: str, kind: type = int) -> list[Any]:
    """`1,4,16` → [1, 4, 16]: every value above 0."""
    try:
        vals = [kind(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UsageError(f"{what}: {text!r} is not a comma-separated list of numbers",
                         hint=f"write it like {what} 1,4,16") from None
    if not vals or any(v <= 0 for v in vals):
        raise UsageError(f"{what}: every value must be above 0, got {text!r}", hint=f"write it like {what} 1,4,16")
    return vals


def limit(text: str, what: str) -> Optional[float]:
    """A time limit, or None for `none`/`0`/`off` (no limit)."""
    if text.strip().lower() in ("none", "0", "off"):
        return None
    value = seconds(text, what)
    if value <= 0:
        raise UsageError(f"{what} must be above 0 or none, got {text!r}", hint=f"write it like {what} 30m")
    return value


def whole(text: Any, what: str, hint: str = "") -> int:
    """One whole number of tokens (a distribution is for the conversations)."""
    try:
        return int(text)
    except (TypeError, ValueError):
        raise UsageError(f"{what}: {text!r} is not a whole number of tokens",
                         hint=hint or "one value, e.g. 2000; distributions are for --workload conversations") \
            from None


def request_timeout(o: Any, default: Any = "default") -> Any:
    """--request-timeout as given (a limit or None for `none`), else `default`."""
    return limit(o["request_timeout"], "--request-timeout") if o.get("request_timeout") else default


def goodput_slo(text: Optional[str]) -> Optional[Slo]:
    """--slo ttft=2s,tpot=50ms → the goodput bounds of a load point."""
    if not text:
        return None
    bounds: dict[str, float] = {}
    for part in text.replace(" ", "").split(","):
        key, eq, value = part.partition("=")
        if not eq or key not in ("ttft", "tpot", "e2e"):
            raise UsageError(f"--slo: {part!r} is not ttft=…, tpot=… or e2e=…",
                             hint="write it like ttft=2s,tpot=50ms (with --find: ttft_p95<=2s,tpot_p95<=50ms)")
        bounds[f"{key}_ms"] = seconds(value, f"--slo {key}") * 1000
    return Slo(**bounds)


def as_key(text: str, keys: tuple[str, ...]) -> str:
    """A `servedeck bench` message naming options (`--turn-tokens`) → naming the campaign file's keys
    (`turn_tokens`), for each of `keys`."""
    for k in keys:
        text = text.replace("--" + k.replace("_", "-"), k)
    return text


def entry_rules(build: Any, keys: tuple[str, ...]) -> None:
    """A campaign-file entry's rules are its spec's: build it as `servedeck bench` would, and say a refusal as a
    ValueError naming the keys as the file spells them (pydantic adds the entry's path)."""
    try:
        build()
    except UsageError as e:
        raise ValueError(as_key(e.message, keys)) from None
