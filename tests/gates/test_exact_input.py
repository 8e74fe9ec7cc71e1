"""Bad input to the exact-answer gate is refused before any launch, naming the file, line and what was
expected; the match rules score replies as docs/gates.md says. No engine needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from servedeck.errors import UsageError
from servedeck.gates.exact import ExactGate, is_correct, load_questions
from servedeck.gates.kinds import accuracy_gate


def _file(tmp_path, *lines: str):
    p = tmp_path / "q.jsonl"
    p.write_text("".join(x + "\n" for x in lines))
    return p


def _launches() -> set:
    """Every launch folder under this test's home (the shared servers' are there too)."""
    from pathlib import Path
    return {str(p) for p in (Path(os.environ["SERVEDECK_HOME"]) / "launches").glob("*/*")}


GOOD = json.dumps({"prompt": "What is 3 plus 4?", "answer": 7, "match": "number"})


@pytest.mark.parametrize("bad, said", [
    ('{"prompt": "hi", "answer": "x"', ":2: not JSON"),
    ('{"answer": "7"}', ":2: expected exactly one of 'prompt' (a string) or 'messages'"),
    ('{"prompt": "hi"}', ":2: expected 'answer': a string or a number"),
    ('{"prompt": "hi", "answer": "7", "match": "fuzzy"}', ":2: 'match' is 'fuzzy'; expected one of exact, number, regex, choice"),
    ('{"prompt": "hi", "answer": "seven", "match": "number"}', ":2: match 'number' needs a numeric answer"),
    ('{"prompt": "hi", "answer": "(", "match": "regex"}', ":2: answer '(' is not a regular expression"),
    ('{"prompt": "hi", "answer": "AB", "match": "choice"}', ":2: match 'choice' needs one capital letter"),
    ('{"prompt": "hi", "answer": "7", "hint": "x"}', ":2: unknown key(s) hint"),
    ('{"messages": [{"role": "user"}], "answer": "7"}', ":2: 'messages' must be a non-empty list"),
    ('[1, 2]', ":2: expected a JSON object, got list"),
])
def test_a_bad_line_is_refused_naming_file_and_line(tmp_path, bad, said):
    p = _file(tmp_path, GOOD, bad)
    with pytest.raises(UsageError) as e:
        load_questions(p)
    assert e.value.message.startswith(str(p) + said), e.value.message


def test_a_bad_line_past_the_limit_is_still_refused(tmp_path):
    p = _file(tmp_path, GOOD, GOOD.replace("What", "Who"), "nonsense")
    with pytest.raises(UsageError) as e:
        ExactGate(path=p, threshold=0.5, limit=1).check()
    assert ":3: not JSON" in e.value.message


def test_a_repeated_id_is_refused(tmp_path):
    p = _file(tmp_path, json.dumps({"id": "a", "prompt": "x", "answer": 1}), json.dumps({"id": "a", "prompt": "y", "answer": 2}))
    with pytest.raises(UsageError) as e:
        load_questions(p)
    assert ":2: id 'a' is already used on line 1" in e.value.message


def test_a_missing_file_is_refused(tmp_path):
    with pytest.raises(UsageError) as e:
        load_questions(tmp_path / "nope.jsonl")
    assert "nope.jsonl: no such question file" in e.value.message


@pytest.mark.parametrize("threshold", [1.5, -0.1])
def test_a_threshold_outside_0_1_is_refused(tmp_path, threshold):
    with pytest.raises(UsageError) as e:
        ExactGate(path=_file(tmp_path, GOOD), threshold=threshold).check()
    assert f"--threshold must be a share between 0 and 1, got {threshold}" in e.value.message


def test_an_accuracy_gate_needs_a_threshold(tmp_path):
    with pytest.raises(UsageError) as e:
        accuracy_gate(str(_file(tmp_path, GOOD)), None)
    assert "needs a threshold" in e.value.message


def test_the_limit_keeps_the_first_questions(tmp_path):
    p = _file(tmp_path, *(json.dumps({"prompt": f"q{i}", "answer": i}) for i in range(5)))
    assert [q.id for q in ExactGate(path=p, threshold=0.5, limit=2).check()] == ["line-1", "line-2"]


@pytest.mark.parametrize("rule, expected, reply, right", [
    ("number", "7", "3 + 4 = 7", True),
    ("number", "7", "7 is wrong, it is 8", False),  # the last number counts
    ("number", "1200", "The answer is 1,200.", True),
    ("number", "-4", "13 - 17 = -4", True),
    ("number", "12", "no idea", False),
    ("exact", "Paris", " paris. ", True),
    ("exact", "Paris", "Paris, France", False),
    ("regex", r"\bblue\b", "The sky is blue today", True),
    ("regex", r"\bblue\b", "bluest", False),
    ("choice", "B", "B) the second one", True),
    ("choice", "B", "Answer: C", False),
    ("choice", "B", "I think (B)", True),
])
def test_match_rules(rule, expected, reply, right):
    assert is_correct(rule, expected, reply) is right


def test_cli_refuses_a_bad_file_before_any_launch(tmp_path, deck_config):
    before = _launches()
    p = _file(tmp_path, GOOD, '{"prompt": "x"}')
    r = subprocess.run([sys.executable, "-m", "servedeck", "--config", str(deck_config.path), "gate", "smollm2",
                        "--eval", str(p), "--threshold", "0.5", "--launch"],
                       capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert r.returncode == 2, r.stdout + r.stderr
    assert f"{p}:2: expected 'answer'" in r.stderr
    assert _launches() == before, "a launch was attempted"


def test_cli_refuses_eval_options_without_eval(deck_config):
    r = subprocess.run([sys.executable, "-m", "servedeck", "--config", str(deck_config.path), "gate", "smollm2",
                        "--limit", "5"], capture_output=True, text=True, timeout=120, env=dict(os.environ))
    assert r.returncode == 2 and "--limit: only with --eval" in r.stderr, r.stdout + r.stderr
