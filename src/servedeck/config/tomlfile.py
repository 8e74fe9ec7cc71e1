"""A TOML file the user wrote, read and validated the same way for every file servedeck reads
(models.toml, campaign files): bad syntax and every bad key are ConfigErrors naming the file, the key
path and what was expected."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from servedeck.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def read_toml(text: str, path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{path}: not valid TOML: {e}", hint="fix the syntax at the line named above") from None


def describe(loc: tuple) -> str:
    """A pydantic error location as the key path a user reads (validator and union branch names left out)."""
    return ".".join(str(p) for p in loc if not str(p).startswith(("function-after", "list[", "literal[")))


def explain(err: dict, keys_doc: str) -> str:
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        return f"unknown key (check its spelling against {keys_doc})"
    if kind == "missing":
        return "required key is missing"
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if "input" in err and kind != "value_error" and not isinstance(err["input"], dict):
        msg = f"{msg} (got {err['input']!r})"
    return msg


def problems(e: ValidationError, prefix: str, keys_doc: str) -> list[str]:
    """One line per place (a union reports each of its branches; one line is enough)."""
    out: list[str] = []
    for err in e.errors():
        line = f"{prefix}{describe(err['loc'])}: {explain(err, keys_doc)}"
        if line not in out:
            out.append(line)
    return out
