"""Run folders read back from their files alone (no engine): labels, banners, stale runs, finding runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from servedeck.errors import RunError
from servedeck.fsio import append_jsonl
from servedeck.loadgen.records import RequestRecord
from servedeck.report import list_row, markdown
from servedeck.runs import find_run, list_runs, load


def _record(i: int, kind: str = "measured") -> dict:
    r = RequestRecord(id=f"r{i}", kind=kind, t_target=i * 1.0, t_send=i * 1.0 + 0.001, t_first_byte=i + 0.01,
                      t_first_token=i + 0.2, chunk_t=[i + 0.2, i + 0.25, i + 0.3], chunk_n=[1, 1, 1], t_end=i + 0.3,
                      prompt_tokens=1100, output_tokens=3, cached_tokens=0, streamed_tokens=3, status="ok",
                      finish_reason="length")
    return {"point": 0, **r.to_json()}


def _folder(root: Path, name: str, *, status: str = "ok", gate_lines: list[str] | None = None,
            pid: int | None = None, kind: str = "bench") -> Path:
    d = root / name
    d.mkdir(parents=True)
    summary = {"schema": 1, "run": name, "kind": kind, "status": status, "reason": None, "pid": pid,
               "model": "m", "engine": "llamacpp", "layout": "tp1", "context": 4096,
               "workload": {"workload": "chat", "points": ["c=1"], "input_tokens": 1100, "output_tokens": 3,
                            "requests": 3, "warmup": 0},
               "gate": {"status": "pending"},
               "points": [{"index": 0, "label": "c=1", "status": "ok", "load": {"client_cpu_s": 0.01, "wall_s": 3.0},
                           "counters": {"available": True, "queried_tokens": 3300, "hit_tokens": 0, "fraction": 0.0}}]}
    (d / "summary.json").write_text(json.dumps(summary))
    for i in range(3):
        append_jsonl(d / "requests.jsonl", _record(i))
    if gate_lines is not None:
        (d / "niah.log").write_text("\n".join(gate_lines) + "\n")
    return d


def _probe(depth: float, ok: bool) -> str:
    return json.dumps({"key": 0, "depth": depth, "prompt_tokens": 4060, "ok": ok, "latency_s": 2.0,
                       "answer": "1234567" if ok else "no idea", "cached_tokens": 0, "code": "1234567"})


def test_a_failed_gate_marks_the_result_everywhere(tmp_path):
    d = _folder(tmp_path, "m__tp1__4k__llamacpp__0101-000000",
                gate_lines=[_probe(0.1, True), _probe(0.5, False), _probe(0.9, False), "GATE niah score= 0.33"])
    view = load(d)
    assert view["gate"]["status"] == "failed" and view["gate"]["result"]["found"] == 1
    assert view["label"] == "ok; gate failed: not a result"
    md = markdown(view)
    assert md.splitlines()[2].startswith("**NOT A RESULT: the server failed its correctness gate** (score 0.33 < 0.67)")
    assert "## Figures (failed 0.33 (1/3): not a result)" in md
    row = list_row(view)
    assert row["gate"] == "failed 0.33 (1/3)" and row["label"].endswith("not a result")


def test_two_of_three_passes_the_seeds_threshold(tmp_path):
    d = _folder(tmp_path, "m__tp1__4k__llamacpp__0101-000001",
                gate_lines=[_probe(0.1, True), _probe(0.5, True), _probe(0.9, False), "GATE niah score= 0.67"])
    assert load(d)["gate"]["status"] == "passed"


def test_no_gate_and_an_unfinished_gate_are_not_results(tmp_path):
    none = load(_folder(tmp_path, "m__tp1__4k__llamacpp__0101-000002"))
    assert none["gate"]["status"] == "not run" and none["label"] == "ok; no gate: not a result"
    assert "NOT A RESULT: no correctness gate" in markdown(none)
    cut = load(_folder(tmp_path, "m__tp1__4k__llamacpp__0101-000003", gate_lines=[_probe(0.1, True)]))
    assert cut["gate"]["status"] == "incomplete" and "not a result" in cut["label"]


def test_a_run_whose_writer_died_reads_as_failed_with_its_records(tmp_path):
    # a pid that cannot be alive: the writer is gone, summary.json still says running
    d = _folder(tmp_path, "m__tp1__4k__llamacpp__0101-000004", status="running", pid=2**22 + 12345)
    view = load(d)
    assert view["status"] == "failed" and "stopped before finishing" in view["reason"]
    assert view["points"][0]["figures"]["counts"]["ok"] == 3
    alive = load(_folder(tmp_path, "m__tp1__4k__llamacpp__0101-000005", status="running", pid=os.getpid()))
    assert alive["status"] == "running"


def test_figures_are_recomputed_from_requests_jsonl(tmp_path):
    d = _folder(tmp_path, "m__tp1__4k__llamacpp__0101-000006")
    f = load(d)["points"][0]["figures"]
    assert f["counts"]["ok"] == 3 and f["ttft_ms"]["p50"] == pytest.approx(199.0, abs=0.01)
    assert f["tpot_ms"]["p50"] == pytest.approx(50.0, abs=0.01)
    assert f["cached_fraction"] == 0.0 and f["cached_fraction_source"] == "engine counters"
    (d / "summary.json").unlink()  # even without its summary a folder still shows what it measured
    bare = load(d)
    assert bare["status"] == "failed" and bare["requests"]["measured"] == 3 and bare["model"] == "m"


def test_find_run_by_fragment_last_and_ambiguity(tmp_path):
    a = _folder(tmp_path, "a__tp1__4k__llamacpp__0101-000007")
    b = _folder(tmp_path, "b__tp1__4k__llamacpp__0101-000008")
    assert list_runs(tmp_path) == [a, b]
    assert find_run(tmp_path, "last") == b and find_run(tmp_path, "a__") == a and find_run(tmp_path, str(a)) == a
    with pytest.raises(RunError) as e:
        find_run(tmp_path, "__tp1__")
    assert "matches 2 runs" in e.value.message
    with pytest.raises(RunError) as e:
        find_run(tmp_path, "zzz")
    assert "servedeck runs" in e.value.hint
    with pytest.raises(RunError):
        find_run(tmp_path / "empty", "last")
