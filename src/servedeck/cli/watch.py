"""Watch-loop commands: watch, notices, soak."""

from __future__ import annotations

import asyncio

import signal
import sys
import threading
import time
from typing import Optional

import typer

from servedeck import paths
from servedeck.cli.app import app, config_or_none, console, err_console, load_config, print_json, warn_unreadable
from servedeck.errors import UsageError
from servedeck.timeparse import seconds


@app.command()
def watch(
    interval: str = typer.Option("5s", "--interval", help="how often to reconcile desired state with reality"),
    quiet: bool = typer.Option(False, "--quiet", help="do not echo notices to stderr"),
) -> None:
    """The long-running loop: relaunch wanted models (with notices), reap unwanted ones, report stalls."""
    from servedeck.watch import Notices, Redactor, Watcher
    from servedeck.watch.notices import format_notice

    cfg = config_or_none("watching desired state")  # desired.json keeps the settings
    host_hook = cfg.deck.host.on_notice if cfg else []

    class Echo(Notices):
        def emit(self, kind, model, message, **detail):  # type: ignore[override]
            rec = super().emit(kind, model, message, **detail)
            if not quiet:
                err_console.print(format_notice(rec), markup=False, highlight=False, soft_wrap=True)
            return rec

    w = Watcher(cfg, seconds(interval, "--interval"), Echo(host_hook, Redactor.from_config(cfg)))
    stop = threading.Event()
    # systemd stops the loop with SIGTERM; engines keep running (they are supervised by their shims)
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        w.run(stop)
    except KeyboardInterrupt:
        pass


@app.command()
def notices(
    since: Optional[str] = typer.Option(None, "--since", help="only the last DURATION (e.g. 1h)"),
    model: Optional[str] = typer.Option(None, "--model"),
    follow: bool = typer.Option(False, "-f", "--follow", help="keep printing new notices"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """What the watch loop (and soak) did and why: relaunch 1/3, crashed, gave up, adopted, reaped, stalled."""
    from servedeck.watch.notices import follow as follow_notices
    from servedeck.watch.notices import format_notice, read_notices

    rows = read_notices(seconds(since, "--since") if since else None, model)
    warn_unreadable(rows, paths.notices_file())
    if as_json and not follow:
        print_json(rows)
        return
    for r in rows:
        _print(r, as_json, format_notice)
    if not rows and not follow and not as_json:
        console.print("no notices" + (f" in the last {since}" if since else ""))
    if follow:
        try:
            for r in follow_notices():
                if model is None or r.get("model") == model:
                    _print(r, as_json, format_notice)
        except KeyboardInterrupt:
            pass


def _print(r: dict, as_json: bool, fmt) -> None:
    import json

    if as_json:
        sys.stdout.write(json.dumps(r, default=str) + "\n")
        sys.stdout.flush()
    else:
        console.print(fmt(r), markup=False, highlight=False, soft_wrap=True)


@app.command()
def soak(
    model: str,
    duration: str = typer.Option("8h", "--duration"),
    concurrency: int = typer.Option(16, "--concurrency", min=1),
    burst_every: str = typer.Option("10m", "--burst-every", help="a saturation burst this often (0 = none)"),
    burst_for: str = typer.Option("1m", "--burst-for", help="how long each burst lasts"),
    burst_concurrency: Optional[int] = typer.Option(None, "--burst-concurrency",
                                                    help="default: the model's concurrency cap (slots / max_num_seqs)"),
    sample_every: str = typer.Option("60s", "--sample-every", help="kernel log (Xid) and health sampling"),
    window: str = typer.Option("5m", "--window", help="latency percentiles per window of this length"),
    max_tokens: int = typer.Option(64, "--max-tokens", min=1),
    turns: int = typer.Option(4, "--turns", min=1, help="turns per conversation before a new one starts"),
    stall_after: Optional[str] = typer.Option(None, "--stall-after",
                                              help="requests in flight and no token computed this long is a fault "
                                                   "(default: [host] stall_after_s, 120 s)"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Drive MODEL at a fixed concurrency with saturation bursts for DURATION; stop at the first fault."""
    from servedeck.soak import SoakSpec, open_soak

    cfg = load_config()
    try:
        spec = SoakSpec(model=cfg.resolve(model), duration_s=seconds(duration, "--duration"), concurrency=concurrency,
                        burst_every_s=seconds(burst_every, "--burst-every"),
                        burst_for_s=seconds(burst_for, "--burst-for"), burst_concurrency=burst_concurrency,
                        sample_every_s=seconds(sample_every, "--sample-every"), window_s=seconds(window, "--window"),
                        max_tokens=max_tokens, turns=turns,
                        stall_after_s=seconds(stall_after, "--stall-after") if stall_after else None)
    except ValueError as e:  # the spec's own checks (a zero duration, a burst longer than its period, ...)
        raise UsageError(f"soak {model}: {e}",
                         hint="--duration, --sample-every, --window and --stall-after must be above 0, "
                              "and --burst-for shorter than --burst-every (--burst-every 0: no bursts)") from None
    t0 = time.monotonic()

    def progress(line: str) -> None:
        if not as_json:
            err_console.print(f"[dim]{time.monotonic() - t0:7.0f}s[/] {line}", highlight=False, soft_wrap=True)

    run = open_soak(cfg, spec, progress=progress)
    asyncio.run(run.main())
    summary = run.finish()
    if as_json:
        print_json(summary)
    else:
        c = summary.get("counts", {})
        console.print(f"soak {summary['status']}: {summary.get('reason') or 'ran its duration without a fault'}")
        console.print(f"requests: {c}; longest clean window: {summary.get('longest_clean_window_s')} s; "
                      f"faults: {len(summary.get('faults') or [])}")
        console.print(f"run folder: {summary['path']}", highlight=False)
    if summary["status"] != "ok":
        raise typer.Exit(1)
