"""The door in front of a models.toml entry's replicas for bench/routing_side_by_side.py --config: `servedeck
serve --no-watch` on a copy of the user's models.toml in which the entry's `routing` is the arm's policy, in the
bench's SERVEDECK_HOME, where the deck recorded the replicas it started: the door finds them ready there (its
sync of the live records) and routes to them with the entry's policy, exactly as to replicas it started itself.

--no-watch: the door's watch loop would send each ready replica a 1-token completion at once and then every
host.liveness_interval_s (its liveness probe), which the replicas' counters (cached share, requests served)
would count beside the workload's; vllm-router sends none. The copy differs from the file in two things:
  models.NAME.routing   the arm's policy (a table naming the same policy keeps its knobs)
  host.api_keys         dropped: the door listens on loopback for the bench's client alone
and paths written relative to the file (`./`, `../`, which servedeck reads against the file's folder) are
made absolute, so the copy means the same from the bench's temp folder."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from servedeck.modelsfile import parse
from servedeck.supervisor.process import stop_group

from servedeck.testing.ports import free_port  # below the ephemeral range: that module says why

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10 (servedeck's own loader uses tomli there too)
    import tomli as tomllib  # type: ignore[no-redef]

def _key(k: str) -> str:
    return json.dumps(k, ensure_ascii=False)


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return ("inf" if v > 0 else "-inf") if math.isinf(v) else "nan" if math.isnan(v) else repr(v)
    if isinstance(v, str):
        # a JSON string is a TOML basic string, but for DEL, which TOML wants escaped
        return json.dumps(v, ensure_ascii=False).replace("\x7f", "\\u007F")
    if isinstance(v, list):
        return "[" + ", ".join(_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_key(k)} = {_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    raise TypeError(f"models.toml value of type {type(v).__name__} cannot be written back: {v!r}")


def toml_text(data: dict[str, Any]) -> str:
    """TOML for what tomllib read from a models.toml: top-level tables and their sub-tables as [headers],
    anything deeper inline. Hand-written because the standard library reads TOML but writes none, and a
    writer's wheel (tomli-w) would be one more to carry to the GPU device for these lines."""
    out = [f"{_key(k)} = {_value(v)}" for k, v in data.items() if not isinstance(v, dict)]
    for k, table in data.items():
        if not isinstance(table, dict):
            continue
        out += ["", f"[{_key(k)}]"]
        out += [f"{_key(kk)} = {_value(v)}" for kk, v in table.items() if not isinstance(v, dict)]
        for kk, sub in table.items():
            if isinstance(sub, dict):
                out += ["", f"[{_key(k)}.{_key(kk)}]"]
                out += [f"{_key(name)} = {_value(v)}" for name, v in sub.items()]
    return "\n".join(out) + "\n"


def _absolute(v: Any, base: Path) -> Any:
    if isinstance(v, str) and v.startswith(("./", "../")):
        return str((base / v).resolve())
    if isinstance(v, list):
        return [_absolute(x, base) for x in v]
    if isinstance(v, dict):
        return {k: _absolute(x, base) for k, x in v.items()}
    return v


def door_config(raw: dict[str, Any], entry: str, policy: str, base: Path) -> dict[str, Any]:
    """The door's copy of a models.toml (as tomllib read it; `base` its folder) for one arm: see the module."""
    data = _absolute(raw, base)  # a new tree: `raw` is left as it was
    model = data["models"][entry]
    had = model.get("routing")
    keep = isinstance(had, dict) and had.get("policy") == policy
    model["routing"] = had if keep else policy
    data.get("host", {}).pop("api_keys", None)
    return data


class DoorOnDeck:
    """`servedeck serve` in its own process group on the arm's copy of models.toml, sharing the bench's
    SERVEDECK_HOME; ready once /door/status shows the entry ready with all its replicas. Stopping it
    leaves the replicas running: the deck that started them stops them."""

    def __init__(self, config: Path, entry: str, policy: str, replicas: int, home: Path, work: Path) -> None:
        raw = tomllib.loads(config.read_text())
        self.config = work / f"door-{policy}.models.toml"
        text = toml_text(door_config(raw, entry, policy, config.parent))
        checked = parse(text, self.config)  # servedeck's own loader: the copy means what the arm says
        got = {checked.models[m].routing.policy for m in checked.groups[entry].members}
        if got != {policy}:
            raise RuntimeError(f"the door's copy of {config} routes {entry} by {got}, not {policy!r}")
        self.config.write_text(text)
        self.entry, self.policy = entry, policy
        env = dict(os.environ, SERVEDECK_HOME=str(home), SERVEDECK_CONFIG=str(self.config))
        env.pop("SERVEDECK_API_KEY", None)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.argv = [sys.executable, "-m", "servedeck", "serve", "--port", str(self.port), "--no-watch"]
        self.err = (work / f"door-{policy}.stderr").open("w+")
        self.proc = subprocess.Popen(self.argv, env=env, stdout=subprocess.DEVNULL, stderr=self.err,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            self._wait_ready(replicas)
        except BaseException:
            self.stop()
            raise

    def _wait_ready(self, replicas: int, timeout_s: float = 60.0) -> None:
        t0, seen = time.monotonic(), None
        while time.monotonic() - t0 < timeout_s:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the door exited ({self.proc.returncode}): {self._stderr()}")
            try:
                snap = httpx.get(self.url + "/door/status", timeout=5).json()
                seen = next((m for m in snap["models"] if m["model"] == self.entry), None)
                if seen and seen["state"] == "ready" and len(seen["replicas"]) == replicas:
                    return
            except (httpx.TransportError, ValueError, KeyError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the door did not show {self.entry} ready with {replicas} replicas within "
                           f"{timeout_s:g} s (last seen: {seen}); its stderr: {self._stderr()}")

    def _stderr(self) -> str:
        self.err.flush()
        self.err.seek(0)
        return self.err.read()[-2000:]

    @property
    def front_argv(self) -> list[str]:
        return ["servedeck", "serve", "--port", "PORT", "--no-watch",
                f"(SERVEDECK_CONFIG: the models.toml with models.{self.entry}.routing = {self.policy!r})"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            stop_group(self.proc.pid, 30.0)  # its whole group: SIGTERM, grace, SIGKILL
            self.proc.wait()
        self.err.close()
