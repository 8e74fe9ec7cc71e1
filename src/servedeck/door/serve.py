"""`servedeck serve`: the door and the watch loop in one process, so desired state, relaunches and
notices have one owner. Refuses to start while another watch loop holds the state dir."""

from __future__ import annotations

import asyncio
import math
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

from servedeck.config import Config
from servedeck.errors import RefusedError, UsageError
from servedeck.door.front import BUDGET_FLAG, BUDGET_KEY
from servedeck.door.listen import raise_nofile
from servedeck.door.manager import Manager
from servedeck.door.metrics import DoorMetrics
from servedeck.door.server import Door, run_door
from servedeck.loadgen.loop import preferred, run as run_loop

if TYPE_CHECKING:
    from servedeck.watch import Notices, Watcher

ENV_KEY = "SERVEDECK_API_KEY"


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: list[str] = field(default_factory=list)
    watch: bool = True
    watch_interval_s: float = 5.0
    log_bodies: bool = False
    external: dict[str, list[str]] = field(default_factory=dict)  # --upstream NAME=URL (servers not run by servedeck)
    external_routing: dict[str, str] = field(default_factory=dict)  # --upstream-routing NAME=POLICY
    body_budget_mib: float | None = None  # --body-budget-mib: over [host] body_budget_mib


def parse_upstreams(items: list[str]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for it in items:
        name, sep, url = it.partition("=")
        if not sep or not name or not url.startswith(("http://", "https://")):
            raise UsageError(f"--upstream {it!r}: expected NAME=http://HOST:PORT",
                             hint="repeat --upstream with the same NAME to give a model several replicas")
        out.setdefault(name, []).append(url)
    return out


def parse_upstream_routing(items: list[str], upstreams: dict[str, list[str]]) -> dict[str, str]:
    """--upstream-routing NAME=POLICY: the replica policy of an --upstream model (models.toml's `routing`
    does the same for the models it lists); checked by the same rule as that key."""
    from servedeck.config.schema import ROUTING_KNOBS

    out: dict[str, str] = {}
    for it in items:
        name, sep, policy = it.partition("=")
        if not sep or not name or not policy:
            raise UsageError(f"--upstream-routing {it!r}: expected NAME=POLICY",
                             hint=f"e.g. --upstream-routing {name or 'NAME'}=prefix")
        if name not in upstreams:
            raise UsageError(f"--upstream-routing {it!r}: no --upstream named {name!r}",
                             hint="give the model's servers with --upstream NAME=URL (repeated for replicas)")
        if policy not in ROUTING_KNOBS:
            raise UsageError(f"--upstream-routing {it!r}: no routing policy named {policy!r}",
                             hint=f"choose one of: {', '.join(ROUTING_KNOBS)}")
        out[name] = policy
    return out


def keys_of(cfg: Config | None, given: list[str]) -> list[str]:
    keys = [k for k in given if k]
    if cfg:
        keys += list(cfg.deck.host.api_keys)
    for k in keys:
        if len(k) < 8:
            raise UsageError("an api key must be at least 8 characters long",
                             hint=f"use a longer --api-key-file / {ENV_KEY} / --api-key")
    return keys


def read_key_file(path: Path) -> list[str]:
    """--api-key-file PATH: every non-blank line is a key (several let a key be rotated without a
    moment when neither works), surrounding whitespace dropped. A key in a file is not in `ps`, as
    --api-key's is, nor in the environment, which children inherit."""
    flag = f"--api-key-file {path}"
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UsageError(f"{flag}: no such file", hint="write the key into that file (one key a line), "
                         "readable by you only: chmod 600") from None
    except IsADirectoryError:
        raise UsageError(f"{flag}: is a directory, not a file", hint="name the file that holds the key") from None
    except OSError as e:
        raise UsageError(f"{flag}: cannot be read: {e.strerror}",
                         hint="make it readable by the user that runs `servedeck serve`") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UsageError(f"{flag}: not UTF-8 text (byte {e.start})",
                         hint="write the key as plain text, one key a line") from None
    keys = [line.strip() for line in text.splitlines() if line.strip()]
    if not keys:
        raise UsageError(f"{flag}: holds no key (the file is empty or blank)",
                         hint="write the key into it, one key a line")
    return keys


def key_file_exposed(path: Path) -> bool:
    """The key file can be read by other users (group or others may read it)."""
    try:
        return bool(path.stat().st_mode & 0o044)
    except OSError:
        return False


def build_door(cfg: Config | None, opts: ServeOptions, notify: Callable | None = None) -> Door:
    metrics = DoorMetrics()
    if cfg:
        clash = sorted(set(opts.external) & (set(cfg.models) | set(cfg.groups)))
        if clash:
            raise UsageError(f"--upstream {clash[0]}: a model of that name is in {cfg.path}",
                             hint="give the outside server another name")
    mgr = Manager(cfg, metrics, external=opts.external, external_routing=opts.external_routing, notify=notify)
    budget, said = opts.body_budget_mib, BUDGET_FLAG
    if budget is None and cfg is not None:
        budget, said = cfg.deck.host.body_budget_mib, BUDGET_KEY
    return Door(mgr, metrics, api_keys=keys_of(cfg, opts.api_keys), host=opts.host, log_bodies=opts.log_bodies,
                body_budget=int(budget * 2**20) if budget else None, body_budget_from=said)


def body_budget_mib(text: str | None) -> float | None:
    """--body-budget-mib as given (None: not given), or a UsageError naming it, the value and what it must be."""
    if text is None:
        return None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise UsageError(f"{BUDGET_FLAG} {text!r}: expected a number of MiB greater than 0 (the request bodies the "
                         "door holds at once, all clients together)",
                         hint=f"e.g. {BUDGET_FLAG} 512; leave it out for models.toml's host.body_budget_mib, or "
                              "an eighth of host memory")
    return value


def serve(cfg: Config | None, opts: ServeOptions, on_ready: Callable[[int], None] | None = None,
          stop: threading.Event | None = None) -> None:
    """Run until SIGINT/SIGTERM (or `stop`), on the event loop servedeck.loadgen.loop chooses (uvloop when
    installed; SERVEDECK_LOOP). Engines keep running afterwards, as with `watch`."""
    from servedeck.watch import Notices, Redactor, Watcher

    loop_name = preferred()  # a bad SERVEDECK_LOOP is refused before anything starts
    raise_nofile()  # each client connection takes a descriptor: the soft limit (often 1,024) up to the hard one
    redactor = Redactor.from_config(cfg)  # the door's own keys are scrubbed from notices too, wherever they came from
    notices = Notices(cfg.deck.host.on_notice if cfg else [], Redactor([*redactor.values, *keys_of(cfg, opts.api_keys)]))
    if not opts.watch:
        _serve(cfg, opts, notices, None, loop_name, on_ready, stop)
        return
    watcher = Watcher(cfg, opts.watch_interval_s, notices)
    # Refused now, with the holder named, if another loop owns this state dir; held until the door
    # ends, so no other process can take the lock between this check and the loop.
    with watcher.locked():
        _serve(cfg, opts, notices, watcher, loop_name, on_ready, stop)


def _serve(cfg: Config | None, opts: ServeOptions, notices: Notices, watcher: Watcher | None, loop_name: str,
           on_ready: Callable[[int], None] | None, stop: threading.Event | None) -> None:
    """The door, and the watch loop in a thread (when `watcher`: it holds the watch lock already)."""
    door = build_door(cfg, opts, notify=lambda kind, model, msg, **d: notices.emit(kind, model, msg, **d))
    if watcher is not None:  # the loop then does not call the door's launches "adopted"
        door.manager.on_launched = lambda rec: (watcher.launched.add(rec.launch_dir), watcher.known.add(rec.model))
    stop = stop or threading.Event()
    errors: list[BaseException] = []

    def watch_thread() -> None:
        try:
            watcher.run(stop)  # type: ignore[union-attr]
        except BaseException as e:  # a loop that fails ends the door with it
            errors.append(e)
            stop.set()

    t = threading.Thread(target=watch_thread, name="watch-loop", daemon=True) if watcher else None
    if t:
        t.start()

    async def main() -> None:
        ev = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, ev.set)
            except (RuntimeError, ValueError):  # not the main thread (tests run the door in a thread)
                pass

        async def watch_stop() -> None:
            await asyncio.to_thread(stop.wait)
            ev.set()

        w = asyncio.create_task(watch_stop())
        try:
            await run_door(door, opts.host, opts.port, ev, ready=on_ready,
                           preload=list(cfg.deck.host.preload) if cfg else [])
        except OSError as e:
            raise RefusedError(f"cannot listen on {opts.host}:{opts.port}: {e.strerror}",
                               hint="pick another --port, or stop what listens there") from None
        finally:
            stop.set()
            w.cancel()

    try:
        run_loop(main(), loop_name)
    finally:
        stop.set()
        if t:
            t.join(10)
    if errors:
        raise errors[0]
