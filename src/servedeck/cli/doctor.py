"""doctor, plan, gpu, crashes, verify-build: thin commands over servedeck.doctor and servedeck.gpu."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Optional

import typer
from rich.table import Table
from rich.text import Text

from servedeck import paths
from servedeck.cli.app import app, console, err_console, load_config, print_json, warn_unreadable
from servedeck.errors import UnknownModelError, UsageError
from servedeck.fsio import read_jsonl
from servedeck.gpu.nvml import GiB, gib

STYLE = {"OK": "green", "WARN": "yellow", "FAIL": "bold red", "SKIP": "dim"}


def _gpus_opt(gpus: Optional[str]) -> list[int] | None:
    if not gpus:
        return None
    try:
        return [int(x) for x in gpus.split(",") if x.strip()]
    except ValueError:
        raise UsageError(f"--gpus {gpus!r}: expected GPU indices like 0,1", hint="see `servedeck gpu`") from None


@app.command()
def doctor(
    model: Optional[str] = typer.Argument(None, help="model or alias (default: every model)"),
    json_out: bool = typer.Option(False, "--json", help="machine-readable rows"),
    no_integrity: bool = typer.Option(False, "--no-integrity", help="skip hashing the build's files (fast)"),
    ack_kernel: bool = typer.Option(False, "--ack-kernel", help="acknowledge the kernel events seen now (recorded "
                                    "with who and when): still shown, they no longer fail the kernel row; "
                                    "later ones do"),
) -> None:
    """Check config, builds, weights, ports, GPU memory, host RAM, power and kernel events before a launch."""
    from servedeck.doctor.checks import FAIL, run_doctor, worst
    from servedeck.doctor.kernel import read_kernel_events

    klog = read_kernel_events()
    if ack_kernel:
        _ack_kernel(klog, quiet=json_out)
    rows = run_doctor(load_config, model, integrity=not no_integrity, klog=klog)
    if json_out:
        print_json({"worst": worst(rows), "rows": [r.to_json() for r in rows]})
    else:
        t = Table(show_lines=False, pad_edge=False)
        for col in ("check", "subject", "status", "saw", "to do"):
            t.add_column(col, overflow="fold")
        for r in rows:
            # Text, not markup: a row's words name keys like [builds.llamacpp], which markup would eat
            t.add_row(Text(r.check), Text(r.subject), Text(r.status, style=STYLE[r.status]), Text(r.saw),
                      Text(r.action))
        console.print(t)
    if worst(rows) == FAIL:
        raise typer.Exit(1)


def _ack_kernel(klog: Any, quiet: bool) -> None:
    from servedeck.doctor.kernel_ack import acknowledge, acks_file, read_acks, split

    if not klog.readable:
        raise UsageError(f"--ack-kernel: the kernel log is not readable here ({klog.reason}), so there is "
                         "nothing servedeck could say was acknowledged",
                         hint="run as a user who may read it (journalctl -k needs systemd-journal or root)")
    new = split(klog.events, read_acks()).new
    if not new:
        if not quiet:
            console.print("--ack-kernel: no kernel events that are not acknowledged already")
        return
    ack = acknowledge(new)
    if not quiet:
        console.print(f"acknowledged {ack['what']} (through {ack['through_at'] or 'events without a time'}) as "
                      f"{ack['by']} at {ack['acknowledged_at']}, in {acks_file()}; a later event fails the kernel "
                      "row again")


def _n(v: Any) -> str:
    return "—" if v is None else f"{v:,}" if isinstance(v, int) else str(v)


@app.command()
def plan(
    model: str = typer.Argument(..., help="model or alias"),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="plan for these GPUs, e.g. 0,1 (default: the model's)"),
    gpu_gib: Optional[float] = typer.Option(None, "--gpu-gib", help="plan for a GPU of this size (no GPU needed)"),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Memory plan: weights, KV bytes per token, KV pool tokens, full-length requests; last measured beside it."""
    from servedeck.gpu import inventory, plan_model

    cfg = load_config()
    inv = inventory() if gpu_gib is None else None
    gl = _gpus_opt(gpus)
    if gl and inv is not None and inv.available:
        missing = [g for g in gl if inv.gpu(g) is None]
        if missing:
            raise UsageError(f"--gpus: no GPU {missing} here", hint="see `servedeck gpu`")
    p, last = plan_model(cfg, model, inv, gl, int(gpu_gib * GiB) if gpu_gib else None)
    if json_out:
        print_json({"model": cfg.resolve(model), "plan": p.to_json(), "last_measured": last})
        return
    t = Table(title=f"plan: {cfg.resolve(model)} ({p.engine}, {p.model_type}, layers {p.layers})", show_header=True)
    t.add_column("")
    t.add_column("predicted", justify="right")
    t.add_column("last measured", justify="right")
    m = (last or {}).get("measured", {})
    rows = [
        ("context / layout", f"{p.context:,} tokens, tp{p.tp} dp{p.dp} pp{p.pp}", ""),
        ("dtype / KV dtype", f"{p.dtype} / {p.kv_dtype}", _n(m.get("kv_cache_dtype"))),
        ("KV dtype because", p.kv_dtype_why, ""),
        ("weights (per GPU)", f"{gib(p.weights_bytes)} ({gib(p.weights_per_gpu)})",
         f"{m['model_loading_gib']} GiB" if m.get("model_loading_gib") is not None else "—"),
        ("weights basis", p.weights_basis, ""),
        ("KV bytes/token (model / per GPU)", f"{p.kv_bytes_per_token:,} / {p.kv_bytes_per_token_per_gpu:,}", ""),
    ]
    if p.draft:  # speculative decoding's draft: already inside the KV and weights figures above
        rows.append(("speculative draft (included above)", f"{p.draft}: +{p.draft_kv_bytes_per_token_per_gpu:,} B/token "
                     f"per GPU, +{gib(p.draft_weights_bytes)} weights", ""))
        rows.append(("draft basis", p.draft_basis, ""))
    if p.sliding_bytes_per_token_per_gpu:
        rows.append(("sliding layers: bytes/token, hold", f"{p.sliding_bytes_per_token_per_gpu:,} B × {p.sliding_hold_tokens:,} tokens", ""))
    if p.state_bytes_per_seq_per_gpu:
        rows.append(("linear-attn state per sequence", gib(p.state_bytes_per_seq_per_gpu), ""))
    rows += [
        ("one full-length request (per GPU)", gib(p.request_bytes_per_gpu), ""),
        ("GPU size × utilisation", f"{gib(p.gpu_total_bytes)} × {p.utilization}" if p.gpu_total_bytes else "—", ""),
        ("overhead (activations, non-torch, graphs)",
         " + ".join(gib(x) for x in (p.activation_bytes, p.non_torch_bytes, p.cuda_graph_bytes)) if p.activation_bytes is not None else "—",
         f"graphs {m['graph_capture_gib']} GiB" if m.get("graph_capture_gib") is not None else ""),
        ("KV pool per GPU", gib(p.pool_bytes_per_gpu) if p.pool_bytes_per_gpu is not None else "—",
         f"{m['kv_gib']} GiB" if m.get("kv_gib") is not None else "—"),
        ("KV pool tokens (per replica)", _n(p.kv_pool_tokens), _n(m.get("kv_tokens"))),
        ("full-length requests that fit", _n(p.full_length_requests), _n(m.get("max_concurrency"))),
    ]
    if p.calibrated and p.calibrated.get("kv_pool_tokens") is not None:
        rows.append(("pool tokens from measured floor", _n(p.calibrated["kv_pool_tokens"]), ""))
    if p.need_bytes_per_gpu:
        # its basis is a prediction's reasoning, so it goes under "predicted", as "weights basis" does
        rows.append(("a start needs free per GPU", gib(p.need_bytes_per_gpu), ""))
        if p.need_basis:
            rows.append(("start need basis", p.need_basis, ""))
    for label, a, b in rows:
        t.add_row(Text(label), Text(a), Text(b))
    console.print(t)
    if last:
        err = last.get("kv_tokens_error_pct")
        console.print(f"last measured: {last.get('at')} (build {last.get('build')})"
                      + (f", KV tokens off the prediction made then by {err:+.2f}%" if err is not None else ""))
    else:
        console.print("[dim]no boot of this model+build measured yet[/]")
    for n in p.notes:
        console.print(f"[yellow]note:[/] {n}")


@app.command()
def gpu(json_out: bool = typer.Option(False, "--json"),
        watch: bool = typer.Option(False, "--watch", help="sample power, energy, clocks and throttling live, as "
                                                          "a run's telemetry does (Ctrl-C ends)"),
        interval: str = typer.Option("0.5s", "--interval", help="with --watch: time between samples"),
        count: Optional[int] = typer.Option(None, "--count", help="with --watch: stop after this many rounds")) -> None:
    """GPUs, memory, power, and which process (and which servedeck model) holds what."""
    from servedeck.gpu import inventory
    from servedeck.gpu.holders import holders

    if watch:
        from servedeck.cli.gpu_watch import watch_gpus
        from servedeck.timeparse import seconds

        watch_gpus(seconds(interval, "--interval"), count, json_out)
        return

    inv = inventory()
    hs = holders(inv) if inv.available else []
    if json_out:
        print_json({**inv.to_json(), "holders": [h.to_json() for h in hs]})
        return
    if not inv.available:
        console.print(f"[dim]no GPUs: {inv.reason}[/]")
        return
    t = Table(title=f"GPUs (driver {inv.driver_version}, CUDA {inv.cuda_driver_version})")
    for col in ("GPU", "name", "used", "free", "total", "power", "limit", "util"):
        t.add_column(col, justify="right" if col not in ("name",) else "left")
    for g in inv.gpus:
        t.add_row(str(g.index), g.name, gib(g.memory_used), gib(g.memory_free), gib(g.memory_total),
                  f"{g.power_w:g} W" if g.power_w is not None else "—",
                  f"{g.power_limit_w:g} W" if g.power_limit_w is not None else "—",
                  f"{g.utilization_pct}%" if g.utilization_pct is not None else "—")
    console.print(t)
    if hs:
        h = Table(title="who holds GPU memory")
        for col in ("GPU", "pid", "model", "process", "user", "memory"):
            h.add_column(col)
        for x in hs:
            who = (x.model + (f" (asleep, level {x.asleep_level}: `servedeck stop {x.model}` frees it)"
                              if x.asleep_level else "")) if x.model else "—"
            h.add_row(str(x.gpu), str(x.pid), who, x.process, x.user or "?", gib(x.used_bytes))
        console.print(h)
    else:
        console.print("no compute processes on any GPU")


def _identified(r: dict) -> dict:
    """A crash record with its build and engine version; a record from before they were kept is given
    them from its launch folder (launch.json's build, the boot log's version) where that folder is left."""
    if r.get("build") and r.get("engine_version"):
        return r
    out = dict(r)
    d = Path(r["launch_dir"]) if r.get("launch_dir") else None
    for name, key in (("launch.json", "build"), ("launch.json", "engine_version"), ("boot.json", "engine_version")):
        if d is None or out.get(key):
            continue
        try:
            out[key] = json.loads((d / name).read_text()).get(key)
        except (OSError, ValueError, AttributeError):
            pass
    return out


def _kernel_words(c: dict) -> str:
    parts = []
    for k in c.get("kernel") or []:
        whose = k.get("whose") or "not this model's"
        mark = "" if k.get("ours") is not False else f" ({whose})"
        parts.append(f"Xid {k.get('code')}{mark}")
    return ", ".join(parts)


@app.command()
def crashes(
    model: Optional[str] = typer.Argument(None, help="model or alias (default: all)"),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Crash history from the journal, with classified causes, grouped by build and engine version."""
    name = None
    if model:
        try:
            name = load_config().resolve(model)
        except UnknownModelError:
            name = model  # a model removed from models.toml still has history
    # a crash while serving, or a start that died before it was ready: both ended other than by `stop`
    journal = read_jsonl(paths.journal_file())
    warn_unreadable(journal, paths.journal_file())
    recs = [_identified(r) for r in journal
            if (r.get("event") == "crash" or (r.get("event") == "start" and r.get("outcome") == "failed"
                                              and r.get("cause")))
            and (name is None or r.get("model") == name)]
    if json_out:
        print_json(recs)
        return
    if not recs:
        console.print(f"no crashes recorded{' for ' + name if name else ''} ({paths.journal_file()})")
        return
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in recs:  # "must not be counted against 0.29.0": each build and version is counted apart
        groups.setdefault((str(r.get("build") or "build not recorded"),
                           str(r.get("engine_version") or "version not recorded")), []).append(r)
    for (build, version), rows in groups.items():
        t = Table(title=f"crashes of build {build}, engine {version}: {len(rows)}")
        for col in ("when", "model", "cause", "family", "evidence", "to do"):
            t.add_column(col, overflow="fold")
        for r in rows:
            c = r.get("cause") or {}
            xids = _kernel_words(c)
            ev = c.get("matched_line", "")[:120] + (f" [{xids}]" if xids else "")
            t.add_row(*(Text(x) for x in (str(r.get("at") or r.get("ts") or r.get("time") or "?"),
                                          str(r.get("model", "?")), f"{c.get('id', '?')}: {c.get('summary', '')}",
                                          c.get("family", ""), ev, c.get("action", ""))))
        console.print(t)


@app.command("verify-build")
def verify_build_cmd(
    build: str = typer.Argument(..., help="a [builds.NAME] from models.toml"),
    json_out: bool = typer.Option(False, "--json"),
) -> None:
    """Does the install match its package records? (pip RECORD hashes, untracked files, requires paths)"""
    from servedeck.doctor.build import verify_build

    cfg = load_config()
    if build not in cfg.deck.builds:
        known = ", ".join(sorted(cfg.deck.builds)) or "(none)"
        raise UnknownModelError(f"no build named {build!r}", hint=f"builds defined: {known}")
    rep = verify_build(cfg.deck.builds[build], build, cfg)
    _keep_verdict(rep)
    if json_out:
        print_json(rep.to_json())
    else:
        console.print(f"[bold]{build}[/] ({rep.kind}) {rep.path}: "
                      + (f"{rep.engine} {rep.engine_version}" if rep.engine_version else "version unknown"))
        for p in rep.problems:
            console.print(f"[red]problem:[/] {p}")
        if rep.integrity_checked:
            style = "green" if rep.intact else "yellow"
            console.print(f"[{style}]{rep.files_matched:,} of {rep.files_total:,} files match their RECORD hashes[/] "
                          f"({rep.dists} distributions in {rep.site_packages})")
            for label, items in (("changed", rep.changed), ("missing", rep.missing),
                                 ("untracked under the engine package", rep.untracked),
                                 ("distributions without RECORD", rep.no_record), ("editable", rep.editable)):
                if items:
                    console.print(f"{label} ({len(items)}):")
                    for i in items[:50]:
                        console.print(f"  {i}", markup=False)
                    if len(items) > 50:
                        console.print(f"  … {len(items) - 50} more (--json lists all)")
        else:
            console.print(f"[dim]integrity: SKIP ({rep.integrity_skip})[/]")
        for r in rep.requires:
            console.print(f"requires {r.path}: {'[green]' if r.ok else '[red]'}{r.saw}[/]")
    if not rep.exists or (rep.integrity_checked and not rep.intact) or any(not r.ok for r in rep.requires):
        raise typer.Exit(1)


def _keep_verdict(rep: Any) -> None:
    """The verdict is kept for `servedeck page` (doctor/verified.py); a state dir that cannot be written
    is said, and the verification itself still reported."""
    from servedeck.deck.state import now_iso
    from servedeck.doctor.verified import record_verification, verified_file

    try:
        record_verification(rep, now_iso())
    except OSError as e:
        err_console.print(Text("warning: ", style="yellow") + Text(
            f"the verdict could not be kept in {verified_file(rep.build)}: {e.strerror or e}; "
            "`servedeck page` will not know of this verification"), highlight=False, soft_wrap=True)
