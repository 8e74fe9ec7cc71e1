"""Model swaps through the door with vLLM's sleep mode (issue 33), against cold switches in the same run.

    python bench/sleep_switch.py --config models.toml --models a,b[,c] [--alternations 20] [--cold-reps 2]
        [--phases sleep,rotation,cold] [--rotation-sleep-ram-gib G] [--max-tokens 16]
        [--out bench/results/sleep_switch.json]

models.toml names two vLLM models in one slot (a third for the rotation), with no `sleep` key of their own
and no [host] sleep_ram_gib: this script sets them per phase in copies of the file. Every phase runs
`servedeck serve` (the door) on one SERVEDECK_HOME, so the engines one phase leaves are what the next
finds, and one user sends one request at a time (servedeck's ApiClient, non-streamed, greedy):

  sleep     sleep = "auto": a and b started (setup, not counted), then N alternations a, b, a, …; per
            switch the door's x-servedeck-waited, the client's time to the answer, what each model asleep
            holds on each GPU (NVML by pid, through servedeck.gpu), and whether the greedy answer's token
            ids equal the ones the same model gave before it ever slept
  rotation  (with c) a, b, c in turn with [host] sleep_ram_gib set to 1.5 × the largest model's weights (the
            planner's size), or --rotation-sleep-ram-gib: the host may hold one model's weights asleep at
            level 1 and no more, so the others sleep at level 2 (or stop cold); the level each went to is
            read from the journal, what each waited from the header
  cold      sleep = false: the models asleep are stopped, then each switch stops the holder and boots
            the target (--cold-reps switches; each costs a boot)

Prints a table (p50/p95 switch wait by phase, GiB held asleep, answers identical) and writes JSON after
every phase (a later failure loses nothing). On a build that cannot sleep (vLLM's CPU wheel) the sleep
phase's switches are cold, and the table says so: run it there as a check of the script, not for figures.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from pathlib import Path
from typing import Any

import httpx

import servedeck
from servedeck.deck.records import LiveRecord
from servedeck.engines import get_engine
from servedeck.gpu import inventory
from servedeck.gpu.holders import holders, live_records, model_gpu_use
from servedeck.loadgen.api import ApiClient
from servedeck.loadgen.outputs import prompts
from servedeck.modelsfile import load
from servedeck.testing.ports import free_port  # below the ephemeral range: that module says why

HERE = Path(__file__).resolve().parent
GiB = 2**30
PART = re.compile(r"([\d.]+)s (.+)")


# --- the door and the deck, as a user runs them ---------------------------------------------------

class Door:
    """`servedeck serve` in its own process group on the run's SERVEDECK_HOME; its engines outlive it."""

    def __init__(self, config: Path, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "servedeck", "--config", str(config), "serve",
                                      "--port", str(self.port), "--watch-interval", "5s"], env=env,
                                     stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 120:
            try:
                httpx.get(self.url + "/v1/models", timeout=2)
                return
            except httpx.TransportError:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"the door exited ({self.proc.returncode}): see {log}") from None
                time.sleep(0.2)
        raise RuntimeError(f"the door did not answer within 120 s: see {log}")

    def states(self) -> dict[str, str]:
        return {m["id"]: m["servedeck"]["state"] for m in httpx.get(self.url + "/v1/models", timeout=10).json()["data"]}

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


def servedeck_cli(config: Path, env: dict[str, str], *args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", "--config", str(config), *args], env=env,
                          capture_output=True, text=True, timeout=timeout)


# --- the config per phase --------------------------------------------------------------------------

def variant(text: str, models: list[str], sleep: str, sleep_ram_gib: float | None = None) -> str:
    """The user's models.toml with `sleep` set on `models` (and [host] sleep_ram_gib when given)."""
    for m in models:
        head = f"[models.{m}]\n"
        if head not in text:
            raise SystemExit(f"models.toml has no [models.{m}] table written as such (one line, no spaces)")
        text = text.replace(head, f"{head}sleep = {sleep}\n", 1)
    if sleep_ram_gib is not None:
        if "[host]\n" in text:
            text = text.replace("[host]\n", f"[host]\nsleep_ram_gib = {sleep_ram_gib:g}\n", 1)
        else:
            text = f"[host]\nsleep_ram_gib = {sleep_ram_gib:g}\n\n" + text
    return text


def check_input(path: Path, models: list[str]) -> dict[str, Any]:
    doc = tomllib.loads(path.read_text())
    for m in models:
        entry = doc.get("models", {}).get(m)
        if entry is None:
            raise SystemExit(f"{path}: no [models.{m}]")
        if "sleep" in entry:
            raise SystemExit(f"{path}: models.{m} sets sleep; leave it out, this script sets it per phase")
    if "sleep_ram_gib" in doc.get("host", {}):
        raise SystemExit(f"{path}: [host] sets sleep_ram_gib; leave it out, this script sets it for the rotation")
    slots = {doc["models"][m].get("slot", "main") for m in models}
    if len(slots) != 1:
        raise SystemExit(f"the models must share one slot; they are in {sorted(slots)}")
    return doc


# --- one user's requests ----------------------------------------------------------------------------

class User:
    """One request at a time through the door: a fixed greedy prompt (the campaign's first), the answer's
    token ids kept per model; the first answer a model gives (before it ever slept) is its reference."""

    def __init__(self, url: str, engine: str, max_tokens: int) -> None:
        self.url, self.engine, self.max_tokens = url, get_engine(engine), max_tokens
        self.prompt = prompts(1)[0]["prompt"]
        self.reference: dict[str, list[int] | str] = {}

    def ask(self, model: str) -> dict[str, Any]:
        body = {"model": model, "messages": [{"role": "user", "content": self.prompt}], "max_tokens": self.max_tokens,
                "temperature": 0, **self.engine.output_tokens_request}

        async def once():
            async with ApiClient(self.url) as api:
                return await api.chat(body, timeout_s=1800)

        t0 = time.perf_counter()
        reply = asyncio.run(once())
        answer_s = time.perf_counter() - t0
        headers = reply.headers or {}
        waited = headers.get("x-servedeck-waited", "")
        ids = self.engine.output_token_ids(reply.doc) if isinstance(reply.doc, dict) else None
        got: list[int] | str = ids if ids is not None else reply.text
        ref = self.reference.setdefault(model, got) if reply.ok else None
        out = {"model": model, "status": reply.http_status, "ok": reply.ok, "error": reply.error or reply.http_error,
               "answer_s": round(answer_s, 3), "waited": waited, "waited_parts": parts(waited),
               "waited_s": round(sum(s for _, s in parts(waited)), 3),
               "identical": (got == ref) if reply.ok else None,
               "unit": "token" if ids is not None else "character"}
        if reply.ok and got != ref:
            n = next((i for i, (x, y) in enumerate(zip(got, ref)) if x != y), min(len(got), len(ref)))
            out["first_diff"] = {"position": n, "before_sleep": ref[n:n + 8], "now": got[n:n + 8]}
        return out


def parts(waited: str) -> list[tuple[str, float]]:
    out = []
    for piece in re.split(r", (?=[\d.]+s )", waited) if waited else []:
        m = PART.fullmatch(piece.strip())
        if m:
            out.append((m.group(2), float(m.group(1))))
    return out


def kind_of(waited: str) -> str:
    """wake | wake (level 2) | cold | cold restart | start, from the door's words."""
    words = [w for w, _ in parts(waited)]
    if any(w.startswith("cold restart") for w in words):
        return "cold restart"
    if "wake (level 2)" in words:
        return "wake (level 2)"
    if "wake" in words:
        return "wake"
    if any(w.startswith("switch") for w in words):
        return "cold"
    return words[-1] if words else "none"


def asleep_now(home: Path) -> dict[str, dict[str, Any]]:
    """Every model asleep: its level, what it holds per GPU now (NVML by pid) and the host memory it pins."""
    recs = live_records(home / "live")
    asleep = {r["model"]: LiveRecord.from_json(r) for r in recs if r.get("state") == "asleep"}
    if not asleep:
        return {}
    inv = inventory()
    held = holders(inv, recs) if inv.available else []
    return {m: {"level": r.sleep_level, "gpu_bytes": {str(g): b for g, b in model_gpu_use(m, held).items()},
                "host_bytes": r.asleep_host_bytes} for m, r in asleep.items()}


def holder_levels(home: Path, since: float) -> dict[str, int]:
    """The level each model went to sleep at since `since` (the journal's "sleep asleep" lines)."""
    out = {}
    try:
        lines = (home / "journal.jsonl").read_text().splitlines()
    except OSError:
        return out
    for line in lines:
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("event") == "sleep" and r.get("outcome") == "asleep" and r.get("t", 0) >= since:
            out[r["model"]] = r.get("level")
    return out


def switch(user: User, door: Door, home: Path, phase: str, i: int, model: str, holder: str | None) -> dict[str, Any]:
    t = time.time()
    row = {"phase": phase, "i": i, "from": holder, **user.ask(model)}
    row["kind"] = kind_of(row["waited"])
    row["holder_slept_at"] = holder_levels(home, t).get(holder) if holder else None
    row["asleep"] = asleep_now(home)
    print(f"  {phase} #{i}: {holder or '-'} -> {model}: {row['status']} in {row['answer_s']:.2f} s "
          f"[{row['waited'] or 'no wait'}] identical={row['identical']}", flush=True)
    return row


# --- the phases -------------------------------------------------------------------------------------

def run_phase(name: str, config_text: str, work: Path, env: dict[str, str], engine: str, max_tokens: int,
              setup: list[str], measured: list[str], stop_first: list[str] = ()) -> dict[str, Any]:
    cfg = work / f"models-{name}.toml"
    cfg.write_text(config_text)
    names = list(dict.fromkeys([*setup, *measured]))
    load(cfg)  # refused here, with servedeck's own message, rather than inside the door
    rendered = {}
    for m in names:  # what each launch of this phase runs (sleep mode rendered or not)
        r = servedeck_cli(cfg, env, "render", m, "--json")
        rendered[m] = json.loads(r.stdout) if r.returncode == 0 else {"error": (r.stdout + r.stderr)[-2000:]}
    home = Path(env["SERVEDECK_HOME"])
    if stop_first:
        r = servedeck_cli(cfg, env, "stop", *stop_first)
        print(f"  stopped {', '.join(stop_first)} first: {r.stdout.strip() or r.stderr.strip()}", flush=True)
    door = Door(cfg, env, work / f"door-{name}.log")
    rows: list[dict[str, Any]] = []
    user = PHASE_USER.get("user") or User(door.url, engine, max_tokens)
    user.url = door.url
    PHASE_USER["user"] = user
    try:
        holder = next((m for m, s in door.states().items() if s == "ready"), None)
        for i, m in enumerate(setup):
            rows.append({**switch(user, door, home, name, -len(setup) + i, m, holder), "setup": True})
            holder = m
        for i, m in enumerate(measured):
            rows.append(switch(user, door, home, name, i, m, holder))
            holder = m
    finally:
        door.close()
    return {"phase": name, "config": config_text, "render": rendered, "rows": rows}


PHASE_USER: dict[str, User] = {}  # one user across the phases: the reference answers are the first ever given


def pct(xs: list[float], q: float) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    k = (len(xs) - 1) * q
    lo = int(k)
    return xs[lo] + (xs[min(lo + 1, len(xs) - 1)] - xs[lo]) * (k - lo)


def summary(phase: dict[str, Any]) -> dict[str, Any]:
    rows = [r for r in phase["rows"] if not r.get("setup") and r.get("ok")]
    waits = [r["waited_s"] for r in rows]
    answers = [r["answer_s"] for r in rows]
    held = [b / GiB for r in rows for a in r["asleep"].values() for b in a["gpu_bytes"].values()]
    kinds: dict[str, int] = {}
    for r in rows:
        kinds[r["kind"]] = kinds.get(r["kind"], 0) + 1
    levels: dict[str, int] = {}
    for r in rows:
        if r.get("holder_slept_at"):
            key = f"level {r['holder_slept_at']}"
            levels[key] = levels.get(key, 0) + 1
    failed = [r for r in phase["rows"] if not r.get("ok")]
    return {"phase": phase["phase"], "switches": len(rows), "failed": len(failed),
            "wait_p50_s": pct(waits, 0.5), "wait_p95_s": pct(waits, 0.95),
            "answer_p50_s": pct(answers, 0.5), "answer_p95_s": pct(answers, 0.95),
            "gib_held_asleep_median": statistics.median(held) if held else None,
            "gib_held_asleep_max": max(held) if held else None,
            "identical": all(r["identical"] for r in rows) if rows else None,
            "identical_n": sum(bool(r["identical"]) for r in rows), "kinds": kinds, "holders_slept_at": levels,
            "cold_because": sorted({w for r in rows for w, _ in r["waited_parts"] if w.startswith("switch (cold")})}


def table(summaries: list[dict[str, Any]]) -> str:
    def f(v, fmt="{:.2f}"):
        return "—" if v is None else fmt.format(v)

    lines = [f"{'phase':9} {'n':>3} {'wait p50':>9} {'wait p95':>9} {'answer p50':>11} {'answer p95':>11} "
             f"{'GiB asleep':>11} {'identical':>10}  what the switches were"]
    for s in summaries:
        what = ", ".join(f"{n} {k}" for k, n in s["kinds"].items())
        if s["holders_slept_at"]:
            what += "; holders slept at " + ", ".join(f"{k} ×{n}" for k, n in s["holders_slept_at"].items())
        ident = "—" if s["identical"] is None else f"{'y' if s['identical'] else 'n'} ({s['identical_n']}/{s['switches']})"
        lines.append(f"{s['phase']:9} {s['switches']:>3} {f(s['wait_p50_s']):>9} {f(s['wait_p95_s']):>9} "
                     f"{f(s['answer_p50_s']):>11} {f(s['answer_p95_s']):>11} "
                     f"{f(s['gib_held_asleep_median'], '{:.2f}'):>11} {ident:>10}  {what}")
        for why in s["cold_because"]:
            lines.append(f"{'':9} cold because: {why}")
    return "\n".join(lines)


def weights_gib(cfg_path: Path, models: list[str]) -> float | None:
    from servedeck.deck.sleep import weights_bytes

    cfg = load(cfg_path)
    sizes = [weights_bytes(cfg, m) for m in models]
    return max(sizes) / GiB if all(sizes) else None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--config", type=Path, required=True)
    ap.add_argument("--models", required=True, help="a,b or a,b,c: vLLM models of one slot")
    ap.add_argument("--alternations", type=int, default=20)
    ap.add_argument("--cold-reps", type=int, default=2)
    ap.add_argument("--rotation-rounds", type=int, default=1, help="times round a, b, c (each: 3 switches)")
    ap.add_argument("--rotation-sleep-ram-gib", type=float, default=None,
                    help="[host] sleep_ram_gib for the rotation (default 1.5 × the largest model's weights)")
    ap.add_argument("--phases", default="sleep,rotation,cold")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--home", type=Path, default=None, help="SERVEDECK_HOME (default: a fresh folder)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "sleep_switch.json")
    a = ap.parse_args()
    models = [m.strip() for m in a.models.split(",") if m.strip()]
    if len(models) not in (2, 3):
        raise SystemExit("--models names two models (a third for the rotation)")
    phases = [p.strip() for p in a.phases.split(",") if p.strip()]
    doc_in = check_input(a.config, models)
    text = a.config.read_text()
    cfg = load(a.config)
    engine = cfg.deck.builds[cfg.models[models[0]].build].engine
    work = Path(tempfile.mkdtemp(prefix="sleep-switch-"))
    home = a.home or work / "home"
    home.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, SERVEDECK_HOME=str(home))
    env.pop("SERVEDECK_CONFIG", None)
    a_, b_ = models[0], models[1]
    result: dict[str, Any] = {
        "schema": 1, "tool": "bench/sleep_switch.py", "servedeck": servedeck.__version__,
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "host": platform.node(), "python": platform.python_version(),
        "gpus": [g.name for g in inventory().gpus], "args": {k: str(v) for k, v in vars(a).items()},
        "models": models, "work": str(work), "home": str(home), "phases": [], "summaries": []}
    builds = {m: doc_in["models"][m].get("build") for m in models}
    result["builds"] = {b: doc_in.get("builds", {}).get(b) for b in set(builds.values())}
    print(f"work folder {work}; SERVEDECK_HOME {home}", flush=True)

    def save() -> None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        result["summaries"] = [summary(p) for p in result["phases"]]
        a.out.write_text(json.dumps(result, indent=1, default=str))

    t_all = time.monotonic()
    ab = [a_ if i % 2 == 0 else b_ for i in range(a.alternations)]  # after the setup b is up: a, b, a, …
    if "sleep" in phases:
        print(f"== sleep: sleep = \"auto\"; setup {a_}, {b_}; then {a.alternations} alternations", flush=True)
        t0 = time.monotonic()
        ph = run_phase("sleep", variant(text, models, '"auto"'), work, env, engine, a.max_tokens,
                       setup=[a_, b_], measured=ab)
        ph["wall_s"] = round(time.monotonic() - t0, 1)
        result["phases"].append(ph)
        save()
    if "rotation" in phases and len(models) == 3:
        c_ = models[2]
        cap = a.rotation_sleep_ram_gib
        if cap is None:
            w = weights_gib(a.config, models)
            cap = round(1.5 * w, 1) if w else None
        if cap is None:
            print("== rotation skipped: the planner cannot size the weights; pass --rotation-sleep-ram-gib", flush=True)
        else:
            order = [c_, a_, b_] * a.rotation_rounds + [c_]
            print(f"== rotation: sleep_ram_gib = {cap:g} (one model's weights fit at level 1); {' -> '.join(order)}",
                  flush=True)
            t0 = time.monotonic()
            ph = run_phase("rotation", variant(text, models, '"auto"', cap), work, env, engine, a.max_tokens,
                           setup=[] if "sleep" in phases else [a_, b_], measured=order)
            ph["wall_s"] = round(time.monotonic() - t0, 1)
            ph["sleep_ram_gib"] = cap
            result["phases"].append(ph)
            save()
    if "cold" in phases:
        asleep = [m for m in asleep_now(home)]
        extra = [m for m in models[2:]]
        print(f"== cold: sleep = false; {a.cold_reps} cold switches", flush=True)
        t0 = time.monotonic()
        cold = [b_ if i % 2 == 0 else a_ for i in range(a.cold_reps)]
        stop = sorted(set(asleep) - {a_}) + [m for m in extra if m not in asleep]
        ph = run_phase("cold", variant(text, models[:2], "false"), work, env, engine, a.max_tokens,
                       setup=[a_], measured=cold, stop_first=[m for m in stop if (home / "live" / f"{m}.json").exists()])
        ph["wall_s"] = round(time.monotonic() - t0, 1)
        result["phases"].append(ph)
        save()
    servedeck_cli(a.config.resolve(), env, "stop", "--all")
    result["wall_s"] = round(time.monotonic() - t_all, 1)
    save()
    print()
    print(table(result["summaries"]))
    cannot = [s for s in result["summaries"] if s["phase"] in ("sleep", "rotation") and s["cold_because"]]
    if cannot:
        print("\nthe sleep phases switched cold: these launches cannot sleep here (see 'cold because'); the "
              "figures above are cold switches, not sleep")
    print(f"\nwrote {a.out} ({result['wall_s']} s in all)")


if __name__ == "__main__":
    main()
