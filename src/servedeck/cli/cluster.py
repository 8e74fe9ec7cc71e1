"""`servedeck hosts`: the Ray cluster's nodes, each asked by a task pinned to it. Parse, call, render."""

from __future__ import annotations

from typing import Optional

import typer
from rich.table import Table

from servedeck.cli.app import app, console, load_config, print_json
from servedeck.errors import ServedeckError


@app.command()
def hosts(ray: Optional[str] = typer.Option(None, "--ray", metavar="ADDRESS",
                                            help="auto, local, or the head's host:port (default: SERVEDECK_RAY_ADDRESS, else auto)"),
          model: Optional[str] = typer.Option(None, "--model", help="check this model's build and weights on each node "
                                                                    "(default: every model in models.toml)"),
          as_json: bool = typer.Option(False, "--json")) -> None:
    """Every node: host, GPUs (model, memory free), CPUs, servedeck version, doctor verdict."""
    from servedeck.cluster.connect import address_from, connected
    from servedeck.cluster.hosts import hosts as node_rows

    try:
        cfg = load_config()
        text, path = cfg.path.read_text(), str(cfg.path)
    except ServedeckError:
        text = path = None  # no models.toml here: the nodes are listed without a doctor verdict
    with connected(address_from(ray) or "auto"):
        rows = node_rows(text, path, model)
    if as_json:
        print_json({"nodes": rows})
    else:
        t = Table(title=f"{len(rows)} Ray node(s)")
        for col in ("host", "node id", "CPUs", "GPUs", "resources", "servedeck", "doctor"):
            t.add_column(col, overflow="fold")
        for r in rows:
            gpus = ", ".join(f"{g['name']} {g['memory_free'] / 2**30:.0f}/{g['memory_total'] / 2**30:.0f} GiB free"
                             for g in r.get("gpus") or []) or (r.get("gpu_note") or "none")[:60]
            fails = [f"{x['check']} {x['subject']}: {x['saw']}" for x in r.get("rows") or [] if x["status"] == "FAIL"]
            t.add_row(f"{r.get('host')}{' (head)' if r.get('head') else ''}", r["ray_node_id"][:12],
                      f"{r.get('cpus', '?')} ({r.get('ray_cpus')} for Ray)", gpus, ", ".join(r["resources"]) or "-",
                      str(r.get("servedeck", "-")),
                      r.get("doctor", "?") + ("" if not fails else ": " + "; ".join(fails))
                      + (f" {r['error']}" if r.get("error") else ""))
        console.print(t)
    if any(r.get("doctor") in ("FAIL", "unreachable") for r in rows):
        raise typer.Exit(1)
