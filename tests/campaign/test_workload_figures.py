"""Pure parts of the workloads: speculation figures from the engine's account only, the output
comparison, the ramp's per-turn line, and the request table merge."""

from __future__ import annotations

from servedeck.workloads.outputs import compare, compare_one, prompts
from servedeck.workloads.ramp import _Turn, summarize, turn_line
from servedeck.config.schema import merge_request
from servedeck.engines import get_engine
from servedeck.loadgen.records import RequestRecord
from servedeck.runs.figures import spec_figures

LLAMA = get_engine("llamacpp")
VLLM = get_engine("vllm")


def rec(timings=None, out=10) -> RequestRecord:
    return RequestRecord(id="r", kind="measured", t_target=0, status="ok", output_tokens=out, timings=timings)


def test_counters_give_acceptance_length_and_tokens_per_step():
    before = {"drafts": 10, "draft_tokens": 40, "accepted_tokens": 20, "generation_tokens": 100,
              "accepted_per_pos": {"0": 8, "1": 6}}
    after = {"drafts": 30, "draft_tokens": 120, "accepted_tokens": 80, "generation_tokens": 220,
             "accepted_per_pos": {"0": 26, "1": 20}}
    f = spec_figures(before, after, [], {"method": "ngram"}, {})
    assert f["acceptance_rate"] == 60 / 80
    assert f["mean_acceptance_length"] == 1 + 60 / 20
    assert f["tokens_per_step"] == 120 / (120 - 60)
    assert f["acceptance_per_position"] == {"0": 18 / 20, "1": 14 / 20}
    assert f["absent"] == {} and "counters" in f["source"]


def test_per_response_timings_stand_in_and_say_what_is_absent():
    recs = [rec({"draft_n": 12, "draft_n_accepted": 9, "predicted_n": 30}),
            rec({"draft_n": 8, "draft_n_accepted": 3, "predicted_n": 20})]
    f = spec_figures(None, None, recs, {"method": "ngram-simple"}, LLAMA.spec_timings)
    assert f["acceptance_rate"] == 12 / 20 and f["tokens_per_step"] == 50 / (50 - 12)
    assert f["mean_acceptance_length"] is None and "draft rounds" in f["absent"]["mean_acceptance_length"]
    assert "per-response" in f["source"]


def test_no_speculation_is_none_and_silence_is_stated():
    assert spec_figures({"draft_tokens": 0, "accepted_tokens": 0}, {"draft_tokens": 0, "accepted_tokens": 0},
                        [rec()], None, LLAMA.spec_timings) is None
    f = spec_figures(None, None, [rec()], {"method": "ngram"}, {})
    assert f["source"] is None and "no speculation counters" in f["absent"]["all"]


def test_adapters_read_speculation_from_argv():
    assert LLAMA.speculation(["llama-server", "--spec-type", "ngram-simple", "--spec-draft-n-max", "4"]) == \
        {"method": "ngram-simple", "draft_max": "4"}
    assert LLAMA.speculation(["llama-server", "-m", "x.gguf"]) is None
    got = VLLM.speculation(["python", "--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}'])
    assert got["method"] == "ngram" and got["draft_max"] == 3


def test_compare_reports_first_diverging_token_and_both_continuations():
    a = {"index": 0, "prompt_sha": "s", "token_ids": [1, 2, 3, 4], "tokens": ["a", "b", "c", "d"]}
    b = {"index": 0, "prompt_sha": "s", "token_ids": [1, 2, 9, 4], "tokens": ["a", "b", "X", "d"]}
    r = compare_one(a, b)
    assert r["verdict"] == "differs" and r["position"] == 2 and r["a"] == "cd" and r["b"] == "Xd"
    assert compare_one(a, dict(a))["verdict"] == "identical"
    shorter = {**a, "token_ids": [1, 2], "tokens": ["a", "b"]}
    assert compare_one(a, shorter)["position"] == 2
    text_only = compare_one({"index": 1, "prompt_sha": "s", "text": "hello world"},
                            {"index": 1, "prompt_sha": "s", "text": "hello there"})
    assert text_only["unit"] == "character" and text_only["position"] == 6
    assert compare([a], [b])["verdict"] == "differs" and compare([a], [a])["verdict"] == "identical"
    assert compare([a], [{**b, "prompt_sha": "t"}])["verdict"] == "not comparable"


def test_output_prompts_are_fixed_prose_and_code():
    p1, p2 = prompts(), prompts()
    assert p1 == p2 and len(p1) == 8
    assert [p["content"] for p in p1] == ["prose", "code"] * 4


def test_turn_line_uses_the_servers_counts():
    turn = _Turn(t_send=10.0, t_first=12.0, t_end=14.0, content="ok",
                 usage={"prompt_tokens": 3000, "completion_tokens": 21},
                 timings={"prompt_n": 1000, "cache_n": 2000, "predicted_n": 21})
    ln = turn_line(2, turn, {"asked": True, "found": True}, None, 0.0)
    assert ln["context_tokens"] == 3000 and ln["cached_tokens"] == 2000 and ln["new_tokens"] == 1000
    assert ln["prefill_tok_s"] == 500 and ln["decode_tok_s"] == 10 and ln["cached_share"] == 2000 / 3000
    cold = turn_line(3, _Turn(t_send=0, t_first=1, t_end=2, usage={"prompt_tokens": 100, "completion_tokens": 2,
                                                                  "prompt_tokens_details": {"cached_tokens": 10}}),
                     None, None, 0.0, prev_context=80)
    assert "not reused" in cold["cache_note"]
    # vLLM's CPU backend caches whole 128-token blocks: 896 of a 1,000-token prefix is full reuse
    blocky = _Turn(t_send=0, t_first=1, t_end=2, usage={"prompt_tokens": 2000, "completion_tokens": 2,
                                                         "prompt_tokens_details": {"cached_tokens": 896}})
    assert "cache_note" not in turn_line(2, blocky, None, None, 0.0, prev_context=1000, cache_block=128)
    assert "cache_note" in turn_line(2, blocky, None, None, 0.0, prev_context=1000, cache_block=1)
    s = summarize([ln, cold])
    assert s["needle_checks"] == 1 and s["needle_found"] == 1 and s["max_context_tokens"] == 3000


def test_request_table_merges_tables_key_by_key():
    body = {"model": "m", "chat_template_kwargs": {"a": 1}}
    assert merge_request(body, {"chat_template_kwargs": {"enable_thinking": False}, "top_k": 1}) == \
        {"model": "m", "chat_template_kwargs": {"a": 1, "enable_thinking": False}, "top_k": 1}


def test_vllm_speculation_counters_per_position_from_metrics_text():
    from servedeck.engines.metrics import spec_counters

    page = "\n".join([
        '# HELP vllm:spec_decode_num_drafts_total drafts',
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0',
        'vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 20.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 7.0',
        'vllm:generation_tokens_total{model_name="m"} 55.0'])
    assert spec_counters("vllm", page) == {"drafts": 10.0, "draft_tokens": 30.0, "accepted_tokens": 20.0,
                                           "accepted_per_pos": {"0": 9.0, "1": 7.0}, "generation_tokens": 55.0}
    assert spec_counters("vllm", 'vllm:generation_tokens_total{model_name="m"} 55.0') is None


def test_gate_answer_room_is_checked():
    import pytest

    from servedeck.errors import ServedeckError
    from servedeck.gates import GateSpec

    GateSpec(context=4096, answer_tokens=512).check()
    with pytest.raises(ServedeckError, match="--answer-tokens must be at least 1"):
        GateSpec(context=4096, answer_tokens=0).check()
