"""Issue 35: a new workload kind is one module and one registry line. The kind here comes from outside servedeck,
a package of one module registered by its own `servedeck.workloads` entry point (what `pip install` leaves
behind; a built-in's line is in workloads/kinds.py's KINDS), touching no servedeck file: `servedeck bench
--workload echo` and a campaign file's `kind = "echo"` (with its own key) both run it on real llama.cpp, into run
folders whose figures the report shows like any kind's."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servedeck.fsio import read_jsonl
from ports import starter_toml

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

PLUGIN = '''
"""`echo`: the same short question, N times one after another, as one point."""
from dataclasses import dataclass
from typing import Any, ClassVar, Optional
import time

from servedeck.loadgen.api import ApiClient
from servedeck.workloads.points import finish_point, put_point
from servedeck.workloads.shape import Key, Kind, Option
from servedeck.workloads.window import engine_window, keep


@dataclass(frozen=True)
class EchoSpec:
    kind: ClassVar[str] = "echo"
    requests: int = 2
    seed: Optional[int] = None

    def to_json(self) -> dict:
        return {"workload": "echo", "points": [f"echo x{self.requests}"], "requests": self.requests}


def fitted(spec, target, ctx):
    return spec


async def run(spec, target, ctx, folder, reporter):
    point = {"index": 0, "label": f"echo x{spec.requests}", "shape": {"echo": spec.requests}, "status": "running"}
    put_point(folder, point)
    records = []
    async with ApiClient(target.base_url) as api:
        async with engine_window(target, folder, point) as window:
            start = time.perf_counter()
            for i in range(spec.requests):
                due = time.perf_counter()
                reply = await api.chat({"model": target.served_name, "max_tokens": 4, "stream": True,
                                        "messages": [{"role": "user", "content": f"Say the number {i}."}],
                                        "stream_options": {"include_usage": True}})
                rec = reply.record
                rec.id, rec.kind = f"echo-{i}", "measured"
                keep(folder, records, rec, start, due)
            point["status"] = "ok"
            point["load"] = window.load(start)
    finish_point(folder, point, records, spec.to_json())
    return None


def check_entry(w):
    if w.echo_requests is not None and w.echo_requests < 1:
        raise ValueError(f"echo_requests must be at least 1, got {w.echo_requests}")


KIND = Kind(name="echo", help="the same question N times",
            options=(Option("echo_requests", ("--echo-requests",), int, 2, "echo: how many times"),),
            from_options=lambda o: EchoSpec(requests=o["echo_requests"]),
            keys=(Key("echo_requests", Optional[int]),), check_entry=check_entry,
            from_entry=lambda w, where: [EchoSpec(requests=w.echo_requests or 2)],
            fitted=fitted, run=run,
            describe=lambda w: f"workload **echo**: the same question {w.get('requests')} times, one by one.")
'''

CAMPAIGN = '''[campaign]
name = "echoes"
model = "smollm2"
gate = false
[[variants]]
name = "a"
[[workloads]]
kind = "echo"
echo_requests = 3
'''


@pytest.fixture
def outside(tmp_path) -> dict[str, str]:
    """The kind's package on its own sys.path entry with dist-info naming its entry point."""
    site = tmp_path / "site"
    (site / "echo_kind").mkdir(parents=True)
    (site / "echo_kind" / "__init__.py").write_text(PLUGIN)
    info = site / "echo_kind-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: echo-kind\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[servedeck.workloads]\necho = echo_kind:KIND\n")
    (tmp_path / "models.toml").write_text(starter_toml())
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "SERVEDECK_HOME": str(tmp_path / "home"), "SERVEDECK_RESULTS": str(tmp_path / "results"),
            "SERVEDECK_CONFIG": str(tmp_path / "models.toml")}


def _cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", *args], capture_output=True, text=True, env=env,
                          timeout=900)


def test_an_outside_kind_runs_through_bench_and_a_campaign_file(tmp_path, engines_ready, outside):
    helped = _cli({**outside, "COLUMNS": "2000"}, "bench", "--help").stdout
    assert "echo (the same question N times)" in helped and "--echo-requests" in helped
    r = _cli(outside, "bench", "smollm2", "--workload", "echo", "--echo-requests", "2", "--launch", "--no-gate", "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    view = json.loads(r.stdout)
    assert view["workload"] == {"workload": "echo", "points": ["echo x2"], "requests": 2}
    assert view["points"][0]["figures"]["counts"]["ok"] == 2 and view["status"] == "ok"
    assert view["points"][0]["figures"]["client"]["cpu_s"] is not None  # the client's self-check, as for any kind
    assert "workload **echo**: the same question 2 times" in (Path(view["path"]) / "summary.md").read_text()

    (tmp_path / "echoes.toml").write_text(CAMPAIGN.replace("echo_requests = 3", "echo_requests = 0"))
    bad = _cli(outside, "campaign", "plan", str(tmp_path / "echoes.toml"))
    assert bad.returncode == 2 and "workloads.0: echo_requests must be at least 1, got 0" in bad.stderr, bad.stderr
    (tmp_path / "echoes.toml").write_text(CAMPAIGN)
    r = _cli(outside, "campaign", "run", str(tmp_path / "echoes.toml"), "--json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert [c["state"] for c in doc["cells"]] == ["done"]
    assert [(p["workload"], p["point"], p["ok"]) for p in doc["points"]] == [("echo", "echo x3", 3)]
    run = tmp_path / "results" / "runs" / doc["cells"][0]["runs"][0]
    assert len(read_jsonl(run / "requests.jsonl")) == 3
