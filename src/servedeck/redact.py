"""Secrets kept out of everything servedeck shows or writes: argv, env, desired.json, run folders,
reports and notices. One place decides what a secret looks like (by its name, or by a well-known
token format), so every writer hides the same things.
"""

from __future__ import annotations

import json
import re
from typing import Any

REDACTED = "<redacted>"
# A name (env key, flag, JSON key) that holds a secret: any spelling containing KEY, SECRET, PASSWORD,
# PASSWD or CREDENTIAL, or TOKEN where the word ends (HF_TOKEN, --hf-token, access_token). TOKENS,
# TOKENIZER and TOKEN_ID are counts and names, not secrets (--max-num-batched-tokens, --tokenizer).
SECRET_KEY = re.compile(r"KEY|SECRET|PASSWORD|PASSWD|CREDENTIAL|TOKEN(?![A-Za-z]|[-_]IDS?(?![A-Za-z]))", re.I)
# Values that are secrets whatever they are called: well-known token formats (Hugging Face, OpenAI and
# Anthropic, GitHub, Slack, AWS, GitLab, Google). Long enough that an ordinary word never matches.
SECRET_VALUE = re.compile(
    r"(?<![A-Za-z0-9])(?:hf_[A-Za-z0-9]{16,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|github_pat_[A-Za-z0-9_]{20,}|xox[abposr]-[A-Za-z0-9-]{10,}|AKIA[0-9A-Z]{16}|glpat-[A-Za-z0-9_-]{20,}"
    r"|AIza[0-9A-Za-z_-]{30,})"
)


def is_secret_name(name: str) -> bool:
    return bool(SECRET_KEY.search(name))


def redact_text(text: str) -> str:
    """Token-formatted values replaced wherever they stand in a string."""
    return SECRET_VALUE.sub(REDACTED, text)


def _redact_json(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: (REDACTED if is_secret_name(str(k)) and isinstance(v, (str, int, float)) else _redact_json(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [_redact_json(v) for v in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def _redact_value(value: str) -> str:
    """A flag value: a JSON table/list has its secret-named keys hidden; any string its token formats."""
    if value[:1] in "[{":
        try:
            parsed = json.loads(value)
        except ValueError:
            return redact_text(value)
        cleaned = _redact_json(parsed)
        return value if cleaned == parsed else json.dumps(cleaned, separators=(", ", ": "))
    return redact_text(value)


def redact_argv(argv: list[str]) -> list[str]:
    """The one place argv is made safe to show or write (cmd.sh, launch.json, render, units, run folders).

    A flag whose name is secret-like (`--api-key V`, `--hf-token=V`) has its value hidden; every other
    value keeps its shape but loses token-formatted substrings and secret-named JSON keys' values.
    A secret-named flag followed by another flag is a bare switch and hides nothing.
    """
    out: list[str] = []
    hide = False
    for a in argv:
        if hide and not a.startswith("--"):
            out.append(REDACTED)
            hide = False
            continue
        hide = False
        flag, eq, value = a.partition("=")
        if a.startswith("-") and eq:
            out.append(f"{flag}={REDACTED}" if is_secret_name(flag) else f"{flag}={_redact_value(value)}")
        elif a.startswith("-"):
            out.append(a)
            hide = is_secret_name(a)
        else:
            out.append(_redact_value(a))
    return out


def redact_settings_args(args: dict[str, Any]) -> dict[str, Any]:
    """models.toml `args` as desired.json keeps them: a secret-named key's value, or a value holding a
    token, is stored as `<redacted>` (restore takes it back from the current models.toml)."""
    out: dict[str, Any] = {}
    for k, v in args.items():
        secret = is_secret_name(k) or (SECRET_VALUE.search(json.dumps(v)) is not None)
        out[k] = REDACTED if secret and v is not True and v is not False else v
    return out


def redact_env(env: dict[str, str]) -> dict[str, str]:
    """Env with secret-named keys, and values in a known token format, replaced by `<redacted>`."""
    return {k: (REDACTED if is_secret_name(k) or SECRET_VALUE.search(v or "") else v) for k, v in env.items()}
