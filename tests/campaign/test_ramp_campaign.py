"""Issue 31 item 7 / issue 35: `kind = "ramp"` in a campaign file, as seed 000 ran its ramp to 1M as a campaign
workload: its keys (turn_tokens, answer_tokens, the needle's needle_every and stop_on_miss, the cut-off's
max_context, time_cap and turn_timeout) read into the spec `servedeck ramp` runs and refused naming the key; the
run's time cap ending a turn still running, that turn kept and excluded ("the last turn hit the run's time cap and
is excluded"); a cell's cut-off passing before a later workload started, which says so ("the two-conversation ramp
never started before the campaign cut-off"); and a two-variant campaign of ramps on real llama.cpp."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servedeck.campaign.file import parse
from servedeck.errors import ConfigError
from servedeck.loadgen.api import ApiClient
from servedeck.runs import list_runs, load
from servedeck.testing.instrument_process import InstrumentProcess
from servedeck.workloads import ramp
from servedeck.workloads.kinds import KINDS
from servedeck.workloads.points import BenchSpec
from servedeck.workloads.shape import Entry
from servedeck.workloads.stall import Quiet, StallWatch
from ports import starter_toml

RAMP = '''[campaign]
name = "ramp-1m"
model = "smollm2"
gate = false
cell_timeout = "10m"

[[variants]]
name = "p1"
args = { parallel = 1 }

[[variants]]
name = "p2"
args = { parallel = 2 }

[[workloads]]
kind = "ramp"
turn_tokens = 300
answer_tokens = 8
max_context = 1600
needle_every = 2
time_cap = "5m"
turn_timeout = "2m"
seed = 7
'''


def _spec(text: str):
    [w] = parse(text, Path("c.toml")).file.workloads
    return KINDS[w.kind].from_entry(w, Entry())


def test_the_ramp_keys_make_the_spec_servedeck_ramp_would_run():
    [spec] = _spec(RAMP.replace("seed = 7", "seed = 7\nstop_on_miss = true"))
    assert (spec.turn_tokens, spec.answer_tokens, spec.max_context, spec.needle_every, spec.time_cap_s,
            spec.turn_timeout_s, spec.stop_on_miss, spec.seed, spec.content) == \
        (300, 8, 1600, 2, 300.0, 120.0, True, 7, "prose")
    # and with none of its keys, `servedeck ramp`'s defaults
    [plain] = _spec(RAMP.split("[[workloads]]")[0] + '[[workloads]]\nkind = "ramp"\n')
    assert (plain.turn_tokens, plain.answer_tokens, plain.needle_every, plain.time_cap_s, plain.turn_timeout_s) == \
        (2000, 64, 4, 7200.0, 1200.0)


@pytest.mark.parametrize("change, expect", [
    (('time_cap = "5m"', 'time_cap = "soon"'), "c.toml: workloads.0: time_cap: 'soon' is not a duration"),
    (("turn_tokens = 300", 'turn_tokens = "uniform:100-300"'),
     "turn_tokens: 'uniform:100-300' is not a whole number of tokens"),
    (("turn_tokens = 300", "turn_tokens = 8"), "turn_tokens must be at least 32, got 8"),
    (("needle_every = 2", "needle_every = -1"), "needle_every must be 0 (never) or more, got -1"),
    (("max_context = 1600", "max_context = 200"), "does not fit a context of 200 tokens"),
    (("seed = 7", "seed = 7\nconcurrency = [2]"), "a ramp grows one conversation: drop concurrency/rate"),
    (('kind = "ramp"', 'kind = "chat"'), 'needle_every, time_cap, turn_timeout: only a kind = "ramp" workload takes'),
])
def test_ramp_mistakes_are_refused_naming_the_key(change, expect):
    with pytest.raises(ConfigError) as e:
        parse(RAMP.replace(*change), Path("c.toml"))
    assert expect in e.value.message, e.value.message


def test_a_key_two_kinds_share_names_both():
    text = RAMP.replace('kind = "ramp"', 'kind = "chat"').replace("needle_every = 2\n", "") \
        .replace('time_cap = "5m"\n', "").replace('turn_timeout = "2m"\n', "")
    with pytest.raises(ConfigError) as e:
        parse(text, Path("c.toml"))
    assert ('turn_tokens, answer_tokens, max_context: only a kind = "ramp" or kind = "conversations" workload '
            "takes them") in e.value.message


def test_decode_is_a_campaign_workload_with_servedeck_bench_s_defaults():
    [spec] = _spec(RAMP.split("[[workloads]]")[0] + '[[workloads]]\nkind = "decode"\n')
    assert isinstance(spec, BenchSpec) and spec.workload == "decode" and spec.api == "completions"
    assert (spec.output_tokens, spec.requests, spec.duration_s) == (256, 3, None)


def test_the_time_cap_ends_a_turn_still_running():
    """The run's time cap passing 0.6 s into a 2-second answer ends that turn as time-capped, with the tokens
    that had come; the measuring instrument streams slowly on purpose."""
    inst = InstrumentProcess("--ttft-ms", "20", "--itl-ms", "50", "--tokens", "40")
    try:
        async def go() -> dict:
            async with ApiClient(inst.url) as api:
                quiet = Quiet()
                watch = StallWatch(None, None, None, on_tick=lambda q: None, tick_s=0.1,  # type: ignore[arg-type]
                                   cap_at=time.perf_counter() + 0.6, cap_what="the run's time cap of 3 s")
                body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 40,
                        "stream": True, "stream_options": {"include_usage": True}}
                task = asyncio.ensure_future(ramp.stream_turn(api, body, quiet))
                verdict = await watch.watch(task, quiet)
                assert verdict is not None
                return {"verdict": verdict, "tokens": quiet.tokens}

        out = asyncio.run(go())
    finally:
        inst.stop()
    assert out["verdict"]["status"] == ramp.CAPPED
    assert out["verdict"]["detail"].startswith("the run's time cap of 3 s passed during this request")
    assert 0 < out["tokens"] < 40


def _line(turn: int, status: str, ctx: int | None) -> dict:
    return {"turn": turn, "status": status, "context_tokens": ctx, "completion_tokens": 8 if ctx else None,
            "ttft_s": 0.5 if ctx else None, "decode_tok_s": 30.0 if ctx else None, "prefill_tok_s": None,
            "cached_share": None, "needle": None}


def test_a_time_capped_turn_is_kept_and_excluded_from_every_figure():
    lines = [_line(1, "ok", 330), _line(2, "ok", 660), _line(3, ramp.CAPPED, None)]
    tally = ramp.summarize(lines)
    assert (tally["turns"], tally["ok_turns"], tally["max_context_tokens"]) == (3, 2, 660)
    assert tally["curve"][-1]["status"] == ramp.CAPPED and tally["curve"][-1]["ttft_s"] is None
    view = {"ramp": {"cutoff": {"turn": 2, "reason": "time cap of 3 s reached during turn 3 (that turn is excluded)"},
                     "turns": lines, "ok_turns": 2, "max_context_tokens": 660, "limit": 8192}}
    text = "\n".join(ramp.section(view))
    assert "Turn 3 hit the run's time cap and is excluded from every figure." in text
    assert ramp.headline(view).startswith("ramp: 2 turns to 660 tokens")


def _env(tmp_path: Path) -> dict:
    (tmp_path / "models.toml").write_text(starter_toml())
    return {**os.environ, "SERVEDECK_HOME": str(tmp_path / "home"), "SERVEDECK_RESULTS": str(tmp_path / "results"),
            "SERVEDECK_CONFIG": str(tmp_path / "models.toml")}


def _cli(args: list[str], env: dict, timeout: float = 1200) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", *args], capture_output=True, text=True, env=env,
                          timeout=timeout)


@pytest.mark.engine
@pytest.mark.llamacpp
def test_a_two_variant_campaign_of_ramps_on_llama_cpp(tmp_path, engines_ready):
    env = _env(tmp_path)
    (tmp_path / "ramp.toml").write_text(RAMP)
    plan = _cli(["campaign", "plan", str(tmp_path / "ramp.toml"), "--json"], env)
    assert plan.returncode == 0, plan.stderr
    assert [(w["kind"], w["points"]) for w in json.loads(plan.stdout)["workloads"]] == [("ramp", [])]
    r = _cli(["campaign", "run", str(tmp_path / "ramp.toml"), "--json"], env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert [c["state"] for c in doc["cells"]] == ["done", "done"]
    ramps = [load(p) for p in list_runs(tmp_path / "results" / "runs")]
    ramps = [v for v in ramps if (v.get("workload") or {}).get("workload") == "ramp"]
    assert sorted(v["layout"] for v in ramps) == ["p1", "p2"]
    for v in ramps:
        r_ = v["ramp"]
        assert v["status"] == "ok" and r_["cutoff"]["reason"].startswith("context limit"), r_["cutoff"]
        assert r_["ok_turns"] >= 3 and r_["needle_checks"] >= 1 and r_["limit"] == 1600
        assert [t["turn"] for t in r_["turns"]] == list(range(1, len(r_["turns"]) + 1))
        assert v["workload"]["time_cap_s"] == 300.0 and v["campaign"]["name"] == "ramp-1m"
        assert (v.get("telemetry") or {}).get("point") == "ramp"  # sampled as one stretch, as `servedeck ramp` is
    # the campaign's own summary has a line of each ramp's figures
    assert [s["workload"] for s in doc["stretches"]] == ["ramp", "ramp"]
    md = next((tmp_path / "results" / "campaigns").glob("*/campaign.md")).read_text()
    assert "## Runs without load points" in md and md.count("| ramp | ok | ramp: ") == 2


CUT = '''[campaign]
name = "ramp-cut"
model = "smollm2"
gate = false
cell_timeout = "25s"

[[variants]]
name = "a"
args = { parallel = 1, threads = 1 }

[[workloads]]
kind = "chat"
concurrency = [1]
input_tokens = 48
output_tokens = 8
duration = "10m"
warmup = 0

[[workloads]]
kind = "ramp"
label = "two-conversation ramp"
turn_tokens = 300
'''


@pytest.mark.engine
@pytest.mark.llamacpp
def test_a_workload_the_cell_s_cut_off_came_before_says_it_never_started(tmp_path, engines_ready):
    env = _env(tmp_path)
    (tmp_path / "cut.toml").write_text(CUT)
    r = _cli(["campaign", "run", str(tmp_path / "cut.toml"), "--json"], env, timeout=600)
    assert r.returncode == 1, r.stdout[-3000:] + r.stderr[-3000:]
    [cell] = json.loads(r.stdout)["cells"]
    assert cell["state"] == "timed-out" and cell["reason"].startswith("cell_timeout 25s passed"), cell
    assert cell["not_started"] == ["two-conversation ramp"]
    assert "never started: two-conversation ramp" in cell["reason"]
    # the workload the cut-off stopped keeps its folder, and no ramp folder was made
    [first] = [load(p) for p in list_runs(tmp_path / "results" / "runs")]
    assert first["workload"]["workload"] == "chat" and first["status"] == "failed"
