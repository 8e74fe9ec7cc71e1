"""Questions the gate tests make themselves, from a seed: arithmetic with one exact answer each."""

from __future__ import annotations

import json
import random
from pathlib import Path


def arithmetic(seed: int, n: int) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        a, b = rng.randint(1, 20), rng.randint(1, 20)
        op = rng.choice("+-*")
        value = a + b if op == "+" else a - b if op == "-" else a * b
        word = {"+": "plus", "-": "minus", "*": "times"}[op]
        out.append({"id": f"q{i}", "prompt": f"What is {a} {word} {b}? Answer with the number only.",
                    "answer": value, "match": "number"})
    return out


def write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


TASK_YAML = """task: {name}
dataset_path: json
dataset_kwargs:
  data_files:
    test: {data}
test_split: test
output_type: {output_type}
doc_to_text: "{{{{question}}}}"
doc_to_target: "{{{{answer}}}}"
generation_kwargs:
  until: ["\\n\\n"]
  max_gen_toks: 32
  do_sample: false
  temperature: 0
filter_list:
  - name: last-number
    filter:
      - function: regex
        regex_pattern: "(-?[0-9]+)(?!.*[0-9])"
        group_select: -1
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
metadata:
  version: 1.0
"""


def lm_eval_task(folder: Path, name: str, rows: list[dict], output_type: str = "generate_until") -> Path:
    """A task folder for lm-eval: the questions as local JSON lines and a YAML naming them (no hub)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.jsonl").write_text("".join(json.dumps({"question": r["prompt"], "answer": str(r["answer"])})
                                                  + "\n" for r in rows))
    (folder / f"{name}.yaml").write_text(TASK_YAML.format(name=name, data=f"{name}.jsonl", output_type=output_type))
    return folder


MARGIN = 0.1  # a second greedy run on one server may move a question or two; 0.1 of 20 is two


def thresholds_around(score: float, what: str, margin: float = MARGIN) -> tuple[float, float]:
    """The thresholds a gate must pass (just below `score`) and fail (just above), from the measured
    score alone. A score within `margin` of 0 or 1 cannot be bracketed: that fails, naming the score,
    rather than testing a gate at 0 (always passes) or above 1 (never can)."""
    assert margin < score < 1 - margin, (
        f"{what} scored {score:.3f}: the questions must be partly right (between {margin} and {1 - margin}) "
        "to gate just below and just above the score; choose another seed or more questions")
    return round(score - margin, 3), round(score + margin, 3)
