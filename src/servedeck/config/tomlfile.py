"""A TOML file the user wrote, read and validated the same way for every file servedeck reads
(models.toml, campaign files): bad syntax and every bad key are ConfigErrors naming the file, the key
path and what was expected."""

from __future__ import annotations

import difflib
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

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


def _held_model(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model a field holds, itself or inside a dict, list, Optional or Union; None if none."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        held = _held_model(arg)
        if held is not None:
            return held
    return None


def known_keys(root: type[BaseModel], loc: tuple) -> list[str]:
    """The keys the table holding `loc`'s last key takes (a table name or list index on the way is passed over)."""
    model = root
    for part in loc[:-1]:
        if isinstance(part, str) and part in model.model_fields:
            held = _held_model(model.model_fields[part].annotation)
            if held is None:
                return []
            model = held
    return sorted(model.model_fields)


def explain(err: dict, root: type[BaseModel]) -> str:
    kind = err.get("type", "")
    if kind == "extra_forbidden":
        # the keys themselves, not a pointer to documentation a wheel's user may not have
        keys = known_keys(root, tuple(err.get("loc", ())))
        near = difflib.get_close_matches(str(err["loc"][-1]), keys, n=1) if err.get("loc") else []
        if near:
            return f"unknown key: did you mean {near[0]}?"
        return f"unknown key (this table takes: {', '.join(keys)})" if keys else "unknown key"
    if kind == "missing":
        return "required key is missing"
    msg = str(err.get("msg", "invalid value")).removeprefix("Value error, ")
    if "input" in err and kind != "value_error" and not isinstance(err["input"], dict):
        msg = f"{msg} (got {err['input']!r})"
    return msg


def problems(e: ValidationError, prefix: str, root: type[BaseModel]) -> list[str]:
    """One line per place (a union reports each of its branches; one line is enough). `root`: the model
    validated, whose fields name the keys an unknown one may have meant."""
    out: list[str] = []
    for err in e.errors():
        line = f"{prefix}{describe(err['loc'])}: {explain(err, root)}"
        if line not in out:
            out.append(line)
    return out
