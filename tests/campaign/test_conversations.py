"""Issue 25's conversations workload on real llama.cpp (SmolLM2, 4 slots of 8K): users talking at
once, each turn sending the whole history, the engine's own count of cached tokens per turn; a
conversation cut by the context as the ramp is; the spec's rules and the per-turn figures (pure)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from servedeck.workloads.session import Outcome, measured
from servedeck.workloads.conversations import ConversationsSpec, spec_from_options
from servedeck.workloads.session import run as conversations
from servedeck.errors import UsageError
from servedeck.fsio import read_jsonl
from servedeck.loadgen.loop import run as run_loop
from servedeck.loadgen.records import RequestRecord
from servedeck.runs import load
from servedeck.runs.turns import turn_figures


def _run(cfg, model: str, spec: ConversationsSpec):
    out = Outcome()
    with measured(cfg, model, False, out) as target:
        return run_loop(conversations(target, spec, gate_mode=False, outcome=out)).folder


def _turns(folder) -> list[dict]:
    return [ln for ln in read_jsonl(folder / "requests.jsonl") if ln.get("turn") is not None]


@pytest.mark.engine
@pytest.mark.llamacpp
def test_three_users_three_turns_cached_tokens_rise_turn_by_turn(campaign_config, llama):
    spec = ConversationsSpec(users=3, turns=3, turn_tokens=64, answer_tokens=8, system_prompt_tokens=100, seed=3)
    folder = _run(campaign_config, "smollm2", spec)
    lines = _turns(folder)
    assert sorted((ln["conversation"], ln["turn"]) for ln in lines) == [(c, t) for c in range(3) for t in (1, 2, 3)]
    assert all(ln["status"] == "ok" for ln in lines)
    by = {(ln["conversation"], ln["turn"]): ln for ln in lines}
    for c in range(3):
        # the history grows, and from turn 2 on the engine serves at least the previous prompt from its cache
        assert by[(c, 1)]["prompt_tokens"] < by[(c, 2)]["prompt_tokens"] < by[(c, 3)]["prompt_tokens"]
        for t in (2, 3):
            assert by[(c, t)]["cached_tokens"] >= by[(c, t - 1)]["prompt_tokens"], (c, t, by[(c, t)])
    view = load(folder)
    shares = [row["cached_share"] for row in view["conversations"]["per_turn"]]
    assert shares == sorted(shares) and shares[0] < shares[1] < shares[2], shares
    assert [row["turn"] for row in view["conversations"]["per_turn"]] == [1, 2, 3]
    assert view["conversations"]["overall"]["ok"] == 9
    assert [c["reason"] for c in view["conversations"]["cutoffs"]] == ["every turn sent"] * 3
    assert view["status"] == "ok" and view["points"][0]["figures"]["counts"]["ok"] == 9
    md = (folder / "summary.md").read_text()
    assert "## Conversations: figures per turn" in md and "| all | 9 | 9 |" in md
    print("\nper turn: " + "; ".join(f"turn {r['turn']}: cached {r['cached_share']:.0%}, TTFT p50 "
                                     f"{r['ttft_ms_p50']:.0f} ms" for r in view["conversations"]["per_turn"]))


@pytest.mark.engine
@pytest.mark.llamacpp
def test_turn_lengths_drawn_from_a_distribution_and_turns_due_after_the_think_time(campaign_config, llama):
    # each user turn adds uniform:24-200 tokens (drawn per turn, seeded); the next turn is due 50 ms after the
    # previous answer ended, and its record says so (t_target), so schedule lag is the client's own
    spec = spec_from_options(users=2, turns=4, turn_tokens="uniform:24-200", answer_tokens="4", think_time="50ms",
                             system_prompt_tokens=0, content=None, seed=11, request_timeout_s="default",
                             max_context=None)
    assert spec.turn_dist is not None and (spec.turn_dist.low, spec.turn_dist.high) == (24, 200)
    folder = _run(campaign_config, "smollm2", spec)
    by = {(ln["conversation"], ln["turn"]): ln for ln in _turns(folder)}
    assert len(by) == 8 and all(ln["status"] == "ok" for ln in by.values())
    # what each turn added to the prompt: the drawn text plus ~24 tokens of question and template
    added = [by[(c, t)]["prompt_tokens"] - by[(c, t - 1)]["prompt_tokens"] - by[(c, t - 1)]["output_tokens"]
             for c in range(2) for t in (2, 3, 4)]
    assert all(24 <= a <= 200 + 40 for a in added), added
    assert max(added) - min(added) > 30, added  # a fixed 112-token turn would add the same each time (± a few)
    for c in range(2):
        for t in (2, 3, 4):
            assert by[(c, t)]["t_target"] - by[(c, t - 1)]["t_end"] == pytest.approx(0.05, abs=1e-3)
            assert by[(c, t)]["t_send"] >= by[(c, t)]["t_target"]
    assert load(folder)["workload"]["drawn"]["turn_tokens"]["text"] == "uniform:24-200"


@pytest.mark.engine
@pytest.mark.vllm
def test_on_vllm_cached_tokens_come_from_its_usage_and_rise_turn_by_turn(campaign_config, vllm):
    # vLLM caches whole KV blocks (128 tokens on its CPU build, Target.cache_block): from turn 2 on, at least the
    # previous prompt's whole blocks
    spec = ConversationsSpec(users=2, turns=3, turn_tokens=64, answer_tokens=8, system_prompt_tokens=64, seed=5)
    folder = _run(campaign_config, "smollm2-vllm", spec)
    by = {(ln["conversation"], ln["turn"]): ln for ln in _turns(folder)}
    assert len(by) == 6 and all(ln["status"] == "ok" for ln in by.values())
    for c in range(2):
        for t in (2, 3):
            prev = by[(c, t - 1)]["prompt_tokens"]
            assert by[(c, t)]["cached_tokens"] >= (prev // 128) * 128 > 0, (c, t, by[(c, t)])
    shares = [row["cached_share"] for row in load(folder)["conversations"]["per_turn"]]
    assert shares[0] < shares[1] < shares[2], shares
    print(f"\nvLLM cached share per turn: {shares}")


@pytest.mark.engine
@pytest.mark.llamacpp
def test_a_conversation_reaching_the_context_is_cut_and_the_cut_was_said_before(campaign_config, llama):
    spec = ConversationsSpec(users=2, turns=8, turn_tokens=64, answer_tokens=8, max_context=420, seed=4)
    assert spec.cut_turn(420) == 5  # 32 + 5 × (64 + 8 + 24) = 512 > 420; 4 turns: 416
    folder = _run(campaign_config, "smollm2", spec)
    view = load(folder)
    assert view["workload"]["expected_cut_turn"] == 5 and "cut at turn 5 of 8" in view["workload"]["cut_note"]
    cuts = view["conversations"]["cutoffs"]
    assert [c["reason"].startswith("context limit") for c in cuts] == [True, True], cuts
    lines = _turns(folder)
    for c in cuts:  # every turn it did send is on record, and no more
        assert sorted(ln["turn"] for ln in lines if ln["conversation"] == c["conversation"]) == \
            list(range(1, c["turn"] + 1))
        assert 1 <= c["turn"] < 8
    assert all(ln["prompt_tokens"] + ln["output_tokens"] <= 420 for ln in lines)
    assert view["status"] == "ok"


@pytest.mark.parametrize("change, flag", [({"users": 0}, "--users"), ({"turns": 0}, "--turns"),
                                          ({"turn_tokens": 4}, "--turn-tokens"),
                                          ({"answer_tokens": 0}, "--answer-tokens"),
                                          ({"think_time_s": -1.0}, "--think-time"),
                                          ({"content": "random"}, "--content")])
def test_a_bad_option_is_refused_naming_it(change, flag):
    with pytest.raises(UsageError) as e:
        ConversationsSpec(**change).check(None)
    assert flag in e.value.message


def test_a_first_turn_that_cannot_fit_is_refused_before_any_request():
    with pytest.raises(UsageError) as e:
        ConversationsSpec(turn_tokens=300, system_prompt_tokens=200).check(512)
    assert "not even one turn fits a context of 512" in e.value.message


def test_cut_turn_is_none_when_every_turn_fits():
    assert ConversationsSpec(turns=4, turn_tokens=100, answer_tokens=20).cut_turn(4096) is None


def _rec(turn: int, prompt: int, cached: int, ttft_s: float, status: str = "ok") -> RequestRecord:
    return RequestRecord(id=f"r{turn}-{prompt}", kind="measured", t_target=0.0, t_send=1.0, t_first_token=1.0 + ttft_s,
                         chunk_t=[1.0 + ttft_s, 1.1 + ttft_s], chunk_n=[1, 1], t_end=1.1 + ttft_s, prompt_tokens=prompt,
                         output_tokens=2, cached_tokens=cached, status=status, conversation=0, turn=turn)


def test_turn_figures_share_and_ttft_per_turn():
    recs = [_rec(1, 100, 0, 0.2), _rec(1, 100, 50, 0.4), _rec(2, 200, 150, 0.1), _rec(2, 200, 0, 0.3, "error")]
    fig = turn_figures(recs)
    one, two = fig["per_turn"]
    assert one["cached_share"] == pytest.approx(50 / 200)
    assert two["cached_share"] == pytest.approx(150 / 200)  # the failed turn is left out
    assert one["ttft_ms_p50"] == pytest.approx(300.0)
    assert (two["requests"], two["ok"]) == (2, 1)
    assert fig["overall"]["cached_share"] == pytest.approx(200 / 400)


def test_a_turn_survives_the_record_line():
    rec = _rec(2, 10, 5, 0.1)
    back = RequestRecord.from_json(rec.to_json())
    assert (back.conversation, back.turn) == (0, 2)
    assert "turn" not in RequestRecord(id="x", kind="measured", t_target=0.0).to_json()


def _cli(cfg_path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg_path), *args],
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


@pytest.mark.parametrize("args, message, hint", [
    # refused before the model is looked up (victim is not running: that error would come first otherwise)
    (["--users", "0"], "--users must be at least 1", "--users 16"),
    (["--turns", "0"], "--turns must be at least 1", "--turns 6"),
    (["--think-time", "soon"], "--think-time: 'soon' is not a duration", "90s"),
    (["--content", "random"], "--content random is not for it", "--content prose"),
])
def test_servedeck_bench_refuses_a_bad_conversations_option(campaign_config, args, message, hint):
    r = _cli(campaign_config.path, "bench", "victim", "--workload", "conversations", *args, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr
    assert message in r.stderr and "hint:" in r.stderr and hint in r.stderr


@pytest.mark.engine
@pytest.mark.llamacpp
def test_servedeck_bench_workload_conversations_end_to_end(campaign_config, llama):
    r = _cli(campaign_config.path, "bench", "smollm2", "--workload", "conversations", "--users", "2", "--turns", "2",
             "--turn-tokens", "48", "--answer-tokens", "4", "--think-time", "100ms", "--system-prompt-tokens", "40",
             "--seed", "2", "--no-gate", "--json")
    assert r.returncode == 0, r.stderr
    view = json.loads(r.stdout)
    w = view["workload"]
    assert (w["workload"], w["users"], w["turns"], w["think_time_s"], w["system_prompt_tokens"]) == \
        ("conversations", 2, 2, 0.1, 40)
    assert [row["ok"] for row in view["conversations"]["per_turn"]] == [2, 2]
    assert view["status"] == "ok"
