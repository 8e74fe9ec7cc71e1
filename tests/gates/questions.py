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
