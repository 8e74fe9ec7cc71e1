"""The front door command: serve."""

from __future__ import annotations

import logging
from typing import List, Optional

import typer

from servedeck.cli.app import app, err_console, load_config
from servedeck.timeparse import seconds


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", "--host", help="address to listen on (loopback unless you say otherwise)"),
    port: int = typer.Option(8000, "--port"),
    api_key: Optional[str] = typer.Option(None, "--api-key", envvar="SERVEDECK_API_KEY",
                                          help="required as a bearer key on every request (also models.toml host.api_keys)"),
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
) -> None:
    """One OpenAI-compatible endpoint for the whole deck: routes by model, starts and switches on demand."""
    from servedeck.door.serve import ServeOptions, keys_of, parse_upstream_routing, parse_upstreams, serve as run
    from servedeck.door.admission import is_loopback

    cfg = load_config()
    opts = ServeOptions(host=host, port=port, api_keys=[api_key] if api_key else [], watch=watch,
                        watch_interval_s=seconds(watch_interval, "--watch-interval"), log_bodies=log_bodies,
                        external=parse_upstreams(upstream))
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
