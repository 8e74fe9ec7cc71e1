"""Sleeping and waking a launch: the effects. deck/sleeping.py decides (which level, what a switch does,
which sleeper to stop); the engine adapter says how its server sleeps (engines/sleepmode.py); this
module sends the calls, measures what the model holds, checks its answers after the first wake and
records every step. It runs inside the deck's operations (DeckOps), with the deck's lock held: only
the deck moves a launch to or from `asleep`.

Sleeping a launch, in order:
  1. the live record says `asleep` (with the level) before the engine is told, so a servedeck killed
     mid-call leaves a model that nobody routes to, and the next wake (idempotent) brings it back;
  2. the adapter's sleep calls (vLLM: POST /sleep?level=N&mode=wait), then its own answer that it
     sleeps (vLLM: GET /is_sleeping) within the model's stop_timeout_s;
  3. what its processes hold per GPU, before and after (NVML by pid), and at level 1 the pinned host
     memory it keeps (its weights, the planner's size) go into the record and the journal.
A call that fails stops the model cold (its state is no longer known), and says so.

Waking, in order: the adapter's wake calls (level 2: weights back, reloaded from disk, KV cache back,
prefix cache reset) within the model's ready_timeout_s, its answer that it is awake, one real
completion; then, the first time a launch wakes, the fixed greedy prompts (loadgen/outputs.py)
answered again and compared token by token with the answers it gave after it became ready, before
it ever slept. A wake that fails or times out, or answers that differ, end in a cold restart (a stop
and a fresh start), recorded with both continuations.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Optional

import httpx
import psutil

from servedeck.deck import launch as L
from servedeck.deck import state as S
from servedeck.deck.records import LaunchState, LiveRecord
from servedeck.deck.sleeping import HostMemory, Sleeper
from servedeck.engines import get_engine
from servedeck.engines.sleepmode import Call
from servedeck.fsio import atomic_write_json, atomic_write_text
from servedeck.gpu.nvml import GiB, gib
from servedeck.supervisor import process as P
from servedeck.supervisor import ready as R

if TYPE_CHECKING:
    from servedeck.config import Config

REFERENCE_FILE = "sleep_reference.jsonl"  # in the launch folder: the answers before the first sleep
CHECK_FILE = "wake_check.json"  # the first wake's answers and their comparison
# per prompt: the campaign's 8 prompts with shorter answers, asked one at a time (batch-invariant); about a
# second of decoding on an H200 at 8B, which the first wake of a launch pays. Weights restored wrong show
# in the first tokens.
CHECK_TOKENS = 16
ASLEEP_WAIT_S = 30.0  # after the sleep calls returned: how long the engine may take to say it sleeps

Step = Callable[[str], None]  # told, before each phase of a switch, what a waiting request now waits on


class SleepFailed(Exception):
    """A call of a sleep or wake sequence failed, or the engine did not say what it was asked to be."""


def send(rec: LiveRecord, calls: list[Call], timeout_s: float) -> list[dict[str, Any]]:
    """The calls in order, each within `timeout_s`; what each answered and took. SleepFailed names
    the one that failed."""
    done: list[dict[str, Any]] = []
    with httpx.Client(base_url=rec.base_url, timeout=timeout_s) as client:
        for call in calls:
            t0 = time.monotonic()
            try:
                r = client.request(call.method, call.path, params=list(call.params), json=call.json)
            except httpx.HTTPError as e:
                raise SleepFailed(f"{call.describe()} failed after {time.monotonic() - t0:.1f} s: "
                                  f"{type(e).__name__}: {e}") from None
            took = round(time.monotonic() - t0, 3)
            if r.status_code >= 400:
                raise SleepFailed(f"{call.describe()} answered HTTP {r.status_code}: {r.text[:300]}")
            done.append({"call": call.describe(), "status": r.status_code, "took_s": took})
    return done


def asleep_now(rec: LiveRecord, timeout_s: float = 5.0) -> Optional[bool]:
    """The engine's own word on whether it sleeps; None when it has no such question or no answer."""
    engine = get_engine(rec.engine)
    call = engine.asleep_call
    if call is None:
        return None
    try:
        r = httpx.request(call.method, rec.base_url + call.path, params=list(call.params), json=call.json,
                          timeout=timeout_s)
        return engine.is_asleep(r.json()) if r.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


def wait_asleep(rec: LiveRecord, want: bool, timeout_s: float) -> Optional[bool]:
    """Poll the engine until it says it sleeps (`want` True) or is awake; its last word (None: it does not say)."""
    deadline = time.monotonic() + timeout_s
    while True:
        said = asleep_now(rec)
        if said is None or said == want or time.monotonic() > deadline:
            return said
        time.sleep(0.1)


# --- what a model holds ---------------------------------------------------------------------

def gpu_held(rec: LiveRecord) -> dict[str, int]:
    """Bytes the launch's processes hold on each GPU now (NVML by pid); {} on a host without GPUs."""
    from servedeck.gpu.holders import holders, model_gpu_use
    from servedeck.gpu.nvml import inventory

    inv = inventory()
    if not inv.available:
        return {}
    return {str(g): b for g, b in model_gpu_use(rec.model, holders(inv)).items()}


def gpu_held_by(inv, models: list[str]) -> dict[int, int]:
    """Bytes these models' processes hold on each GPU of `inv`, summed."""
    from servedeck.gpu.holders import holders

    out: dict[int, int] = {}
    for h in holders(inv):
        if h.model in models and h.used_bytes:
            out[h.gpu] = out.get(h.gpu, 0) + h.used_bytes
    return out


def group_rss(rec: LiveRecord) -> int:
    """Resident host memory of the launch's process group (pinned memory is resident)."""
    total = 0
    for pid in P.group_members(rec.pgid):
        try:
            total += psutil.Process(pid).memory_info().rss
        except psutil.Error:
            continue
    return total


def weights_bytes(cfg: "Config", name: str) -> Optional[int]:
    """The planner's size of the model's weights (what level 1 copies to host memory); None when it
    cannot read them."""
    from servedeck.errors import ServedeckError
    from servedeck.gpu.modelplan import plan_model

    try:
        plan, _ = plan_model(cfg, name)
    except (ServedeckError, ValueError, OSError):
        return None
    return int(plan.weights_bytes) if plan.weights_bytes else None


def host_memory(cfg: "Config") -> HostMemory:
    host = cfg.deck.host
    return HostMemory(available=int(psutil.virtual_memory().available),
                      cap=int(host.sleep_ram_gib * GiB) if host.sleep_ram_gib else None,
                      margin=int(host.sleep_ram_margin_gib * GiB))


def sleepers(running: dict[str, LiveRecord], measured: bool = False) -> list[Sleeper]:
    """Every model asleep now, with the host memory it pins and what it holds per GPU (measured now by
    NVML with `measured`, else as recorded when it fell asleep)."""
    out = []
    for m, r in running.items():
        if r.state != LaunchState.ASLEEP:
            continue
        held = gpu_held(r) if measured else dict(r.asleep_gpu_bytes)
        out.append(Sleeper(m, r.sleep_level or 1, r.asleep_host_bytes or 0,
                           {int(g): int(b) for g, b in held.items()}, r.asleep_since or 0.0))
    return out


def holds_words(rec: LiveRecord, gpu: dict[str, int] | None = None) -> str:
    """`holds 1.9 GiB on GPU 0 and 15.0 GiB of pinned host memory`: what a sleeping model keeps."""
    gpu = rec.asleep_gpu_bytes if gpu is None else gpu
    parts = [f"{gib(b)} on GPU {g}" for g, b in sorted(gpu.items())] or ["GPU memory not measured here (no GPU)"]
    text = "holds " + ", ".join(parts)
    if rec.asleep_host_bytes:
        text += f" and {gib(rec.asleep_host_bytes)} of pinned host memory"
    return text


# --- desired state --------------------------------------------------------------------------

def mark_desired(name: str, level: Optional[int]) -> None:
    """desired.json says which wanted models sleep (`asleep`: their level), so that `restore` and the
    watch loop do not start them cold into a slot another model holds."""
    doc = S.read_desired()
    settings = doc["models"].get(name)
    if settings is None or settings.get("asleep") == level:
        return
    if level is None:
        settings.pop("asleep", None)
    else:
        settings["asleep"] = level
    S.write_desired(doc)


# --- the output check -----------------------------------------------------------------------

def _answers(rec: LiveRecord, timeout_s: float) -> list[dict[str, Any]]:
    from servedeck.loadgen.outputs import collect

    return asyncio.run(collect(rec.base_url, rec.served_name or rec.model, rec.engine,
                               dict(rec.spec.get("request") or {}), lambda line: None, timeout_s=timeout_s,
                               max_tokens=CHECK_TOKENS))


def take_reference(rec: LiveRecord) -> dict[str, Any]:
    """After a launch that can sleep became ready: its answers to the fixed prompts, kept in its folder
    for the first wake to compare with. A failure is recorded and leaves the first wake unchecked."""
    t0 = time.monotonic()
    try:
        lines = _answers(rec, rec.stop_timeout_s)
    except Exception as e:  # a check that cannot run must never fail a launch that is up and answering
        out = {"prompts": 0, "error": f"{type(e).__name__}: {e}"[:300]}
    else:
        atomic_write_text(Path(rec.launch_dir) / REFERENCE_FILE, "".join(json.dumps(x) + "\n" for x in lines))
        errors = [x for x in lines if x.get("error")]
        out = {"prompts": len(lines), "errors": len(errors), "took_s": round(time.monotonic() - t0, 3),
               "unit": "token" if all(x.get("token_ids") is not None for x in lines if not x.get("error")) else "character"}
    S.journal("sleep-reference", rec.model, "error" if out.get("error") else "ok", launch_dir=rec.launch_dir, **out)
    return out


def read_reference(rec: LiveRecord) -> Optional[list[dict[str, Any]]]:
    try:
        text = (Path(rec.launch_dir) / REFERENCE_FILE).read_text()
    except OSError:
        return None
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def check_wake(rec: LiveRecord) -> dict[str, Any]:
    """The first wake of a launch: the same prompts again, compared token by token with the reference.
    verdict: identical | differs | not comparable (with why)."""
    from servedeck.loadgen.outputs import compare

    ref = read_reference(rec)
    if not ref:
        out: dict[str, Any] = {"verdict": "not comparable",
                               "why": "no answers were kept from before its first sleep (see its journal's "
                                      "sleep-reference line)"}
    else:
        t0 = time.monotonic()
        try:
            now = _answers(rec, rec.stop_timeout_s)
        except Exception as e:
            out = {"verdict": "not comparable", "why": f"the check could not run: {type(e).__name__}: {e}"[:300]}
        else:
            out = {**compare(ref, now), "took_s": round(time.monotonic() - t0, 3), "after_wake": now}
    atomic_write_json(Path(rec.launch_dir) / CHECK_FILE, out)
    return out


def differing(check: dict[str, Any]) -> list[dict[str, Any]]:
    """The prompts whose answers differ: where, and how each side goes on (before sleeping: `a`, after: `b`)."""
    return [{k: r.get(k) for k in ("index", "content", "unit", "position", "before", "a", "b")}
            for r in check.get("rows", []) if r.get("verdict") == "differs"]


# --- the two moves --------------------------------------------------------------------------

def put_to_sleep(rec: LiveRecord, level: int, why: str, weights: Optional[int]) -> dict[str, Any]:
    """Tell the engine to sleep at `level` and record it asleep (at level 1 holding `weights` bytes of
    pinned host memory). Raises SleepFailed (the record then says asleep; the caller stops the model,
    whose state is no longer known)."""
    engine = get_engine(rec.engine)
    d = Path(rec.launch_dir)
    before_gpu, before_rss = gpu_held(rec), group_rss(rec)
    rec.state, rec.sleep_level, rec.asleep_since = LaunchState.ASLEEP, level, time.time()
    rec.asleep_host_bytes = (weights or 0) if level == 1 else 0
    S.write_live(rec)
    L.update_launch(d, state=LaunchState.ASLEEP.value, sleep_level=level)
    S.journal("sleep", rec.model, "begin", level=level, why=why, launch_dir=rec.launch_dir)
    t0 = time.monotonic()
    if not engine.sleep_calls(level):
        raise SleepFailed(f"engine {rec.engine!r} has no way to sleep at level {level}")
    calls = send(rec, engine.sleep_calls(level), rec.stop_timeout_s)
    said = wait_asleep(rec, True, ASLEEP_WAIT_S)
    if said is False:
        raise SleepFailed(f"the sleep calls answered, but {engine.asleep_call.describe()} still says it is awake "
                          f"after {ASLEEP_WAIT_S:g} s")
    took = round(time.monotonic() - t0, 3)
    after_gpu, after_rss = gpu_held(rec), group_rss(rec)
    rec.awake_gpu_bytes, rec.asleep_gpu_bytes, rec.sleeps = before_gpu, after_gpu, rec.sleeps + 1
    S.write_live(rec)
    L.update_launch(d, sleeps=rec.sleeps, asleep_gpu_bytes=after_gpu, awake_gpu_bytes=before_gpu)
    mark_desired(rec.model, level)
    out = {"level": level, "took_s": took, "why": why, "calls": calls, "gpu_before": before_gpu,
           "gpu_asleep": after_gpu, "host_bytes": rec.asleep_host_bytes, "rss_delta": after_rss - before_rss,
           "engine_says_asleep": said}
    S.journal("sleep", rec.model, "asleep", launch_dir=rec.launch_dir, detail=f"asleep at level {level} in "
              f"{took} s; {holds_words(rec)}", **out)
    return out


def wake_up(rec: LiveRecord) -> dict[str, Any]:
    """Wake the engine, make sure it answers, and (first wake of the launch) check its answers. Raises
    SleepFailed when a call fails, it does not say it is awake, or it answers no completion within the
    model's ready_timeout_s; returns the output check's verdict (the caller restarts on `differs`)."""
    engine = get_engine(rec.engine)
    level = rec.sleep_level or 1
    timeout = float(rec.spec.get("ready_timeout_s") or 900.0)
    S.journal("wake", rec.model, "begin", level=level, launch_dir=rec.launch_dir)
    t0 = time.monotonic()
    if not engine.wake_calls(level):
        raise SleepFailed(f"engine {rec.engine!r} has no way to wake from level {level} (it has no sleep mode)")
    calls = send(rec, engine.wake_calls(level), timeout)
    said = wait_asleep(rec, False, min(timeout, ASLEEP_WAIT_S))
    if said is True:
        raise SleepFailed(f"the wake calls answered, but {engine.asleep_call.describe()} still says it sleeps")
    try:
        R.completion_probe(rec.probe_spec(), timeout_s=max(5.0, timeout - (time.monotonic() - t0)))
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as e:
        raise SleepFailed(f"awake, but no completion answered: {type(e).__name__}: {e}") from None
    woke_s = round(time.monotonic() - t0, 3)
    out: dict[str, Any] = {"level": level, "took_s": woke_s, "calls": calls}
    if rec.wake_check is None:  # the first wake of this launch
        check = check_wake(rec)
        out["check"] = {k: v for k, v in check.items() if k not in ("rows", "after_wake")}
        out["check"]["differing"] = differing(check)
        rec.wake_check = check["verdict"] + (f": {check['why']}" if check.get("why") else "")
    # asleep_gpu_bytes stays: what it kept at its last sleep is the best guess of what it keeps at the next
    rec.state, rec.sleep_level, rec.asleep_since, rec.asleep_host_bytes = LaunchState.READY, None, None, None
    return out


def woke_recorded(rec: LiveRecord, out: dict[str, Any]) -> None:
    """A wake that served: the record and desired state say ready again."""
    S.write_live(rec)
    L.update_launch(Path(rec.launch_dir), state=LaunchState.READY.value, sleep_level=None,
                    wake_check=rec.wake_check)
    mark_desired(rec.model, None)
    S.journal("wake", rec.model, "awake", launch_dir=rec.launch_dir, detail=f"awake in {out['took_s']} s "
              f"(level {out['level']})" + (f"; first wake: outputs {rec.wake_check}" if out.get("check") else ""),
              **out)
