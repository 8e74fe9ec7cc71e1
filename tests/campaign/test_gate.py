"""The needle-in-a-haystack gate on real servers: a pass at a short context, an honest score near
SmolLM2's 8K training context, and a refusal above what the server serves."""

from __future__ import annotations

from pathlib import Path

import pytest

from campaignkit import run_gate
from servedeck.errors import ServedeckError
from servedeck.gates import GateSpec, read_log
from servedeck.runs import load

pytestmark = [pytest.mark.engine]

SEED_KEYS = ["key", "depth", "prompt_tokens", "ok", "latency_s", "answer", "cached_tokens"]


def _probes(folder: Path) -> tuple[list[dict], float | None]:
    return read_log((folder / "niah.log").read_text())


@pytest.mark.llamacpp
def test_gate_passes_at_2k_on_llamacpp(campaign_config, llama):
    out = run_gate(campaign_config, "smollm2", GateSpec(context=2048))
    assert out.gate is not None and out.gate.passed, out.gate
    probes, printed = _probes(out.folder)
    assert printed == round(out.gate.score, 2)
    assert (out.folder / "niah.log").read_text().splitlines()[-1].startswith("GATE niah score= ")
    assert [p["depth"] for p in probes] == [0.1, 0.5, 0.9]
    for p in probes:
        assert list(p)[:7] == SEED_KEYS  # the seed's niah.log line, in its order
        # sized by the server's tokenizer to the context minus the 32-token answer room, within a sentence
        assert 2048 - 32 - 40 <= p["prompt_tokens"] <= 2048 - 32
        assert p["prompt_tokens"] == p["sized_tokens"]  # what /tokenize said is what the server prefilled
        # each probe has its own haystack: only the chat template's opening can come from cache
        assert p["cached_tokens"] is not None and p["cached_tokens"] < 64
    assert len({p["code"] for p in probes}) == 3
    view = load(out.folder)
    assert view["status"] == "ok" and view["gate"]["status"] == "passed" and view["kind"] == "gate"
    assert view["context"] == 8192 and view["gate"]["result"]["context"] == 2048
    assert (out.folder / "summary.md").read_text().count("GATE PASSED") == 1


@pytest.mark.llamacpp
def test_gate_above_the_served_context_is_refused(campaign_config, llama):
    with pytest.raises(ServedeckError) as e:
        run_gate(campaign_config, "smollm2", GateSpec(context=16384))
    assert "above what smollm2 serves per request (8192" in e.value.message
    assert "models.smollm2.context" in e.value.hint


@pytest.mark.vllm
@pytest.mark.slow
# 1K, not 2K: vLLM's CPU build prefilled 3 × 2K prompts in 189 s on the 2-core CI machine
def test_gate_passes_at_1k_on_vllm(campaign_config, vllm):
    out = run_gate(campaign_config, "smollm2-vllm", GateSpec(context=1024))
    assert out.gate.passed, out.gate
    probes, _ = _probes(out.folder)
    for p in probes:
        assert 1024 - 32 - 40 <= p["prompt_tokens"] <= 1024 - 32
        assert p["cached_tokens"] is not None and p["cached_tokens"] < 64
