"""Issue 31, item 22: a run that stands on its launch's earlier gate (a `--no-gate` run cites it) says "cited from
RUN" wherever it is listed, and a trace run's summary describes the trace, not the input and output tokens a load
point has. Pure: views as runs/read.py rebuilds them."""

from __future__ import annotations

from servedeck.report.render import banner, gate_cell, list_row, markdown

GATE_RUN = "smollm2__1x__8k__llamacpp__1203-101500"
PASSED = {"status": "passed", "kind": "niah", "result": {"score": 1.0, "found": 3, "probes": 3, "threshold": 0.67}}


def _view(gate: dict, workload: dict | None = None) -> dict:
    return {"run": "smollm2__1x__8k__llamacpp__1203-101700", "kind": "bench", "status": "ok", "gate": gate,
            "workload": workload or {"workload": "chat", "points": ["c=1"], "input_tokens": 64, "output_tokens": 8},
            "points": []}


def test_a_run_citing_its_launch_s_gate_is_listed_as_cited_from_that_run():
    view = _view({**PASSED, "source": GATE_RUN, "note": "gate run earlier on this same launch of the server"})
    assert gate_cell(view) == f"passed 1.0 (3/3), cited from {GATE_RUN}"
    assert list_row(view)["gate"] == f"passed 1.0 (3/3), cited from {GATE_RUN}"
    assert f"cited from {GATE_RUN}" in banner(view)


def test_a_run_that_ran_its_own_gate_says_nothing_of_citing():
    view = _view({**PASSED, "source": "this run"})
    assert gate_cell(view) == "passed 1.0 (3/3)" and "cited" not in banner(view)


def test_a_cited_accuracy_gate_names_its_run_too():
    gate = {"status": "passed", "needle": "not run",
            "accuracy": {"eval": {"kind": "exact", "status": "passed", "source": GATE_RUN,
                                  "result": {"score": 0.9, "correct": 9, "samples": 10, "errors": 0, "threshold": 0.8}}}}
    assert gate_cell(_view(gate)).endswith(f", cited from {GATE_RUN}")


def test_a_trace_run_s_summary_describes_the_trace():
    workload = {"workload": "trace", "points": ["trace t.jsonl"], "trace": "/x/t.jsonl", "format": "jsonl",
                "time_scale": 1.0, "window_s": None, "block_tokens": 512, "length_scale": 0.1, "content": "prose",
                "requests": 6, "warmup": 0, "api": "chat", "ignore_eos": True}
    md = markdown({**_view({**PASSED, "source": "this run"}, workload), "points": []})
    line = md.split("## Workload\n\n")[1].splitlines()[0]
    assert "None" not in line and "input" not in line, line
    assert "/x/t.jsonl (Mooncake's JSONL, 6 requests)" in line and "× 0.1" in line
