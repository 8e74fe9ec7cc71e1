"""Notices: what the watch loop (and soak) did and why, as JSON lines in `paths.notices_file()`.

A quiet box is not a healthy box: every relaunch, crash, give-up, adoption, reap and stall is a
notice, so `servedeck notices` tells the story. Optionally each notice is also handed to a user
command (`[host] on_notice = [...]`): argv, never a shell, the notice as JSON on stdin and in
$SERVEDECK_NOTICE, bounded by a timeout so a hung hook cannot stop the loop.

Secrets never leave here: every notice is scrubbed of the values of secret-named environment
variables (HF_TOKEN, *_API_KEY, ...) from models.toml and from servedeck's own environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, Iterable, Iterator

from servedeck import paths
from servedeck.deck.state import now_iso
from servedeck.errors import StateError
from servedeck.fsio import JsonlRows, append_jsonl, read_jsonl
from servedeck.redact import is_secret_name, redact_text

HOOK_TIMEOUT_S = 10.0
REDACTED = "<redacted>"


class Redactor:
    """Replaces known secret values anywhere in a string. Short values are skipped: a 2-character
    "secret" would shred every message and protects nothing."""

    def __init__(self, values: Iterable[str]):
        self.values = sorted({v for v in values if v and len(v) >= 4}, key=len, reverse=True)

    @classmethod
    def from_config(cls, cfg: Any | None) -> "Redactor":
        values = [v for k, v in os.environ.items() if is_secret_name(k)]
        if cfg is not None:
            for m in cfg.deck.models.values():
                values += [v for k, v in m.env.items() if is_secret_name(k)]
                values += [str(a) for k, a in m.args.items() if is_secret_name(k)]
            for b in cfg.deck.builds.values():
                values += [v for k, v in b.env.items() if is_secret_name(k)]
        return cls(values)

    def text(self, s: str) -> str:
        for v in self.values:
            s = s.replace(v, REDACTED)
        return redact_text(s)

    def data(self, obj: Any) -> Any:
        """A JSON-able object with every secret value replaced (round-trips through JSON text)."""
        return json.loads(self.text(json.dumps(obj, default=str)))


class Notices:
    """Writes notices. `emit` never raises for a failing hook: the journal line is the record."""

    def __init__(self, on_notice: list[str] | None = None, redactor: Redactor | None = None,
                 hook_timeout_s: float = HOOK_TIMEOUT_S):
        self.on_notice = list(on_notice or [])
        self.redactor = redactor or Redactor([])
        self.hook_timeout_s = hook_timeout_s

    def emit(self, kind: str, model: str | None, message: str, **detail: Any) -> dict:
        rec = self.redactor.data({"ts": now_iso(), "t": time.time(), "kind": kind, "model": model,
                                  "message": message, "pid": os.getpid(), **detail})
        try:
            append_jsonl(paths.notices_file(), rec)
        except (StateError, OSError) as e:  # a full disk: the notice still goes to stderr and the hook
            rec["unwritten"] = getattr(e, "message", None) or str(e)
            sys.stderr.write(f"servedeck notice ({kind}{', ' + model if model else ''}): {message} "
                             f"[not written: {rec['unwritten']}]\n")
            sys.stderr.flush()
        if self.on_notice:
            err = self._hook(rec)
            if err:
                try:
                    append_jsonl(paths.notices_file(), {"ts": now_iso(), "t": time.time(), "kind": "hook-failed",
                                                        "model": model, "message": self.redactor.text(err),
                                                        "pid": os.getpid()})
                except (StateError, OSError):
                    sys.stderr.write(f"servedeck notice (hook-failed): {self.redactor.text(err)}\n")
        return rec

    def _hook(self, rec: dict) -> str | None:
        payload = json.dumps(rec, default=str)
        env = dict(os.environ, SERVEDECK_NOTICE=payload)
        try:
            cp = subprocess.run(self.on_notice, input=payload, text=True, env=env, timeout=self.hook_timeout_s,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, check=False)
        except subprocess.TimeoutExpired:
            return f"on_notice {self.on_notice[0]} did not finish in {self.hook_timeout_s:g} s (killed)"
        except OSError as e:
            return f"on_notice {self.on_notice[0]} could not run: {e.strerror}"
        if cp.returncode != 0:
            return f"on_notice {self.on_notice[0]} exited {cp.returncode}: {(cp.stderr or '').strip()[:200]}"
        return None


def read_notices(since_s: float | None = None, model: str | None = None) -> JsonlRows:
    """Notices, oldest first; `since_s` keeps those from the last that many seconds. `.skipped` counts
    lines of the file that could not be read (`.warning(path)` says so)."""
    rows = read_jsonl(paths.notices_file())
    cutoff = time.time() - since_s if since_s is not None else None
    return rows.keep(lambda r: (cutoff is None or r.get("t", 0) >= cutoff)
                     and (model is None or r.get("model") == model))


def follow(poll_s: float = 0.5) -> Iterator[dict]:
    """New notices as they are appended (for `notices -f`); starts at the end of the file."""
    path = paths.notices_file()
    pos = path.stat().st_size if path.exists() else 0
    buf = b""
    while True:
        try:
            with open(path, "rb") as fh:
                fh.seek(pos)
                chunk = fh.read()
        except FileNotFoundError:
            chunk = b""
        if chunk:
            pos += len(chunk)
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                try:
                    yield json.loads(line)
                except json.JSONDecodeError:
                    continue
        else:
            time.sleep(poll_s)


def format_notice(r: dict) -> str:
    model = f" {r['model']}" if r.get("model") else ""
    return f"{r.get('ts', '?')}  {r.get('kind', '?'):<10}{model}: {r.get('message', '')}"

