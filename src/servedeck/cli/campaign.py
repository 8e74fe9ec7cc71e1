"""Campaign commands: gate, bench, ramp, runs, show. Parse, call one function, render."""

from __future__ import annotations

import asyncio
from pathlib import Path

from typing import Any, Callable, Coroutine, Optional

import typer
from rich.markdown import Markdown
from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from servedeck.campaign import BenchSpec, Outcome, RampSpec, compare_runs, measured, session
from servedeck.campaign.bench import DEFAULTS, ArrivalsChoice, ContentChoice, WorkloadChoice, shape_label
from servedeck.campaign import capacity as capacity_search
from servedeck.campaign import conversations as talks
from servedeck.campaign import shared_prefix as shared
from servedeck.campaign import trace as replay
from servedeck.campaign.target import Target
from servedeck.cli.accuracy import gate_eval, without_eval
from servedeck.cli.app import app, configured_results_dir, console, err_console, load_config, print_json
from servedeck.errors import ServedeckError, UsageError
from servedeck.gates import GateSpec, ProbeResult
from servedeck.loadgen import Progress as LoadProgress, Slo
from servedeck.loadgen.loop import run as run_loop
from servedeck.report import list_row, markdown
from servedeck.report.workloads import outputs_markdown
from servedeck.runs import find_run, list_runs, load, runs_root
from servedeck.timeparse import seconds


# --- parsing --------------------------------------------------------------------------------------

def _numbers(text: str, what: str, kind: type = int) -> list[Any]:
    try:
        vals = [kind(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UsageError(f"{what}: {text!r} is not a comma-separated list of numbers",
                         hint=f"write it like {what} 1,4,16") from None
    if not vals or any(v <= 0 for v in vals):
        raise UsageError(f"{what}: every value must be above 0, got {text!r}", hint=f"write it like {what} 1,4,16")
    return vals


def _depths(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(x) for x in text.replace(" ", "").split(",") if x)
    except ValueError:
        raise UsageError(f"--depths: {text!r} is not a list of fractions", hint="write it like 0.1,0.5,0.9") from None


def _slo(text: Optional[str]) -> Optional[Slo]:
    if not text:
        return None
    bounds: dict[str, float] = {}
    for part in text.replace(" ", "").split(","):
        key, eq, value = part.partition("=")
        if not eq or key not in ("ttft", "tpot", "e2e"):
            raise UsageError(f"--slo: {part!r} is not ttft=…, tpot=… or e2e=…",
                         hint="write it like ttft=2s,tpot=50ms (with --find: ttft_p95<=2s,tpot_p95<=50ms)")
        bounds[f"{key}_ms"] = seconds(value, f"--slo {key}") * 1000
    return Slo(**bounds)


# --- progress -------------------------------------------------------------------------------------

class RichReporter:
    """Progress on stderr (stdout stays clean for --json): one bar for the gate, one per point."""

    def __init__(self) -> None:
        self.bar = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(),
                            TextColumn("{task.fields[info]}"), TimeElapsedColumn(), console=err_console,
                            transient=False)
        self.tasks: dict[str, Any] = {}

    def __enter__(self) -> "RichReporter":
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def stage(self, text: str) -> None:
        self.bar.console.print(f"[dim]{text}[/]", highlight=False)

    def gate_start(self, probes: int, context: int) -> None:
        self.tasks["gate"] = self.bar.add_task(f"gate niah @ {context} tokens", total=probes, info="")

    def gate_probe(self, r: ProbeResult) -> None:
        mark = "[green]found[/]" if r.ok else "[red]MISSED[/]"
        self.bar.console.print(f"  probe key={r.key} depth={r.depth} tokens={r.prompt_tokens} {mark} "
                               f"{r.latency_s:.1f} s  {r.answer[:60]!r}", highlight=False)
        self.bar.advance(self.tasks["gate"])

    def point_start(self, label: str, total: Optional[int], duration_s: Optional[float]) -> None:
        self.tasks[label] = self.bar.add_task(f"point {label}", total=total or duration_s, info="")

    def progress(self, label: str, p: LoadProgress) -> None:
        task = self.tasks.get(label)
        if task is None or p.phase != "measured":
            return
        done = p.done if p.total else min(p.elapsed_s, p.duration_s or p.elapsed_s)
        self.bar.update(task, completed=done, info=f"{p.done} done, {p.errors} errors, {p.in_flight} in flight")

    def point_done(self, label: str, point: dict[str, Any]) -> None:
        task = self.tasks.get(label)
        if task is not None:
            self.bar.update(task, completed=self.bar.tasks[task].total or 0, info=point.get("status", ""))


def _guarded(outcome: "Outcome", run: Callable[["RichReporter"], object]) -> None:
    """Run a gate or bench under a progress display; on Ctrl-C or an error, say where the folder is."""
    try:
        with RichReporter() as rep:
            run(rep)
    except KeyboardInterrupt:
        _ended(outcome, True)
        raise typer.Exit(130)
    except ServedeckError:
        _ended(outcome, False)
        raise


def _ended(outcome: Outcome, interrupted: bool) -> None:
    if outcome.folder is not None:
        what = "interrupted; the run folder keeps every finished request" if interrupted else "run folder"
        err_console.print(f"{what}: {outcome.folder}", highlight=False, soft_wrap=True)


# --- commands -------------------------------------------------------------------------------------

@app.command()
def gate(
    model: str,
    context: Optional[int] = typer.Option(None, "--context", help="tokens each probe fills (default: what the server serves per request)"),
    depths: str = typer.Option("0.1,0.5,0.9", "--depths", help="where the code is planted, as fractions of the prompt"),
    repeats: int = typer.Option(1, "--repeats", help="probes per depth, each with its own haystack and code"),
    threshold: Optional[float] = typer.Option(None, "--threshold", help="pass when the score is at least this (the needle: 0.67, rounded to 2 decimals; --eval: required)"),
    seed: Optional[int] = typer.Option(None, "--seed", help="reproduce an earlier gate's haystacks and codes"),
    answer_tokens: int = typer.Option(32, "--answer-tokens", help="room for each answer (a reasoning model needs more, or `request` in models.toml)"),
    eval_ref: Optional[str] = typer.Option(None, "--eval", help="an accuracy gate instead of the needle: PATH.jsonl (questions scored by servedeck) or lm-eval:TASK"),
    limit: Optional[int] = typer.Option(None, "--limit", help="--eval: ask only the first N questions"),
    concurrency: int = typer.Option(8, "--concurrency", help="--eval: questions in flight at once"),
    task_dir: Optional[str] = typer.Option(None, "--task-dir", help="--eval lm-eval:TASK: the folder holding the task's YAML"),
    launch: bool = typer.Option(False, "--launch", help="start the model for this run and stop it afterwards"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Correctness gate: find a planted 7-digit code at each depth of a context-sized prompt (or, with --eval, answer questions)."""
    cfg = load_config()
    if eval_ref is not None:
        return gate_eval(cfg, model, eval_ref, threshold, limit, concurrency, task_dir, answer_tokens, launch, as_json)
    without_eval(limit, concurrency, task_dir)
    spec = GateSpec(context=context or 0, depths=_depths(depths), repeats=repeats,
                    threshold=0.67 if threshold is None else threshold, seed=seed, answer_tokens=answer_tokens)
    outcome = Outcome()
    def run(rep: RichReporter) -> None:
        with measured(cfg, model, launch, outcome) as target:
            asyncio.run(session.gate(target, spec, reporter=rep, outcome=outcome))

    _guarded(outcome, run)
    view = load(outcome.folder) if outcome.folder else {}
    if as_json:
        print_json(view)
    else:
        g = view["gate"]
        console.print(f"GATE niah score= {round(g['result']['score'], 2)}", highlight=False)
        colour = "green" if g["status"] == "passed" else "red"
        console.print(f"[{colour}]gate {g['status']}[/]: {g['result']['found']}/{g['result']['probes']} found, "
                      f"threshold {g['result']['threshold']}", highlight=False)
        _ended(outcome, False)
    if view.get("gate", {}).get("status") != "passed":
        raise typer.Exit(1)


# Options `bench` and `ramp` share, so both say the same thing.
_GATE = typer.Option(None, "--gate/--no-gate", help="default: reuse this launch's gate, else run one")
_GATE_CONTEXT = typer.Option(None, "--gate-context", help="context for the gate (default: the server's)")
_GATE_ANSWER_TOKENS = typer.Option(32, "--gate-answer-tokens", help="room for each gate answer")
_STALL_AFTER = typer.Option("5m", "--stall-after", help="no byte for this long: the engine's counters tell "
                                                         "stalled (ended, recorded) from slow")
_LAUNCH = typer.Option(False, "--launch", help="start the model for this run and stop it afterwards")
_CONTENT_HELP = ("what follows each prompt's unique tag: random (common words, cache-free baselines), prose "
                 "(Python's documentation topics) or code (the standard library's sources)")


@app.command()
def bench(
    model: str,
    workload: WorkloadChoice = typer.Option(WorkloadChoice.chat, "--workload", help="chat (--input-tokens/"
                                            "--output-tokens per request) | long-prompt (a prompt near the context) | "
                                            "decode (one fixed prompt: TPOT and decode tok/s only) | ramp (one "
                                            "conversation grown turn by turn, as `servedeck ramp`) | conversations "
                                            "(--users at once, --turns each, the whole history every turn) | "
                                            "shared-prefix (--groups of --group-size requests sharing --prefix-tokens) | "
                                            "trace (--trace FILE replayed on its own schedule)"),
    concurrency: Optional[str] = typer.Option(None, "--concurrency", help="closed-loop points, e.g. 1,4,16"),
    rate: Optional[str] = typer.Option(None, "--rate", help="open-loop points in requests/s, e.g. 2,4,8"),
    arrivals: ArrivalsChoice = typer.Option(ArrivalsChoice.poisson, "--arrivals", help="with --rate: poisson (random "
                                            "gaps at the given mean rate) | constant (evenly spaced)"),
    input_tokens: int = typer.Option(1024, "--input-tokens", help="chat: prompt tokens as the server counts them"),
    output_tokens: Optional[int] = typer.Option(None, "--output-tokens", help="default " + ", ".join(
        f"{d.output_tokens} ({kind})" for kind, d in DEFAULTS.items())),
    prompt_tokens: Optional[int] = typer.Option(None, "--prompt-tokens", help="long-prompt: default context − output"),
    duration: Optional[str] = typer.Option(None, "--duration", help="per point, e.g. 60s (default for chat)"),
    requests: Optional[int] = typer.Option(None, "--requests", help="per point (long-prompt default 3)"),
    warmup: int = typer.Option(1, "--warmup", help="warm-up requests per point, with their own prompts"),
    slo: Optional[str] = typer.Option(None, "--slo", help="goodput bounds, e.g. ttft=2s,tpot=50ms; with --find "
                                      "the target, e.g. ttft_p95<=2s,tpot_p95<=50ms,itl_p99<=100ms,error_rate<=1%"),
    find: Optional[capacity_search.FindChoice] = typer.Option(None, "--find", help="max-concurrency (closed loop) | "
                                                              "max-rate (open loop): search for the most load within --slo"),
    max_load: Optional[float] = typer.Option(None, "--max", help="--find: the highest load to try (default 512 "
                                             "streams, 256 req/s; the engine's slots and KV cache also cap it)"),
    resolution: Optional[str] = typer.Option(None, "--resolution", help="--find: how close the boundary must be, "
                                             "10% (default) of the first failing load, or a step like 2"),
    gate_flag: Optional[bool] = _GATE,
    gate_context: Optional[int] = _GATE_CONTEXT,
    repeat_prompt: bool = typer.Option(False, "--repeat-prompt", help="send one prompt over and over: shows the prefix cache at work; not a benchmark"),
    seed: Optional[int] = typer.Option(None, "--seed", help="the same prompts in every launch with the same seed (compare pairs them); on a server that already saw them they come from the prefix cache"),
    content: Optional[ContentChoice] = typer.Option(None, "--content", help=_CONTENT_HELP + "; default random, prose for the ramp"),
    request_timeout: Optional[str] = typer.Option(None, "--request-timeout", help="per request, e.g. 30m, or none (default 10m for chat, none for long-prompt and ramp)"),
    stall_after: str = _STALL_AFTER,
    check_outputs: bool = typer.Option(False, "--check-outputs", help="first answer 8 fixed prompts greedily into outputs.jsonl (see compare-outputs)"),
    gate_answer_tokens: int = _GATE_ANSWER_TOKENS,
    turn_tokens: Optional[str] = typer.Option(None, "--turn-tokens", help="ramp, conversations: text tokens each turn adds (default 2000 for the ramp, 256 for conversations); conversations also take a distribution drawn per turn: uniform:128-384, normal:256,64, exp:256"),
    answer_tokens: str = typer.Option("64", "--answer-tokens", help="ramp, conversations: room for each answer; conversations also take a distribution, as --turn-tokens"),
    max_context: Optional[int] = typer.Option(None, "--max-context", help="ramp, conversations: stop before a conversation passes this (default: the server's context)"),
    users: int = typer.Option(4, "--users", help="conversations: users talking at once"),
    turns: int = typer.Option(4, "--turns", help="conversations: turns per conversation"),
    think_time: str = typer.Option("0", "--think-time", help="conversations: pause between an answer and the next turn, e.g. 2s, or drawn per turn: uniform:1s-3s, exp:2s"),
    system_prompt_tokens: int = typer.Option(0, "--system-prompt-tokens", help="conversations: a system prompt of this many tokens shared by every user (0: none)"),
    groups: int = typer.Option(4, "--groups", help="shared-prefix: groups of requests, each its own prefix"),
    group_size: int = typer.Option(4, "--group-size", help="shared-prefix: requests per group"),
    prefix_tokens: int = typer.Option(1024, "--prefix-tokens", help="shared-prefix: tokens the requests of a group share"),
    suffix_tokens: int = typer.Option(64, "--suffix-tokens", help="shared-prefix: each request's own tokens after the prefix"),
    trace_file: Optional[str] = typer.Option(None, "--trace", help="trace: a JSONL trace (timestamp ms, input_length, output_length, hash_ids; docs/workloads.md)"),
    time_scale: float = typer.Option(1.0, "--time-scale", help="trace: its gaps × this (0.5: twice as fast)"),
    window: Optional[str] = typer.Option(None, "--window", help="trace: only its first stretch, e.g. 10m"),
    block_tokens: int = typer.Option(512, "--block-tokens", help="trace: tokens per hash_ids block (Mooncake's: 512)"),
    needle_every: int = typer.Option(4, "--needle-every", help="ramp: ask for the code planted in turn 1 every N turns (0: never)"),
    time_cap: str = typer.Option("2h", "--time-cap", help="ramp: stop after this long"),
    turn_timeout: str = typer.Option("20m", "--turn-timeout", help="ramp: a turn taking longer ends the ramp"),
    stop_on_miss: bool = typer.Option(False, "--stop-on-miss", help="ramp: stop at the first needle missed"),
    client_procs: int = typer.Option(1, "--client-procs", help="split the streams over N client processes (one schedule); for hosts with spare cores"),
    launch: bool = _LAUNCH,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Benchmark MODEL: gate, then one measured point per concurrency or rate (or the conversation ramp), recorded as a run folder."""
    gate_spec = GateSpec(context=gate_context or 0, answer_tokens=gate_answer_tokens)
    if workload is WorkloadChoice.conversations:
        vspec = talks.spec_from_options(
            users=users, turns=turns, turn_tokens=turn_tokens, answer_tokens=answer_tokens, think_time=think_time,
            system_prompt_tokens=system_prompt_tokens, content=content.value if content else None, seed=seed,
            request_timeout_s=_limit(request_timeout, "--request-timeout") if request_timeout else "default",
            max_context=max_context)
        _measure(model, launch, as_json, lambda target, rep, outcome: talks.conversations(
            target, vspec, gate_mode=gate_flag, gate_spec=gate_spec, reporter=rep, outcome=outcome))
        return
    if workload is WorkloadChoice.trace:
        if not trace_file:
            raise UsageError("--workload trace replays a file: give --trace FILE",
                             hint="make a small one with scripts/make_trace.py OUT.jsonl")
        tspec = replay.TraceSpec(path=Path(trace_file), time_scale=time_scale, block_tokens=block_tokens,
                                 window_s=seconds(window, "--window") if window else None,
                                 content=content.value if content else "prose", seed=seed,
                                 request_timeout_s=_limit(request_timeout, "--request-timeout") if request_timeout
                                 else 600.0)
        tspec.check()  # the trace read whole, before any launch
        _measure(model, launch, as_json, lambda target, rep, outcome: replay.trace(
            target, tspec, gate_mode=gate_flag, gate_spec=gate_spec, reporter=rep, outcome=outcome))
        return
    if workload is WorkloadChoice.shared_prefix:
        pspec = shared.spec_from_options(
            groups=groups, group_size=group_size, prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens,
            output_tokens=output_tokens, concurrency=_numbers(concurrency, "--concurrency") if concurrency else None,
            content=content.value if content else None, seed=seed,
            request_timeout_s=_limit(request_timeout, "--request-timeout") if request_timeout else "default")
        _measure(model, launch, as_json, lambda target, rep, outcome: shared.shared_prefix(
            target, pspec, gate_mode=gate_flag, gate_spec=gate_spec, reporter=rep, outcome=outcome))
        return
    if workload is WorkloadChoice.ramp:
        # --request-timeout, when given, bounds each turn (as it bounds each request of the other workloads)
        rspec = _ramp_spec(2000 if turn_tokens is None else _whole(turn_tokens, "--turn-tokens"),
                           _whole(answer_tokens, "--answer-tokens"), max_context, needle_every, time_cap,
                           (request_timeout, "--request-timeout") if request_timeout else (turn_timeout, "--turn-timeout"),
                           stop_on_miss, content or ContentChoice.prose, stall_after, seed)
        _measure(model, launch, as_json, lambda target, rep, outcome: session.ramp(
            target, rspec, gate_mode=gate_flag, gate_spec=gate_spec, reporter=rep, outcome=outcome))
        return
    if find is not None and (concurrency or rate):
        raise UsageError("--find chooses the loads itself: drop --concurrency/--rate",
                         hint="bound the search with --max (and its step with --resolution)")
    if find is None and (max_load is not None or resolution is not None):
        raise UsageError("--max and --resolution bound a capacity search", hint="add --find max-concurrency --slo ...")
    stall_s = _limit(stall_after, "--stall-after")
    spec = BenchSpec.from_options(
        workload, concurrency=_numbers(concurrency, "--concurrency") if concurrency else None,
        rate=_numbers(rate, "--rate", float) if rate else None, arrivals=arrivals,
        input_tokens=input_tokens, output_tokens=output_tokens, prompt_tokens=prompt_tokens,
        duration_s=seconds(duration, "--duration") if duration else None, requests=requests, warmup=warmup,
        slo=None if find else _slo(slo), repeat_prompt=repeat_prompt, seed=seed, content=content,
        request_timeout_s=_limit(request_timeout, "--request-timeout") if request_timeout else "default",
        stall_after_s=stall_s, check_outputs=check_outputs, client_procs=client_procs)
    if find is not None:  # everything is checked before anything launches
        cspec = capacity_search.spec_from_options(find.value, slo, spec, max_load=max_load, resolution=resolution,
                                                  arrivals=arrivals.value)
        _measure(model, launch, as_json, lambda target, rep, outcome: capacity_search.capacity(
            target, cspec, gate_mode=gate_flag, gate_spec=gate_spec, reporter=rep, outcome=outcome))
        return
    _measure(model, launch, as_json, lambda target, rep, outcome: session.bench(
        target, spec, gate_mode=gate_flag, gate_spec=gate_spec, reporter=rep, outcome=outcome))


@app.command()
def ramp(
    model: str,
    turn_tokens: int = typer.Option(2000, "--turn-tokens", help="text tokens each turn adds"),
    answer_tokens: int = typer.Option(64, "--answer-tokens", help="room for each answer"),
    max_context: Optional[int] = typer.Option(None, "--max-context", help="stop before the conversation passes this (default: the server's context)"),
    needle_every: int = typer.Option(4, "--needle-every", help="ask for the code planted in turn 1 every N turns (0: never)"),
    time_cap: str = typer.Option("2h", "--time-cap", help="stop after this long, or none"),
    turn_timeout: str = typer.Option("20m", "--turn-timeout", help="a turn taking longer ends the ramp, or none"),
    stop_on_miss: bool = typer.Option(False, "--stop-on-miss", help="stop at the first needle missed"),
    content: ContentChoice = typer.Option(ContentChoice.prose, "--content", help=_CONTENT_HELP + " (the ramp takes prose or code)"),
    stall_after: str = _STALL_AFTER,
    seed: Optional[int] = typer.Option(None, "--seed", help="the same tag, code and text in every launch with the same seed"),
    gate_flag: Optional[bool] = _GATE,
    gate_context: Optional[int] = _GATE_CONTEXT,
    gate_answer_tokens: int = _GATE_ANSWER_TOKENS,
    launch: bool = _LAUNCH,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Grow one conversation with MODEL turn by turn to its cut-off (context, time cap, a missed needle), after
    the gate, recorded as a run folder: the same run as `servedeck bench MODEL --workload ramp`."""
    gate_spec = GateSpec(context=gate_context or 0, answer_tokens=gate_answer_tokens)
    rspec = _ramp_spec(turn_tokens, answer_tokens, max_context, needle_every, time_cap,
                       (turn_timeout, "--turn-timeout"), stop_on_miss, content, stall_after, seed)
    _measure(model, launch, as_json, lambda target, rep, outcome: session.ramp(
        target, rspec, gate_mode=gate_flag, gate_spec=gate_spec, reporter=rep, outcome=outcome))


def _whole(text: str, flag: str) -> int:
    """A ramp's token count: one whole number (a distribution is for --workload conversations)."""
    try:
        return int(text)
    except ValueError:
        raise UsageError(f"{flag}: {text!r} is not a whole number of tokens",
                         hint="the ramp takes one value, e.g. 2000; distributions are for --workload conversations") \
            from None


def _ramp_spec(turn_tokens: int, answer_tokens: int, max_context: Optional[int], needle_every: int, time_cap: str,
               turn_timeout: tuple[str, str], stop_on_miss: bool, content: str, stall_after: str,
               seed: Optional[int]) -> RampSpec:
    """The ramp's options → its spec. `turn_timeout`: the text and the option it came from."""
    stall_s = _limit(stall_after, "--stall-after")
    spec = RampSpec(turn_tokens=turn_tokens, answer_tokens=answer_tokens, max_context=max_context,
                    needle_every=needle_every, time_cap_s=_limit(time_cap, "--time-cap"),
                    turn_timeout_s=_limit(*turn_timeout), stop_on_miss=stop_on_miss,
                    content=ContentChoice(content).value, stall_after_s=stall_s, seed=seed)
    spec.check(None)  # what needs no server, before any launch; the context is checked once it is known
    return spec


def _measure(model: str, launch: bool, as_json: bool,
             work: Callable[[Target, RichReporter, Outcome], Coroutine[Any, Any, Outcome]]) -> None:
    """Open MODEL (starting it with --launch), run `work` on it under a progress display, show the run."""
    cfg, outcome = load_config(), Outcome()

    def run(rep: RichReporter) -> None:
        with measured(cfg, model, launch, outcome) as target:
            # uvloop when installed: the load generator's timestamps want the cheaper loop
            run_loop(work(target, rep, outcome))

    _guarded(outcome, run)
    _show(outcome, as_json)


def _limit(text: str, what: str) -> Optional[float]:
    """A time limit, or None for `none`/`0` (no limit)."""
    if text.strip().lower() in ("none", "0", "off"):
        return None
    value = seconds(text, what)
    if value <= 0:
        raise UsageError(f"{what} must be above 0 or none, got {text!r}", hint=f"write it like {what} 30m")
    return value


def _show(outcome: Outcome, as_json: bool) -> None:
    view = load(outcome.folder) if outcome.folder else {}
    if as_json:
        print_json(view)
        return
    console.print(Markdown(markdown(view)))
    _ended(outcome, False)


@app.command("compare-outputs")
def compare_outputs(run_a: str = typer.Argument(..., help="run folder with outputs.jsonl (name, unique part, path or `last`)"),
                    run_b: str = typer.Argument(..., help="the run to compare it with"),
                    as_json: bool = typer.Option(False, "--json")) -> None:
    """Greedy outputs of two runs (`bench --check-outputs`), token by token: identical, or where they part."""
    root = runs_root(configured_results_dir())
    result = compare_runs(find_run(root, run_a), find_run(root, run_b))
    if as_json:
        print_json(result)
    else:
        console.print(Markdown(outputs_markdown(result)))
    if result["verdict"] != "identical":
        raise typer.Exit(1)


@app.command()
def runs(as_json: bool = typer.Option(False, "--json"), limit: int = typer.Option(50, "-n", help="the latest N"),
         campaign: Optional[str] = typer.Option(None, "--campaign", help="only the runs of this campaign (name or folder)")) -> None:
    """Run folders: model, engine, layout, context, gate, headline figures (rebuilt from each folder)."""
    root = runs_root(configured_results_dir())
    paths = list_runs(root)
    if campaign:
        paths = [p for p in paths if _in_campaign(p, campaign)]
    rows = [list_row(load(p)) for p in paths[-limit:]]
    if as_json:
        print_json(rows)
        return
    if not rows:
        console.print(f"no runs under {root}", highlight=False)
        return
    # One line per run, figures indented below: the folder name already says model, layout,
    # context and engine, and a fixed-width table would crush it on an 80-column terminal.
    width = max(len(r["run"]) for r in rows)
    for r in rows:
        result = r["kind"] == "gate" or r["gate"].startswith("passed")
        gate_txt = r["gate"] if result else f"[yellow]{r['gate']}: not a result[/]"
        status = "[red]FAILED[/]" if r["status"] == "failed" else r["status"]
        what = r["workload"] or r["kind"] or "-"
        console.print(f"{r['run']:<{width}}  {what:<11}  {status}  gate {gate_txt}", highlight=False, soft_wrap=True)
        if r["kind"] != "gate" and r["headline"] != "-":
            console.print(f"    {r['headline']}", highlight=False)
        if r["status"] == "failed" and r.get("reason"):
            console.print(f"    [red]{r['reason']}[/]", highlight=False)


@app.command()
def show(run: str = typer.Argument(..., help="run folder name, a unique part of it, a path, or `last`"),
         as_json: bool = typer.Option(False, "--json")) -> None:
    """One run's summary, rebuilt from its folder."""
    path = find_run(runs_root(configured_results_dir()), run)
    view = load(path)
    if as_json:
        print_json(view)
        return
    console.print(Markdown(markdown(view)))
    console.print(f"folder: {path}", highlight=False, soft_wrap=True)


def _in_campaign(path: Any, name: str) -> bool:
    from servedeck.runs.read import summary_of

    c = summary_of(path).get("campaign") or {}
    return name in (c.get("name"), c.get("folder"))


__all__ = ["bench", "compare_outputs", "gate", "ramp", "runs", "show", "shape_label"]
