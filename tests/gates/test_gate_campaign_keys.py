"""Campaign files take `gate = { niah = {...}, eval = {...} }`; bad gate keys and bad question files are
refused before any launch, naming the key or the file and line."""

from __future__ import annotations

from pathlib import Path

import pytest

from servedeck.campaign.accuracy import campaign_gate, check_campaign_gate
from servedeck.campaign.file import parse
from servedeck.errors import ConfigError, UsageError

TAIL = """
[[variants]]
name = "base"

[[workloads]]
kind = "chat"
"""


def _camp(gate: str, tmp_path: Path):
    return parse(f'[campaign]\nname = "c"\nmodel = "smollm2"\ngate = {gate}\n' + TAIL, tmp_path / "c.toml")


def test_nested_needle_and_eval(tmp_path):
    c = _camp('{ niah = { context = 600, depths = [0.5] }, eval = { path = "q.jsonl", limit = 200, threshold = 0.3 } }',
              tmp_path)
    assert c.head.gate.needle.context == 600 and c.head.gate.needle.depths == [0.5]
    g = campaign_gate(c)
    assert g.kind == "exact" and g.limit == 200 and g.threshold == 0.3
    assert g.path == tmp_path / "q.jsonl"  # relative to the campaign file


def test_the_flat_needle_keys_still_mean_the_needle(tmp_path):
    c = _camp("{ context = 700 }", tmp_path)
    assert c.head.gate.needle.context == 700 and campaign_gate(c) is None


def test_niah_false_leaves_the_accuracy_gate_alone(tmp_path):
    c = _camp('{ niah = false, eval = { path = "q.jsonl", threshold = 0.5 } }', tmp_path)
    assert c.head.gate.needle is None and campaign_gate(c) is not None


def test_an_lm_eval_task(tmp_path):
    c = _camp('{ eval = { task = "lm-eval:arith", task_dir = "tasks", threshold = 0.5 } }', tmp_path)
    g = campaign_gate(c)
    assert g.kind == "lm-eval" and g.task == "arith" and g.task_dir == tmp_path / "tasks"


@pytest.mark.parametrize("gate, said", [
    ('{ eval = { path = "q.jsonl" } }', "campaign.gate.eval.threshold"),
    ('{ eval = { path = "q.jsonl", threshold = 1.5 } }', "campaign.gate.eval.threshold"),
    ('{ eval = { path = "q.jsonl", task = "lm-eval:x", threshold = 0.5 } }', "give one of path"),
    ('{ eval = { task = "arith", threshold = 0.5 } }', "write it like \"lm-eval:NAME\""),
    ('{ eval = { path = "q.jsonl", task_dir = "t", threshold = 0.5 } }', "task_dir is for an lm-eval task"),
    ('{ context = 600, niah = { context = 700 } }', "not both (found context beside niah)"),
    ('{ eval = { path = "q.jsonl", threshold = 0.5, shots = 5 } }', "shots"),
])
def test_bad_gate_keys_are_refused(tmp_path, gate, said):
    with pytest.raises(ConfigError) as e:
        _camp(gate, tmp_path)
    assert said in e.value.message, e.value.message


def test_a_bad_question_file_is_refused_before_any_launch(tmp_path):
    (tmp_path / "q.jsonl").write_text('{"prompt": "What is 1 plus 1?", "answer": 2}\n{"prompt": "x", "answer": 1, "match": "near"}\n')
    c = _camp('{ eval = { path = "q.jsonl", threshold = 0.5 } }', tmp_path)
    with pytest.raises(UsageError) as e:
        check_campaign_gate(c, "llamacpp")
    assert e.value.message.startswith(f"{tmp_path / 'c.toml'}: gate.eval: {tmp_path / 'q.jsonl'}:2: 'match' is 'near'")
