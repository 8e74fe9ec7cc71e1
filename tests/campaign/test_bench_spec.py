"""BenchSpec.from_options: `servedeck bench`'s options (parsed) → the spec, with each workload's defaults and
every rule checked once, before any server is asked. No engine: the spec is plain data."""

from __future__ import annotations

import pytest

from servedeck.workloads.kinds import WorkloadChoice

from servedeck.workloads.options import ContentChoice

from servedeck.workloads.points import ArrivalsChoice, BenchSpec
from servedeck.errors import ServedeckError
from servedeck.loadgen import ClosedLoop, OpenLoop
from servedeck.loadgen.texts import CONTENTS


@pytest.mark.parametrize("workload, output, duration_s, requests, timeout_s, input_tokens", [
    ("chat", 1024, 60.0, None, 600.0, 1024),
    ("long-prompt", 64, None, 3, None, None),
    ("decode", 256, None, 3, None, 1024),
])
def test_each_workload_fills_in_its_own_defaults(workload, output, duration_s, requests, timeout_s, input_tokens):
    spec = BenchSpec.from_options(workload)
    assert spec.output_tokens == output
    assert (spec.duration_s, spec.requests) == (duration_s, requests)
    assert spec.request_timeout_s == timeout_s
    assert spec.input_tokens == input_tokens
    assert spec.shapes == (ClosedLoop(1),)
    assert spec.content == "random"


def test_a_long_prompt_keeps_prompt_tokens_and_drops_input_tokens():
    spec = BenchSpec.from_options("long-prompt", input_tokens=512, prompt_tokens=3000)
    assert (spec.input_tokens, spec.prompt_tokens) == (None, 3000)


def test_chat_drops_prompt_tokens():
    assert BenchSpec.from_options("chat", prompt_tokens=3000).prompt_tokens is None


def test_requests_alone_leave_chat_without_its_default_duration():
    spec = BenchSpec.from_options("chat", requests=5)
    assert (spec.duration_s, spec.requests) == (None, 5)


def test_a_duration_alone_leaves_a_long_prompt_without_its_default_requests():
    spec = BenchSpec.from_options("long-prompt", duration_s=30.0)
    assert (spec.duration_s, spec.requests) == (30.0, None)


def test_no_request_timeout_is_kept_apart_from_the_default():
    assert BenchSpec.from_options("chat", request_timeout_s=None).request_timeout_s is None
    assert BenchSpec.from_options("long-prompt", request_timeout_s=90.0).request_timeout_s == 90.0


def test_rates_are_open_loop_points_with_their_arrivals():
    spec = BenchSpec.from_options(WorkloadChoice.chat, rate=[2.0, 4.0], arrivals=ArrivalsChoice.constant)
    assert spec.shapes == (OpenLoop(2.0, "constant"), OpenLoop(4.0, "constant"))


def test_choices_arrive_in_the_spec_as_plain_strings():
    # summary.json and every comparison downstream read the same strings as before the Enums
    spec = BenchSpec.from_options(WorkloadChoice.long_prompt, content=ContentChoice.code)
    assert type(spec.workload) is str and spec.workload == "long-prompt"
    assert type(spec.content) is str and spec.content == "code"
    assert type(spec.shapes[0]) is ClosedLoop


def test_the_content_choices_are_the_texts_loadgen_has():
    assert tuple(c.value for c in ContentChoice) == CONTENTS


def test_concurrency_and_rate_together_are_refused():
    with pytest.raises(ServedeckError, match="two different load shapes"):
        BenchSpec.from_options("chat", concurrency=[1], rate=[2.0])


@pytest.mark.parametrize("options, message", [
    ({"client_procs": 0}, "--client-procs must be at least 1, got 0"),
    ({"requests": 0}, "--requests must be at least 1, got 0"),
    ({"warmup": -1}, "--warmup must be 0 or more, got -1"),
    # 0 is refused, not silently replaced by the workload's default of 1024
    ({"output_tokens": 0}, "outputs at least 1"),
    ({"input_tokens": 8}, "prompts need at least 16 tokens"),
])
def test_a_bad_value_is_refused_when_the_spec_is_built(options, message):
    with pytest.raises(ServedeckError, match=message):
        BenchSpec.from_options("chat", **options)


def test_a_long_prompt_to_be_sized_from_the_context_waits_for_it():
    spec = BenchSpec.from_options("long-prompt", output_tokens=64)  # prompt_tokens: context − output, later
    spec.check(None)
    assert spec.prompt_tokens is None


def test_the_context_check_names_the_option_to_lower():
    spec = BenchSpec.from_options("chat", input_tokens=9000, output_tokens=16)
    with pytest.raises(ServedeckError, match="do not fit the server's context of 8192") as e:
        spec.check(8192)
    assert e.value.hint is not None and "--input-tokens" in e.value.hint


def test_the_ramp_is_not_a_bench_spec():
    with pytest.raises(ValueError, match="RampSpec"):
        BenchSpec.from_options(WorkloadChoice.ramp)


@pytest.mark.parametrize("kind, output, duration_s, requests", [
    ("chat", 1024, 60.0, None),
    ("long-prompt", 64, None, 3),
])
def test_a_campaign_workload_gets_the_same_defaults_as_servedeck_bench(kind, output, duration_s, requests):
    from servedeck.campaign.file import WorkloadCfg
    from servedeck.workloads.kinds import KINDS
    from servedeck.workloads.shape import Entry

    [spec] = KINDS[kind].from_entry(WorkloadCfg(kind=kind), Entry())
    assert (spec.output_tokens, spec.duration_s, spec.requests) == (output, duration_s, requests)
