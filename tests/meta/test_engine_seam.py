"""The engine seam (docs/engines.md): outside servedeck.engines no code asks which engine it is by name.

An engine fact (what its server returns, which flag means what) lives on its adapter, so a fork registered
under its own name inherits it. Issue 31 item 15: gates/lmeval.py compared `engine == "llamacpp"`, and a
llama.cpp fork got vLLM's reason. Any comparison of a value with a built-in engine's name is refused here.
"""

from __future__ import annotations

import re
from pathlib import Path

SRC = Path(__file__).parents[2] / "src" / "servedeck"
NAMES = "llamacpp|vllm|sglang"
COMPARED = re.compile(rf"""[=!]=\s*["']({NAMES})["']|["']({NAMES})["']\s*[=!]=|\bin\s*[(\[{{]\s*["']({NAMES})["']""")


def test_no_engine_name_is_compared_outside_the_adapters():
    found = []
    for f in sorted(SRC.rglob("*.py")):
        if (SRC / "engines") in f.parents:
            continue
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if COMPARED.search(line):
                found.append(f"{f.relative_to(SRC)}:{n}: {line.strip()}")
    assert not found, "ask the adapter (servedeck.engines) instead:\n" + "\n".join(found)


def test_the_rule_sees_the_comparison_it_is_for():
    assert COMPARED.search('if engine == "llamacpp" else')
    assert COMPARED.search("if name in ('vllm', 'sglang'):")
    assert not COMPARED.search('engine="llamacpp"')  # naming a default is no comparison
