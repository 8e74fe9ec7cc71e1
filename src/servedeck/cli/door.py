"""The front door command: serve."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import List, Optional

import typer

from servedeck.cli.app import app, err_console, load_config
from servedeck.timeparse import seconds


@app.command()
def serve(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (loopback unless you say otherwise)"),
    port: int = typer.Option(8000, "--port"),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="SERVEDECK_API_KEY",
                                          help="required as a bearer key on every request (also models.toml "
                                               "host.api_keys); on the command line `ps` shows it: prefer "
                                               "--api-key-file or SERVEDECK_API_KEY"),
    api_key_file: Optional[Path] = typer.Option(None, "--api-key-file", help="read the key from this file "
                                                "(each non-blank line a key); not shown by `ps`"),
    watch_interval: str = typer.Option("5s", "--watch-interval", help="the in-process watch loop's interval"),
    watch: bool = typer.Option(True, "--watch/--no-watch",
                               help="run the watch loop in the door (relaunches, liveness probes: one 1-token "
                                    "completion per ready engine every host.liveness_interval_s); --no-watch: the "
                                    "door alone, beside a `servedeck watch` of its own, or for a measurement whose "
                                    "engines must see no request but the workload's"),
    upstream: List[str] = typer.Option([], "--upstream", help="NAME=URL: also route NAME to a server servedeck "
                                       "does not run (repeat a NAME for replicas)"),
    upstream_routing: List[str] = typer.Option([], "--upstream-routing", help="NAME=POLICY: how an --upstream "
                                               "model's replicas share its requests (least-outstanding, session, "
                                               "prefix; as models.toml's routing)"),
    log_bodies: bool = typer.Option(False, "--log-bodies", help="log request bodies (off: bodies are never logged)"),
    body_budget_mib: Optional[str] = typer.Option(None, "--body-budget-mib", metavar="MIB",
                                                    help="request bodies the door holds at once, all clients "
                                                         "together; past it 503 with Retry-After (default: "
                                                         "models.toml's host.body_budget_mib, else an eighth "
                                                         "of host memory)"),
) -> None:
    """One OpenAI-compatible endpoint for the whole deck: routes by model, starts and switches on demand."""
    from servedeck.door.serve import (ENV_KEY, ServeOptions, body_budget_mib as budget_checked, key_file_exposed,
                                      keys_of, parse_upstream_routing, parse_upstreams, read_key_file, serve as run)
    from servedeck.door.admission import is_loopback

    budget = budget_checked(body_budget_mib)  # before anything else: a user's mistake, said first
    keys = [api_key] if api_key else []
    if api_key_file is not None:
        keys += read_key_file(api_key_file)
        if key_file_exposed(api_key_file):
            err_console.print(f"[yellow]warning:[/] {api_key_file} can be read by other users: chmod 600 it",
                              highlight=False)
    source = ctx.get_parameter_source("api_key")  # typer may carry its own click: compared by name
    if api_key and getattr(source, "name", None) == "COMMANDLINE":
        err_console.print("[yellow]warning:[/] --api-key on the command line is visible to every user of this "
                          f"machine (`ps`, /proc): use --api-key-file PATH or {ENV_KEY} instead", highlight=False)
    # Read once, here: nothing the door starts (engines and their supervisors, notice hooks, tools the
    # deck runs) inherits the key, since every child gets a copy of this process's environment.
    os.environ.pop(ENV_KEY, None)
    cfg = load_config()
    opts = ServeOptions(host=host, port=port, api_keys=keys, watch=watch,
                        watch_interval_s=seconds(watch_interval, "--watch-interval"), log_bodies=log_bodies,
                        external=parse_upstreams(upstream), body_budget_mib=budget)
    opts.external_routing = parse_upstream_routing(upstream_routing, opts.external)
    if log_bodies:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    if not is_loopback(host) and not keys_of(cfg, opts.api_keys):
        err_console.print(f"[yellow]warning:[/] listening on {host} without an api key: /v1 is open to the "
                          "network; /, /events, /metrics and /door/status answer loopback only")

    def ready(bound: int) -> None:
        err_console.print(f"servedeck door on http://{host}:{bound} (models: {', '.join(cfg.models)}); "
                          "Ctrl-C stops the door, engines keep running", highlight=False)

    run(cfg, opts, on_ready=ready)
