"""A campaign file's kind = "conversations" workload: read, refused naming the key, listed by `campaign plan`,
and run by `campaign run` on real llama.cpp into a run folder with its per-turn figures."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servedeck.workloads.conversations import spec_of
from servedeck.campaign.file import parse
from servedeck.errors import ConfigError
from servedeck.runs import list_runs, load
from ports import starter_toml

GOOD = '''[campaign]
name = "talks"
model = "smollm2"
gate = false
[[variants]]
name = "a"
[[workloads]]
kind = "conversations"
users = 2
turns = 2
turn_tokens = 48
answer_tokens = 4
think_time = "50ms"
system_prompt_tokens = 40
'''


def test_the_keys_make_the_spec_bench_would_run():
    spec = spec_of(parse(GOOD, Path("c.toml")).file.workloads[0])
    assert (spec.users, spec.turns, spec.turn_tokens, spec.answer_tokens, spec.think_time_s,
            spec.system_prompt_tokens) == (2, 2, 48, 4, 0.05, 40)


@pytest.mark.parametrize("change, expect", [
    (("users = 2", "users = 0"), "c.toml: workloads.0: users must be at least 1, got 0"),
    (('think_time = "50ms"', 'think_time = "soon"'), "think_time: 'soon' is not a duration"),
    (("users = 2", "users = 2\nconcurrency = [4]"), "a conversations workload's load is its users"),
    (('kind = "conversations"', 'kind = "chat"'), 'only a kind = "conversations" workload takes'),
])
def test_mistakes_are_refused_naming_the_key(change, expect):
    with pytest.raises(ConfigError) as e:
        parse(GOOD.replace(*change), Path("c.toml"))
    assert expect in e.value.message


def _cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", *args], capture_output=True, text=True, env=env,
                          timeout=900)


@pytest.mark.engine
@pytest.mark.llamacpp
def test_campaign_plan_and_run_a_conversations_workload(tmp_path, engines_ready):
    text = starter_toml()
    (tmp_path / "models.toml").write_text(text)
    (tmp_path / "talks.toml").write_text(GOOD)
    env = {**os.environ, "SERVEDECK_HOME": str(tmp_path / "home"), "SERVEDECK_RESULTS": str(tmp_path / "results"),
           "SERVEDECK_CONFIG": str(tmp_path / "models.toml")}
    plan = _cli(["campaign", "plan", str(tmp_path / "talks.toml"), "--json"], env)
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["workloads"][0]["points"] == ["2 users x 2 turns"]
    r = _cli(["campaign", "run", str(tmp_path / "talks.toml")], env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    views = [load(p) for p in list_runs(tmp_path / "results" / "runs")]
    talks = [v for v in views if (v.get("workload") or {}).get("workload") == "conversations"]
    assert len(talks) == 1
    assert [row["ok"] for row in talks[0]["conversations"]["per_turn"]] == [2, 2]
    assert talks[0]["status"] == "ok"
