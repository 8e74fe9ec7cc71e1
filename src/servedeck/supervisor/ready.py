"""Readiness: alive, healthy, and one real completion answered. A healthy-looking boot proves nothing.

Polling always watches the process too: an engine that dies while starting is reported at once,
not after the timeout.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import httpx

from servedeck.config.schema import merge_request
from servedeck.engines.base import LaunchSpec


class Died(Exception):
    """The engine's process ended while we waited for it."""


class TimedOut(Exception):
    pass


@dataclass
class Readiness:
    healthy_after_s: float
    answered_after_s: float
    probe_text: str
    probe_tokens: int | None


PROBE_PROMPT = "The capital of France is"


def completion_probe(spec: LaunchSpec, timeout_s: float = 60.0, max_tokens: int = 4) -> tuple[str, int | None]:
    """One real (non-streamed) completion; for an embedding model, which answers nothing else, one
    embedding (its text says the vector's size). Raises httpx errors or ValueError on a malformed answer."""
    if spec.embeddings:
        r = httpx.post(spec.base_url + "/v1/embeddings", json={"model": spec.served_name, "input": PROBE_PROMPT},
                       timeout=timeout_s)
        r.raise_for_status()
        vec = r.json()["data"][0]["embedding"]
        if not isinstance(vec, list) or not vec:
            raise ValueError(f"/v1/embeddings answered no vector: {str(vec)[:80]}")
        return f"{len(vec)}-dimensional embedding", None
    body = merge_request({"model": spec.served_name, "prompt": PROBE_PROMPT, "max_tokens": spec.output_cap(max_tokens),
                          "temperature": 0}, spec.request)
    r = httpx.post(spec.base_url + "/v1/completions", json=body, timeout=timeout_s)
    r.raise_for_status()
    data = r.json()
    text = data["choices"][0].get("text", "")
    usage = data.get("usage") or {}
    return text, usage.get("completion_tokens")


def health_ok(spec: LaunchSpec, timeout_s: float = 2.0) -> tuple[bool, str]:
    try:
        r = httpx.get(spec.base_url + spec.health_path, timeout=timeout_s)
    except httpx.HTTPError as e:
        return False, type(e).__name__
    return r.status_code == 200, f"HTTP {r.status_code}"


def wait_ready(spec: LaunchSpec, is_alive: Callable[[], bool], timeout_s: float) -> Readiness:
    t0 = time.monotonic()
    deadline = t0 + timeout_s
    delay = 0.1
    last = ""
    while True:
        if not is_alive():
            raise Died("engine exited while loading")
        ok, last = health_ok(spec)
        if ok:
            break
        if time.monotonic() > deadline:
            raise TimedOut(f"no healthy answer from {spec.base_url}{spec.health_path} in {timeout_s:.0f} s (last: {last})")
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)
    healthy = time.monotonic() - t0
    while True:
        if not is_alive():
            raise Died("engine exited after reporting healthy, before answering a request")
        try:
            text, ntok = completion_probe(spec, timeout_s=max(5.0, min(120.0, deadline - time.monotonic())))
            return Readiness(round(healthy, 3), round(time.monotonic() - t0, 3), text, ntok)
        except (httpx.HTTPError, KeyError, IndexError, ValueError, json.JSONDecodeError) as e:
            last = f"completion probe failed: {type(e).__name__}: {e}"
        if time.monotonic() > deadline:
            raise TimedOut(f"healthy but no completion answered in {timeout_s:.0f} s ({last})")
        time.sleep(0.5)


def read_exit(launch_dir: Path) -> dict | None:
    """exit.json as the shim wrote it; None when there is none or it is not an object (read as no record)."""
    try:
        doc = json.loads((Path(launch_dir) / "exit.json").read_text())
    except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return doc if isinstance(doc, dict) else None


def wait_exit(launch_dir: Path, timeout_s: float) -> dict | None:
    """exit.json once the shim has written it (it does so as its engine ends, then exits itself), waiting up
    to `timeout_s`; None when it has not come by then."""
    deadline = time.monotonic() + timeout_s
    while (found := read_exit(launch_dir)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    return found
