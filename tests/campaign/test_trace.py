"""Issue 25's trace workload: a trace made by scripts/make_trace.py replayed on real llama.cpp on its own
schedule, a request whose hash_ids begin with an earlier request's block served that block from the
engine's cache; bad traces and a time scale ≤ 0 refused naming the line and the field (pure)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from servedeck.workloads.session import Outcome, measured
from servedeck.workloads.session import run as trace
from servedeck.workloads.trace import TraceSpec
from servedeck.errors import UsageError
from servedeck.fsio import read_jsonl
from servedeck.loadgen.loop import run as run_loop
from servedeck.runs import load

ROOT = Path(__file__).resolve().parents[2]


def _make(path: Path, *args: str) -> None:
    subprocess.run([sys.executable, str(ROOT / "scripts" / "make_trace.py"), str(path), *args], check=True,
                   capture_output=True)


@pytest.mark.engine
@pytest.mark.llamacpp
def test_a_trace_is_replayed_on_its_schedule_and_shared_blocks_come_from_the_cache(campaign_config, llama, tmp_path):
    path = tmp_path / "t.jsonl"
    _make(path, "--chains", "2", "--turns", "2", "--block-tokens", "64", "--gap-ms", "3000", "--output-tokens", "4")
    rows = read_jsonl(path)
    spec = TraceSpec(path=path, time_scale=1.5, block_tokens=64, seed=9)
    out = Outcome()
    with measured(campaign_config, "smollm2", False, out) as target:
        folder = run_loop(trace(target, spec, gate_mode=False, outcome=out)).folder
    lines = {ln["prompt_index"]: ln for ln in read_jsonl(folder / "requests.jsonl")}
    assert sorted(lines) == [1, 2, 3, 4, 5, 6] and all(ln["status"] == "ok" for ln in lines.values())
    # sent when the trace says, scaled: the schedule's offsets are the trace's × 1.5, none sent before its time
    for n in (2, 3, 4, 5, 6):
        want = (rows[n - 1]["timestamp"] - rows[0]["timestamp"]) / 1000 * 1.5
        assert lines[n]["t_target"] - lines[1]["t_target"] == pytest.approx(want, abs=1e-3)
        assert lines[n]["t_send"] >= lines[n]["t_target"]
    # line 4 begins with line 1's block 0: those 64 tokens come from the cache; line 6 has a block of its own
    assert rows[3]["hash_ids"][0] == rows[0]["hash_ids"][0] and rows[5]["hash_ids"][0] not in \
        {i for r in rows[:5] for i in r["hash_ids"]}
    # (line 1 had ended when line 4 was sent: its slot was free to serve line 4's first block)
    assert lines[1]["t_end"] < lines[4]["t_send"]
    # block 0 is the first 64 tokens the server prefills (issue 31 item 20: the chat template's opening counts in
    # them, as every prompt now is the trace's length template included): line 4 gets them from the cache but for
    # the template's closing tokens that end line 1's prompt (5 on SmolLM2's) and the join to its next block;
    # line 6, whose block is its own, gets only the template's opening
    assert lines[4]["cached_tokens"] >= 64 - 8 and lines[4]["cached_tokens"] - lines[6]["cached_tokens"] >= 25, \
        (lines[4]["cached_tokens"], lines[6]["cached_tokens"])
    assert lines[4]["output_tokens"] == 4
    assert load(folder)["status"] == "ok"
    # the client's self-check judged the replay as it judges a bench point: its CPU over the stretch, its loop
    client = load(folder)["points"][0]["figures"]["client"]
    assert client["cpu_s"] is not None and 0 < client["cpu_fraction"] < 1 and client["loop"] in ("uvloop", "asyncio")
    assert client["lag_ms"]["n"] == 6


@pytest.mark.parametrize("text, expect", [
    ('{"timestamp": 0, "input_length": 64, "output_length": 4}\nnot json\n', "line 2 is not JSON"),
    ('{"timestamp": 0, "input_length": 64, "output_length": 4}\n{"timestamp": 5, "input_length": 64}\n',
     "line 2 lacks 'output_length'"),
    ('{"timestamp": 0, "input_length": 0, "output_length": 4}\n', "line 1: input_length 0 is not a whole number"),
    ('{"timestamp": 0, "input_length": 9, "output_length": 4, "hash_ids": "a"}\n', "line 1: hash_ids 'a' is not a list"),
])
def test_a_bad_trace_is_refused_naming_the_line_and_field(tmp_path, text, expect):
    path = tmp_path / "bad.jsonl"
    path.write_text(text)
    with pytest.raises(UsageError) as e:
        TraceSpec(path=path).check()
    assert expect in e.value.message


@pytest.mark.parametrize("scale", [0.0, -1.0])
def test_a_time_scale_not_above_zero_is_refused(tmp_path, scale):
    path = tmp_path / "t.jsonl"
    _make(path)
    with pytest.raises(UsageError) as e:
        TraceSpec(path=path, time_scale=scale).check()
    assert "--time-scale must be above 0" in e.value.message


def test_the_window_keeps_the_trace_s_first_seconds(tmp_path):
    path = tmp_path / "t.jsonl"
    _make(path, "--gap-ms", "1000")
    rows = TraceSpec(path=path, window_s=2.5).check()
    assert rows and all(r.timestamp_ms < 2500 for r in rows)
    assert len(rows) < len(read_jsonl(path))


@pytest.mark.parametrize("args, message", [
    (["--trace", "BAD"], "line 2 lacks 'input_length'"),
    (["--trace", "GOOD", "--time-scale", "0"], "--time-scale must be above 0, got 0"),
    ([], "--workload trace replays a file: give --trace FILE"),
])
def test_servedeck_bench_refuses_a_bad_trace_before_any_launch(campaign_config, tmp_path, args, message):
    bad, good = tmp_path / "bad.jsonl", tmp_path / "good.jsonl"
    bad.write_text('{"timestamp": 0, "input_length": 64, "output_length": 4}\n{"timestamp": 5}\n')
    _make(good)
    args = [str(bad) if a == "BAD" else str(good) if a == "GOOD" else a for a in args]
    # victim is not running: refused before the model is looked up
    r = subprocess.run([sys.executable, "-m", "servedeck", "--config", str(campaign_config.path), "bench", "victim",
                        "--workload", "trace", *args], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and message in r.stderr and "hint:" in r.stderr
