"""A campaign file's kind = "shared-prefix" and kind = "trace" workloads: read into the spec `servedeck bench`
would run, refused naming the key (a bad trace line before anything launches), listed by `campaign plan`, and
run by `campaign run` on real llama.cpp into a run folder each."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servedeck.campaign.file import parse
from servedeck.workloads.shared_prefix import shared_prefix_spec
from servedeck.workloads.trace import trace_spec
from servedeck.errors import ConfigError
from servedeck.runs import list_runs, load
from ports import starter_toml

REPO = Path(__file__).resolve().parents[2]

GOOD = '''[campaign]
name = "replays"
model = "smollm2"
gate = false
[[variants]]
name = "a"
args = { parallel = 1 }
[[workloads]]
kind = "shared-prefix"
groups = 2
group_size = 2
prefix_tokens = 96
suffix_tokens = 16
output_tokens = 4
[[workloads]]
kind = "trace"
trace = "t.jsonl"
time_scale = 0.5
block_tokens = 64
seed = 3
'''

# One slot (args.parallel = 1): line 2 is served after line 1 by the slot that holds line 1's prompt, however
# slow the box is, so its first block comes from the cache.
TRACE = "\n".join(json.dumps(r) for r in [
    {"timestamp": 0, "input_length": 80, "output_length": 4, "hash_ids": [1]},
    {"timestamp": 400, "input_length": 144, "output_length": 4, "hash_ids": [1, 3]},
]) + "\n"


def _campaign(tmp: Path, text: str = GOOD, trace: str = TRACE) -> Path:
    (tmp / "t.jsonl").write_text(trace)
    (tmp / "c.toml").write_text(text)
    return tmp / "c.toml"


def test_the_keys_make_the_specs_bench_would_run(tmp_path):
    path = _campaign(tmp_path)
    w = parse(path.read_text(), path).file.workloads
    sp = shared_prefix_spec(w[0])
    assert (sp.groups, sp.group_size, sp.prefix_tokens, sp.suffix_tokens, sp.output_tokens) == (2, 2, 96, 16, 4)
    tr = trace_spec(w[1], path.parent)
    assert (tr.path, tr.time_scale, tr.block_tokens, tr.seed) == (tmp_path / "t.jsonl", 0.5, 64, 3)


@pytest.mark.parametrize("change, expect", [
    (("groups = 2", "groups = 0"), "c.toml: workloads.0: groups must be at least 1, got 0"),
    (("time_scale = 0.5", "time_scale = 0"), "workloads.1: time_scale must be above 0, got 0"),
    (('trace = "t.jsonl"\n', ""), "a trace workload replays a file: give trace"),
    (("seed = 3", "seed = 3\nconcurrency = [2]"), "a trace's schedule is its own"),
    (('kind = "shared-prefix"', 'kind = "chat"'), 'only a kind = "shared-prefix" workload takes'),
    (('trace = "t.jsonl"', 'trace = "missing.jsonl"'), "workloads.1.trace: --trace"),
])
def test_mistakes_are_refused_naming_the_key(tmp_path, change, expect):
    path = _campaign(tmp_path, GOOD.replace(*change))
    with pytest.raises(ConfigError) as e:
        parse(path.read_text(), path)
    assert expect in e.value.message, e.value.message


def test_a_bad_trace_line_is_refused_when_the_campaign_file_is_read(tmp_path):
    path = _campaign(tmp_path, trace=TRACE + '{"timestamp": 1000, "output_length": 4}\n')
    with pytest.raises(ConfigError) as e:
        parse(path.read_text(), path)
    assert "workloads.1.trace:" in e.value.message and "line 3 lacks 'input_length'" in e.value.message


def _cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", *args], capture_output=True, text=True, env=env,
                          timeout=900)


@pytest.mark.engine
@pytest.mark.llamacpp
def test_campaign_plan_and_run_shared_prefix_and_trace_workloads(tmp_path, engines_ready):
    text = starter_toml()
    (tmp_path / "models.toml").write_text(text)
    path = _campaign(tmp_path)
    env = {**os.environ, "SERVEDECK_HOME": str(tmp_path / "home"), "SERVEDECK_RESULTS": str(tmp_path / "results"),
           "SERVEDECK_CONFIG": str(tmp_path / "models.toml")}
    plan = _cli(["campaign", "plan", str(path), "--json"], env)
    assert plan.returncode == 0, plan.stderr
    assert [w["points"] for w in json.loads(plan.stdout)["workloads"]] == [["2 groups x 2, prefix 96"],
                                                                            ["trace t.jsonl"]]
    r = _cli(["campaign", "run", str(path)], env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    views = {(v.get("workload") or {}).get("workload"): v for v in map(load, list_runs(tmp_path / "results" / "runs"))}
    assert views["shared-prefix"]["status"] == "ok" and views["trace"]["status"] == "ok"
    assert views["shared-prefix"]["campaign"]["name"] == "replays"
    lines = [json.loads(ln) for ln in (Path(views["trace"]["path"]) / "requests.jsonl").read_text().splitlines()]
    assert sorted(ln["prompt_index"] for ln in lines) == [1, 2]
    # line 2 begins with line 1's block: served from the cache
    by = {ln["prompt_index"]: ln for ln in lines}
    assert by[2]["cached_tokens"] >= 50, by[2]
