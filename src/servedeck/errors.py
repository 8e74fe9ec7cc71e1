"""One error tree for everything a user can get wrong or run into.

    ServedeckError            message + hint; the CLI prints both, never a traceback
    ├── ConfigError           models.toml is unreadable or invalid (names file and key path)
    ├── UsageError            a command-line value is wrong (names the option and what was expected)
    ├── StateError            a state file (desired.json, a launch record) is corrupt or inconsistent
    │   └── DiskFullError     a file cannot be written: its disk is full (names the path and the free space)
    ├── BusyError             another servedeck holds the deck lock (or the watch loop's)
    ├── RefusedError          the request is understood but would break a rule (slot held, no memory)
    ├── LaunchError           an engine died while starting or never became ready
    ├── UnknownModelError     no model or alias by that name
    ├── PlanError             the planner cannot read the model's shape (no config.json, unreadable GGUF)
    ├── NothingToServe        `servedeck init` found no engine and model that can run together (exit 8)
    └── RunError              a campaign run could not be written or completed
        └── ServerDied        the engine went away during a gate or benchmark

The exit code says which kind of trouble it was, wherever it was found: a user's mistake on the
command line (a bad option value, a name that matches nothing) is a UsageError and exits 2, like
typer's own usage errors and like ConfigError for a mistake in models.toml.

    DoorError                 an answer the front door gives an HTTP client itself: a status and a body,
    │                         never an exit code; raised where it is decided, written by the front
    ├── door.manager.Refusal  the door will not serve the model now: 404 unknown, 429 queue full, 502/503
    │                         start failed or refused, 504 not ready in time; says when to come back
    ├── door.request.Answer   a response the door frames itself (400, 401, 403, 408, 413, 431, 500, 502)
    └── door.relay.UpstreamError  the engine's connection failed (refused, reset, closed early): a 502
                              before the answer began, an SSE error event after

DoorError is a second root, not a ServedeckError: it carries an HTTP status, not a message for a
terminal, and the door turns the deck's ServedeckErrors into Refusals (`except ServedeckError` in
door/manager.py must never catch one of its own answers).

Exceptions that never reach a user are converted where they are raised: supervisor.ready's Died and
TimedOut become LaunchError in the deck; loadgen.response's ProtocolError becomes a failed request record;
gpu.gguf_header's GGUFError becomes PlanError; soak's ProtocolViolation becomes a recorded fault.
"""

from __future__ import annotations


class ServedeckError(Exception):
    """Base of every error meant for a user: `message` says what is wrong, `hint` what to do."""

    exit_code = 1

    def __init__(self, message: str, hint: str | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\n  hint: {self.hint}"


class ConfigError(ServedeckError):
    exit_code = 2


class StateError(ServedeckError):
    exit_code = 3


class DiskFullError(StateError):
    """ENOSPC or EDQUOT writing `path`; `free_bytes` is what its file system had left then. A run folder's
    writer turns it into a RunError (exit 7); elsewhere it is a state error (exit 3)."""

    def __init__(self, message: str, hint: str | None = None, path: str = "", free_bytes: int | None = None):
        super().__init__(message, hint)
        self.path = path
        self.free_bytes = free_bytes


class BusyError(ServedeckError):
    exit_code = 4


class RefusedError(ServedeckError):
    exit_code = 5


class LaunchError(ServedeckError):
    exit_code = 6

    def __init__(self, message: str, hint: str | None = None, log_tail: str = "", cause: dict | None = None):
        super().__init__(message, hint)
        self.log_tail = log_tail
        self.cause = cause or {}


class UnknownModelError(ServedeckError):
    exit_code = 2


class UsageError(ServedeckError):
    exit_code = 2


class PlanError(ServedeckError):
    exit_code = 2


class NothingToServe(ServedeckError):
    """`servedeck init` found nothing it could write an entry for: the hint says what to install."""

    exit_code = 8

    def __init__(self, message: str, hint: str | None = None, composed=None):
        super().__init__(message, hint)
        self.composed = composed  # what was found and left out, for the CLI to show


class RunError(ServedeckError):
    exit_code = 7


class ServerDied(RunError):
    """The engine went away during a gate or benchmark."""


class DoorError(Exception):
    """Base of the answers the front door gives an HTTP client itself (an HTTP status, never an exit
    code): Refusal (door/manager.py), Answer (door/request.py), UpstreamError (door/relay.py)."""
