"""A prompt length below what the server's chat template and the unique tag already take is a user's mistake:
refused naming the flag and the least that fits on this server, not a traceback (real llama.cpp)."""

from __future__ import annotations

import pytest

from servedeck.workloads.session import Outcome, measured
from servedeck.workloads.points import BenchSpec
from servedeck.workloads.session import run as bench
from servedeck.errors import UsageError
from servedeck.loadgen import ClosedLoop
from servedeck.loadgen.loop import run as run_loop


@pytest.mark.engine
@pytest.mark.llamacpp
def test_input_tokens_below_the_tag_and_template_is_refused_naming_the_flag(campaign_config, llama):
    spec = BenchSpec(shapes=(ClosedLoop(1),), workload="chat", input_tokens=20, output_tokens=4, requests=1, warmup=0)
    out = Outcome()
    with pytest.raises(UsageError) as e:
        with measured(campaign_config, "smollm2", False, out) as target:
            run_loop(bench(target, spec, gate_mode=False, outcome=out))
    assert e.value.message.startswith("--input-tokens 20: on this server the prompt's unique tag and the chat "
                                      "template alone take "), e.value.message
    assert e.value.hint and e.value.hint.startswith("give --input-tokens ")
