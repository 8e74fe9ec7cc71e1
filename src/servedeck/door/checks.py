"""What the door checks in a request body before it forwards it: the numbers an engine would take on
trust, and what is quoted back of what a client sent.

Engines do not all check what they are sent: llama-server took `max_tokens = 2**63` and answered one
token (it wrapped), and `10**12` gave its own overflowing message ("got -727379968"). The door refuses
such a value with a 400 that names the field and its limit, before any engine is started for it.
The limits (docs/door.md, "Limits"):

    max_tokens, max_completion_tokens   1 .. the model's context (models.toml `context`; 2**31 - 1 when unset)
    min_tokens                          0 .. the same
    n, best_of                          1 .. N_MAX (OpenAI's own bound for n)
    logprobs (a number), top_logprobs   0 .. LOGPROBS_MAX (OpenAI's)
    seed                                a signed 64-bit integer

A field that is absent or null is not checked; one that is there must be an integer (true and 2.0 are
not). Anything else is the engine's to judge.
"""

from __future__ import annotations

import json
import sys
from functools import lru_cache
from typing import Any

import msgspec

INT32_MAX = 2**31 - 1
N_MAX = 128
LOGPROBS_MAX = 20
QUOTE_CHARS = 80  # at most this many characters of what a client sent are quoted back in an error


def quoted(text: str | bytes, limit: int = QUOTE_CHARS) -> str:
    """`text` for an error message: repr'd, at most `limit` characters of it, and its length when cut
    (a 1 MiB model name was echoed whole in the 404, issue 48)."""
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text):,} characters)"


def cut(text: str | bytes, limit: int = QUOTE_CHARS) -> str:
    """`text` as is when short, else its first `limit` characters and its length (a path, a method)."""
    if isinstance(text, bytes):
        text = text.decode("latin-1")
    return text if len(text) <= limit else f"{text[:limit]}… ({len(text):,} characters)"


@lru_cache(maxsize=256)
def limits(context: int | None, completions: bool = False) -> dict[str, tuple[int, int, str]]:
    """Field → (least, most, what the most is), for a model of `context` tokens (None: not stated)."""
    top = context or INT32_MAX
    said = f"the model's context ({context:,} tokens)" if context else f"{INT32_MAX:,}"
    out = {"max_tokens": (1, top, said), "max_completion_tokens": (1, top, said), "min_tokens": (0, top, said),
           "n": (1, N_MAX, f"{N_MAX}"), "best_of": (1, N_MAX, f"{N_MAX}"),
           "top_logprobs": (0, LOGPROBS_MAX, f"{LOGPROBS_MAX}"),
           "seed": (-(2**63), 2**63 - 1, "a signed 64-bit integer")}
    if completions:
        out["logprobs"] = (0, LOGPROBS_MAX, f"{LOGPROBS_MAX}")
    return out


def bad_number(doc: Any, context: int | None, completions: bool = False) -> tuple[str, str] | None:
    """(field, what is wrong with it and its limit) for the first number of `doc` out of its limits; None
    when all are within them. `completions`: /v1/completions, where `logprobs` is a number (in chat it
    is true or false)."""
    if not isinstance(doc, dict):
        return None
    for field, (least, most, said) in limits(context, completions).items():
        v = doc.get(field)
        if v is None:
            continue
        if isinstance(v, bool) or not isinstance(v, int):
            return field, f"\"{field}\" must be an integer from {least:,} to {said}, not {quoted(str(v), 40)}"
        if v < least or v > most:
            shown = f"{v:,}" if abs(v) < 10**30 else f"a {len(str(abs(v)))}-digit number"
            return field, f"\"{field}\" is {shown}: it must be from {least:,} to {said}"
    return None


def unreadable(e: ValueError) -> str:
    """What json.loads could not read of a body, in words: the bytes that are not UTF-8, the number with
    too many digits, or where the JSON goes wrong (an invalid body got "names no model" before)."""
    if isinstance(e, UnicodeDecodeError):
        return f"the body is not UTF-8 text: byte 0x{e.object[e.start]:02x} at offset {e.start:,} is not valid UTF-8"
    text = str(e)
    if "integer string conversion" in text:  # Python's int_max_str_digits (4,300 digits by default)
        return f"the JSON body holds a number of more than {sys.get_int_max_str_digits():,} digits"
    msg, pos = getattr(e, "msg", None), getattr(e, "pos", None)
    if msg is not None and pos is not None:
        return f"the body is not valid JSON: {msg} at offset {pos:,}"
    return f"the body cannot be read as JSON: {text[:200]}"


_decode = msgspec.json.Decoder().decode
_encode = msgspec.json.Encoder().encode


def parse(body: bytes | bytearray) -> tuple[Any, bool]:
    """A request body's JSON, read from the body's own bytes, and whether json read it (see `encode`).
    Issue 48: a body's peak cost in the door at most about twice its size. msgspec builds the values
    straight from the buffer, so the body and what it holds are all there is of it at once; json.loads
    decodes the whole body into a str first and orjson copies it for its parser (yyjson), each a third
    copy of a 200 MiB prompt at the peak. What msgspec refuses is read again by json, whose errors say
    more (the byte that is not UTF-8, the nesting) and which reads what msgspec does not (NaN, a lone
    surrogate escape): raises as json.loads does (ValueError, RecursionError)."""
    try:
        return _decode(body), False
    except msgspec.DecodeError:  # ValidationError too: a number of more digits than msgspec reads
        return json.loads(body), True


def encode(doc: Any, by_json: bool = False) -> bytes:
    """`doc` as the body the engine gets, after the door changed it (an alias, client_defaults): one bytes
    object written straight from the values (json.dumps made a str, then its bytes, beside the values).
    A body json read (`by_json`) is written by json: msgspec would write its NaN as null. json also
    writes what msgspec will not (an integer past 64 bits)."""
    if not by_json:
        try:
            return _encode(doc)
        except (msgspec.EncodeError, OverflowError, TypeError):
            pass
    return json.dumps(doc).encode()
