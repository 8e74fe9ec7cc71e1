"""Deck operations: start, switch, stop, status, restore. The one owner of a launch's state.

States of a launch (launch.json "state", mirrored in the live record):
    starting  spawned; not yet healthy-and-answering
    ready     alive, healthy, and one real completion was answered
    stopping  a stop is under way (SIGTERM sent to the group)
    stopped   ended by `stop` or `switch`          (terminal)
    failed    died or timed out while starting    (terminal)
    crashed   found dead after being ready         (terminal)
Only this module moves a launch between states.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from servedeck.config import Build, Config, Deck as DeckConfig, Model
from servedeck.deck import launch as L
from servedeck.deck import state as S
from servedeck.deck.slots import Running, decide
from servedeck.engines import get_engine
from servedeck.engines.base import REDACTED, LaunchSpec, redact_env, redact_settings_args
from servedeck.errors import LaunchError, RefusedError, StateError
from servedeck.fsio import atomic_write_json
from servedeck.supervisor import process as P
from servedeck.supervisor import ready as R

TERMINAL = {"stopped", "failed", "crashed"}

def classify(log_tail: str, exit_info: dict | None, when: float | None = None) -> dict:
    """The classified cause of an ending, from the forensic catalogue (doctor/forensics)."""
    from servedeck.doctor.forensics import classify as catalogue_classify
    from servedeck.doctor.kernel import events_near

    return catalogue_classify(log_tail, exit_info, events_near(when) if when else [])

def describe_exit(exit_info: dict | None) -> str:
    if not exit_info:
        return "the engine's process group is gone and no exit record was written (killed with its shim?)"
    if exit_info.get("signal"):
        return f"killed by {exit_info['signal']}"
    if exit_info.get("error"):
        return exit_info["error"]
    return f"exited with code {exit_info.get('returncode')}"

# --- settings as desired.json keeps them ---------------------------------------------------

def settings_of(name: str, cfg: Config) -> dict:
    m = cfg.models[name]
    b = cfg.deck.builds[m.build]
    model = m.model_dump(mode="json")
    model["env"] = redact_env(m.env)
    model["args"] = redact_settings_args(model.get("args") or {})
    build = b.model_dump(mode="json")
    build["env"] = redact_env(b.env)
    return {"model": model, "build_name": m.build, "build": build, "config_path": str(cfg.path),
            "since": S.now_iso()}

def config_from_settings(name: str, settings: dict, current: Config | None) -> Config:
    """Rebuild the one-model config a launch was made with; secrets come from the current config or env."""

    def fill(env: dict, current_env: dict, where: str) -> dict:
        out = {}
        for k, v in env.items():
            if v == REDACTED:
                if k in current_env:
                    v = current_env[k]
                elif k in os.environ:
                    v = os.environ[k]
                else:
                    raise StateError(f"desired.json: models.{name}: secret {where}.env.{k} is not stored",
                                     hint=f"set {k} in the environment or in models.toml, then run again")
            out[k] = v
        return out

    def fill_args(args: dict, current_args: dict) -> dict:
        out = {}
        for k, v in args.items():
            if v == REDACTED:
                if k not in current_args:
                    raise StateError(f"desired.json: models.{name}: secret args.{k} is not stored",
                                     hint=f"put args.{k} back in models.toml for models.{name}, then run again")
                v = current_args[k]
            out[k] = v
        return out

    cur_m = current.models.get(name) if current else None
    cur_b = current.deck.builds.get(settings["build_name"]) if current else None
    model = dict(settings["model"])
    build = dict(settings["build"])
    model["env"] = fill(model.get("env", {}), dict(cur_m.env) if cur_m else {}, f"models.{name}")
    model["args"] = fill_args(model.get("args", {}), dict(cur_m.args) if cur_m else {})
    build["env"] = fill(build.get("env", {}), dict(cur_b.env) if cur_b else {}, f"builds.{settings['build_name']}")
    deck = DeckConfig(builds={settings["build_name"]: Build(**build)}, models={name: Model(**model)})
    return Config(path=Path(settings.get("config_path", "desired.json")), deck=deck)

@dataclass
class Status:
    model: str
    state: str
    record: dict | None
    desired: bool
    detail: str = ""

    def to_json(self) -> dict:
        rec = self.record or {}
        uptime = None
        if rec.get("ready_t") and self.state == "ready":
            uptime = round(time.time() - rec["ready_t"], 1)
        return {"model": self.model, "state": self.state, "desired": self.desired, "engine": rec.get("engine"),
                "build": rec.get("build"), "slot": rec.get("slot"), "port": rec.get("port"), "pid": rec.get("pid"),
                "engine_pid": rec.get("engine_pid"), "uptime_s": uptime, "started_at": rec.get("started_at"),
                "launch_dir": rec.get("launch_dir"), "boot": rec.get("boot", {}), "detail": self.detail,
                "cause": rec.get("cause"), "evidence": rec.get("evidence"), "liveness": rec.get("liveness"),
                "vision": bool((rec.get("spec") or {}).get("vision")),
                "max_output_tokens": (rec.get("spec") or {}).get("max_output_tokens")}

class Deck:
    """Operations on the deck described by one models.toml."""

    def __init__(self, cfg: Config | None):
        self.cfg = cfg

    # --- rendering --------------------------------------------------------------------------
    def render(self, name: str, cfg: Config | None = None) -> LaunchSpec:
        cfg = cfg or self.cfg
        name = cfg.resolve(name)
        engine = get_engine(cfg.deck.builds[cfg.models[name].build].engine)
        return engine.render(name, cfg)

    # --- reality ----------------------------------------------------------------------------
    def _alive(self, rec: dict) -> bool:
        return P.alive(rec["pid"], rec.get("create_time"))

    def running(self) -> dict[str, dict]:
        """Live records whose process is really alive. Dead ones are settled (recorded as crashed/failed)."""
        out = {}
        for model, rec in S.all_live().items():
            if self._alive(rec):
                out[model] = rec
            else:
                self._settle_dead(model, rec)
        return out

    def _settle_dead(self, model: str, rec: dict) -> dict:
        """A live record whose process is gone: say what it died of, keep the evidence, clear the record."""
        d = Path(rec["launch_dir"])
        exit_info = R.read_exit(d)
        tail = L.log_tail(d, 40)
        was = rec.get("state")
        if was == "stopping":
            new_state, event = "stopped", "stop"
        elif was == "starting":
            new_state, event = "failed", "start"
        else:
            new_state, event = "crashed", "crash"
        ended = (exit_info or {}).get("ended_at") or time.time()
        cause = classify(tail, exit_info, ended) if new_state != "stopped" else None
        L.update_launch(d, state=new_state, ended_at=S.now_iso(), exit=exit_info, cause=cause,
                        end_detail=describe_exit(exit_info))
        S.clear_live(model)
        if new_state != "stopped":
            S.journal(event, model, new_state, launch_dir=str(d), exit=exit_info, cause=cause,
                      detail=describe_exit(exit_info), log_tail=tail.splitlines()[-10:])
        rec = dict(rec, state=new_state, exit=exit_info, cause=cause)
        return rec

    # --- start ------------------------------------------------------------------------------
    def start(self, name: str, *, wait_s: float = 0.0, reason: str = "start") -> dict:
        name = self.cfg.resolve(name)
        with S.deck_lock(f"start {name}", wait_s):
            return self._start_locked(name, self.cfg, reason=reason, evict=False)

    def switch(self, name: str, *, wait_s: float = 0.0) -> dict:
        name = self.cfg.resolve(name)
        with S.deck_lock(f"switch {name}", wait_s):
            return self._start_locked(name, self.cfg, reason="switch", evict=True)

    def _start_locked(self, name: str, cfg: Config, *, reason: str, evict: bool) -> dict:
        model = cfg.models[name]
        running = self.running()
        for m in [m for m, r in running.items() if is_orphan(r)]:
            # a start/switch that was killed mid-way left this engine booting with no owner: it would
            # otherwise count as "already running" or as a slot holder forever
            self.reap_orphan(m, running.pop(m))
        decision = decide(name, model.slot, [Running(m, r["slot"], r["port"]) for m, r in running.items()])
        if decision.already_running:
            rec = running[name]
            S.journal(reason, name, "already-running", launch_dir=rec["launch_dir"])
            return dict(rec, already_running=True)
        if decision.holders and not evict:
            holders = ", ".join(f"{h} (port {running[h]['port']}, pid {running[h]['pid']})" for h in decision.holders)
            S.journal(reason, name, "refused", holders=list(decision.holders))
            raise RefusedError(
                f"cannot start {name}: slot {model.slot!r} is held by {holders}",
                hint=f"`servedeck switch {name}` stops the holder, waits until it is gone, then starts {name}",
            )
        evicted = []
        if decision.holders:
            S.journal("switch", name, "begin", evicting=list(decision.holders))
            for h in decision.holders:
                self._stop_locked(h, running[h], reason=f"evicted by switch to {name}")
                evicted.append(h)
        rec = self._launch(name, cfg, reason=reason)
        if evict:
            S.journal("switch", name, "ok", evicted=evicted, launch_dir=rec["launch_dir"])
        return dict(rec, evicted=evicted)

    def _launch(self, name: str, cfg: Config, *, reason: str, settings: dict | None = None) -> dict:
        spec = self.render(name, cfg)
        model = cfg.models[name]
        holder = P.port_holder(spec.port)
        if holder is not None and not holder.get("pid"):
            # A listener no process owns is a socket still being torn down (an engine killed a moment
            # ago, e.g. before `restore`): give the kernel a few seconds before calling it someone else's.
            P.wait_port_free(spec.port, 5.0)
            holder = P.port_holder(spec.port)
        if holder is not None:
            who = f"pid {holder.get('pid')} ({holder.get('name', '?')}: {holder.get('cmdline', '')[:80]})" \
                if holder.get("pid") else "a process servedeck cannot see"
            S.journal(reason, name, "refused", port=spec.port, holder=holder)
            raise RefusedError(f"cannot start {name}: port {spec.port} is held by {who}",
                               hint="stop that process, or give the model another port in models.toml")
        self._check_fit(name, cfg)
        d = L.new_launch_dir(name)
        lrec = L.write_start(d, spec, model.build, str(cfg.path), reason)
        proc = P.spawn(spec, d)
        live = {**lrec, "pid": proc.pid, "pgid": proc.pgid, "create_time": proc.create_time,
                "owner_pid": os.getpid(), "host": spec.host, "served_name": spec.served_name,
                "base_url": spec.base_url, "stop_timeout_s": spec.stop_timeout_s, "gpus": spec.gpus,
                "image": cfg.deck.builds[model.build].image, "docker": cfg.deck.builds[model.build].docker}
        S.write_live(name, live)
        S.journal(reason, name, "spawned", pid=proc.pid, launch_dir=str(d))
        try:
            ready = R.wait_ready(spec, lambda: P.alive(proc.pid, proc.create_time), model.ready_timeout_s)
        except (R.Died, R.TimedOut, KeyboardInterrupt) as e:
            self._failed_start(name, live, d, e)
            raise  # _failed_start raises LaunchError for Died/TimedOut; Ctrl-C propagates after cleanup
        boot = get_engine(spec.engine).parse_boot(L.log_tail(d, 4000))
        atomic_write_json(d / "boot.json", boot)
        self._record_plan(name, cfg, boot, d)
        eng = _read_json(d / "engine.json")
        live.update(state="ready", ready_at=S.now_iso(), ready_t=time.time(), boot=boot,
                    readiness=ready.__dict__, engine_pid=eng.get("engine_pid"))
        S.write_live(name, live)
        L.update_launch(d, state="ready", ready_at=live["ready_at"], readiness=ready.__dict__,
                        engine_pid=eng.get("engine_pid"))
        S.set_desired(name, settings or settings_of(name, cfg))
        S.journal(reason, name, "ready", launch_dir=str(d), ready_s=ready.answered_after_s, boot=boot)
        return live

    def _failed_start(self, name: str, live: dict, d: Path, err: BaseException) -> None:
        timed_out = isinstance(err, R.TimedOut)
        interrupted = isinstance(err, KeyboardInterrupt)
        if timed_out or interrupted:
            P.stop_group(live["pgid"], min(live["stop_timeout_s"], 30.0))
        else:
            deadline = time.monotonic() + 3.0  # let the shim write exit.json
            while R.read_exit(d) is None and time.monotonic() < deadline:
                time.sleep(0.05)
            P.stop_group(live["pgid"], 5.0)  # a dying engine may leave helpers behind
        self._cleanup_container(live)
        exit_info = R.read_exit(d)
        tail = L.log_tail(d, 40)
        cause = classify(tail, exit_info, time.time())
        why = "interrupted" if interrupted else str(err) if timed_out else describe_exit(exit_info)
        L.update_launch(d, state="failed", ended_at=S.now_iso(), exit=exit_info, cause=cause, end_detail=why)
        S.clear_live(name)
        S.journal("start", name, "failed", launch_dir=str(d), exit=exit_info, cause=cause, detail=why,
                  log_tail=tail.splitlines()[-10:])
        if interrupted:
            return
        raise LaunchError(
            f"{name} failed to start: {why}" + (f" — {cause['summary']}" if cause and cause.get("summary") else ""),
            hint=(cause or {}).get("action") or f"read the whole log: `servedeck logs {name}`",
            log_tail=L.log_tail(d, 15), cause=cause,
        ) from None

    def _check_fit(self, name: str, cfg: Config) -> None:
        """Refuse a launch whose GPU memory does not fit now, naming who holds the rest."""
        from servedeck.doctor.checks import gpu_fit

        verdict = gpu_fit(name, cfg)
        if verdict is not None and verdict.get("status") == "FAIL":
            S.journal("start", name, "refused", reason="gpu memory", detail=verdict.get("detail"))
            raise RefusedError(f"cannot start {name}: {verdict['detail']}", hint=verdict.get("hint"))

    def _record_plan(self, name: str, cfg: Config, boot: dict, launch_dir: Path) -> None:
        """The planner learns from every boot: engine-reported KV tokens and NVML memory beside its prediction."""
        from servedeck.gpu import record_boot

        try:
            record_boot(name, cfg, boot, launch_dir=str(launch_dir))
        except Exception as e:  # a planner bug must never fail a launch that is up and answering
            S.journal("plan", name, "error", detail=f"{type(e).__name__}: {e}")

    def reap_orphan(self, name: str, rec: dict) -> dict:
        """Stop an engine left in `starting` by a servedeck process that is gone. Desired state is left
        as it is: the model may still be wanted (the watch loop relaunches it), and was never ready."""
        d = Path(rec["launch_dir"])
        result = P.stop_group(rec["pgid"], min(rec.get("stop_timeout_s", 30.0), 30.0))
        self._cleanup_container(rec)
        why = f"orphaned: the servedeck process that started it (pid {rec.get('owner_pid')}) is gone"
        L.update_launch(d, state="failed", ended_at=S.now_iso(), exit=R.read_exit(d), stop=result, end_detail=why)
        S.clear_live(name)
        S.journal("start", name, "orphan-reaped", launch_dir=str(d), detail=why, killed=result.get("killed"))
        return {"model": name, "outcome": "orphan-reaped", **result}

    # --- stop -------------------------------------------------------------------------------
    def stop(self, names: list[str] | None, *, wait_s: float = 0.0, grace_s: float | None = None) -> list[dict]:
        """Stop the named models (all running ones when names is None) and drop them from desired state."""
        with S.deck_lock("stop " + (" ".join(names) if names else "--all"), wait_s):
            running = self.running()
            targets = list(running) if names is None else [self.cfg.resolve(n) if self.cfg else n for n in names]
            out = []
            for name in targets:
                S.set_desired(name, None)
                if name not in running:
                    S.journal("stop", name, "not-running")
                    out.append({"model": name, "outcome": "not-running"})
                    continue
                out.append(self._stop_locked(name, running[name], reason="stop", grace_s=grace_s))
            return out

    def _stop_locked(self, name: str, rec: dict, *, reason: str, grace_s: float | None = None) -> dict:
        d = Path(rec["launch_dir"])
        rec = dict(rec, state="stopping")
        S.write_live(name, rec)
        L.update_launch(d, state="stopping")
        S.set_desired(name, None)
        grace = rec.get("stop_timeout_s", 120.0) if grace_s is None else grace_s
        members = set(P.group_members(rec["pgid"]))  # before they go: NVML lists them by pid
        result = P.stop_group(rec["pgid"], grace)
        self._cleanup_container(rec)
        port_free = P.wait_port_free(rec["port"], 30.0)
        gpu = self._wait_gpu_released(members)
        exit_info = R.read_exit(d)
        L.update_launch(d, state="stopped", ended_at=S.now_iso(), exit=exit_info, stop=result,
                        end_detail=f"stopped ({reason})")
        S.clear_live(name)
        S.journal("stop", name, "stopped", reason=reason, launch_dir=str(d), killed=result.get("killed"),
                  took_s=result.get("took_s"), port_free=port_free, gpu_released=gpu)
        return {"model": name, "outcome": "stopped", **result, "port_free": port_free, "gpu_released": gpu}

    @staticmethod
    def _cleanup_container(rec: dict) -> None:
        """Killing `docker run` does not always remove its container: make sure it is gone."""
        if rec.get("image"):
            import subprocess

            subprocess.run([rec.get("docker") or "docker", "rm", "-f", f"servedeck-{rec['model']}"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)

    @staticmethod
    def _wait_gpu_released(pids: set[int], timeout_s: float = 120.0) -> dict | None:
        """On a GPU host, wait until NVML no longer lists any process of the stopped group.

        The driver frees memory after the process is reaped, and not always at once: a switch that
        started the next model earlier would find the card still full. None when there is no GPU.
        """
        from servedeck.gpu import nvml

        t0 = time.monotonic()
        inv = nvml.inventory()
        if not inv.available:
            return None
        while pids & inv.pids():
            if time.monotonic() - t0 > timeout_s:
                return {"released": False, "still_listed": sorted(pids & inv.pids()), "waited_s": timeout_s}
            time.sleep(0.25)
            inv = nvml.inventory()
        return {"released": True, "waited_s": round(time.monotonic() - t0, 3),
                "free_bytes": {g.index: g.memory_free for g in inv.gpus}}

    # --- status -----------------------------------------------------------------------------
    def status(self) -> list[Status]:
        desired = S.read_desired()["models"]
        watch = S.read_watch()
        out: list[Status] = []
        live = S.all_live()
        for model, rec in live.items():
            if self._alive(rec):
                state = rec.get("state", "?")
                detail = ""
                if state == "starting" and rec.get("owner_pid") and not P.alive(rec["owner_pid"]):
                    detail = (f"the servedeck process that started it (pid {rec['owner_pid']}) is gone; "
                              "this engine is not in desired state: `servedeck stop` it or `servedeck start` it again")
                elif state == "ready":
                    ok, why = R.health_ok(spec_of_record(rec), timeout_s=2.0)
                    if not ok:
                        state, detail = "unhealthy", f"health check: {why}"
                    else:  # the watch loop's last liveness verdict on this very launch
                        seen = watch.get("liveness", {}).get(model) or {}
                        if seen.get("launch_dir") == rec.get("launch_dir") and seen.get("verdict") in ("stalled", "slow"):
                            state, detail = seen["verdict"], seen.get("detail", "")
                            rec = dict(rec, liveness=seen)
                if model not in desired and state in ("ready", "unhealthy"):
                    detail = (detail + "; " if detail else "") + "running but not in desired state"
                out.append(Status(model, state, rec, model in desired, detail))
            else:
                settled = self._settle_dead(model, rec)
                out.append(Status(model, settled["state"], settled, model in desired,
                                  describe_exit(settled.get("exit"))))
        for model in desired:
            if model not in live:
                last = next((r for r in reversed(S.read_journal(model)) if r["event"] in ("crash", "start")), None)
                detail = "wanted but not running"
                cause = None
                if last and last.get("outcome") in ("crashed", "failed"):
                    cause = last.get("cause")
                    detail += f": last launch {last['outcome']} at {last['ts']} ({last.get('detail', '')})"
                gave_up = watch.get("models", {}).get(model) or {}
                if gave_up.get("state") == "gave-up":  # the watch loop stopped relaunching it
                    out.append(Status(model, "gave-up", {"model": model, "cause": gave_up.get("cause"),
                                                         "evidence": gave_up.get("evidence")}, True,
                                      gave_up.get("detail", "the watch loop gave up relaunching it")))
                    continue
                out.append(Status(model, "absent", {"cause": cause, "model": model}, True, detail))
        return out

    # --- restore ----------------------------------------------------------------------------
    def restore(self, *, wait_s: float = 0.0) -> list[dict]:
        """Start what desired state says should run, with the settings it was launched with.
        An engine that is still running is adopted, not started twice."""
        with S.deck_lock("restore", wait_s):
            desired = S.read_desired()["models"]
            running = self.running()
            out = []
            for name, settings in desired.items():
                if name in running:
                    S.journal("restore", name, "adopted", pid=running[name]["pid"])
                    out.append({"model": name, "outcome": "adopted", "pid": running[name]["pid"]})
                    continue
                cfg = config_from_settings(name, settings, self.cfg)
                try:
                    rec = self._start_locked(name, cfg, reason="restore", evict=False)
                    out.append({"model": name, "outcome": "started", "pid": rec["pid"]})
                except (LaunchError, RefusedError) as e:
                    out.append({"model": name, "outcome": "failed", "error": e.message})
            return out

def is_orphan(rec: dict) -> bool:
    """A launch still `starting` whose servedeck process is gone: nobody will ever finish starting it."""
    owner = rec.get("owner_pid")
    return rec.get("state") == "starting" and bool(owner) and owner != os.getpid() and not P.alive(owner)


def spec_of_record(rec: dict) -> LaunchSpec:
    """Enough of a LaunchSpec, rebuilt from a live record, to probe a running engine."""
    return LaunchSpec(model=rec["model"], engine=rec["engine"], argv=[], env={}, host=rec.get("host", "127.0.0.1"),
                      port=rec["port"], served_name=rec.get("served_name", rec["model"]),
                      health_path=rec.get("spec", {}).get("health_path", "/health"), slot=rec.get("slot", "main"),
                      stop_timeout_s=rec.get("stop_timeout_s", 120.0), ready_timeout_s=0)


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return {}
