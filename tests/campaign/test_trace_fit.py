"""Issue 31, items 20 and 21: a public trace fitted to a smaller server, and the Azure trace's CSV.

Item 20: `--length-scale` scales every input and output length and the blocks with them; each request records the
length the trace asked (`prompt_tokens_expected`) and a prompt that misses it by more than 5 % is warned about.
The traces below are written here in Mooncake's layout (512-token blocks, lengths that end inside a block, prefixes
shared through hash_ids). Item 21: the Azure LLM inference trace's CSV (TIMESTAMP,ContextTokens,GeneratedTokens),
read as a trace. Every CSV here is written by this file in the column layout the Azure trace publishes
(github.com/Azure/AzurePublicDataset: a header, then `2023-11-16 18:15:46.6805900,374,44` a row); no row is copied
from the dataset."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from servedeck.errors import UsageError
from servedeck.fsio import read_jsonl
from servedeck.loadgen.loop import run as run_loop
from servedeck.loadgen.records import RequestRecord
from servedeck.runs import load
from servedeck.workloads.session import Outcome, measured, run
from servedeck.workloads.trace import TraceSpec, fit

# Mooncake's layout: 512-token blocks; line 2 shares line 1's first two blocks, line 3 shares nothing
MOONCAKE = [{"timestamp": 0, "input_length": 1300, "output_length": 40, "hash_ids": [0, 1, 2]},
            {"timestamp": 3000, "input_length": 1324, "output_length": 20, "hash_ids": [0, 1, 3]},
            {"timestamp": 6000, "input_length": 700, "output_length": 20, "hash_ids": [4, 5]}]
AZURE_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens"


def _jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _azure(tmp_path: Path, rows: list[str]) -> Path:
    """A CSV in the Azure LLM inference trace's published layout, written here."""
    path = tmp_path / "azure_llm_inference_trace_layout.csv"
    path.write_text("\n".join([AZURE_HEADER, *rows]) + "\n")
    return path


# --- item 21: the Azure CSV (pure) --------------------------------------------------------------------

def test_an_azure_trace_csv_is_read_as_a_trace_on_its_own_clock(tmp_path):
    # written out of order, as a merge of logs would be: replayed in arrival order, ms from the first request
    path = _azure(tmp_path, ["2023-11-16 18:15:47.9305900,96,6", "2023-11-16 18:15:46.6805900,120,4",
                             "2023-11-16 18:15:50.1805900,64,8"])
    rows = TraceSpec(path=path).check()
    assert [(r.line, r.input_length, r.output_length, r.hash_ids) for r in rows] == \
        [(3, 120, 4, ()), (2, 96, 6, ()), (4, 64, 8, ())]
    assert [r.timestamp_ms for r in rows] == pytest.approx([0.0, 1250.0, 3500.0])
    assert TraceSpec(path=path).to_json()["format"] == "azure-csv"


@pytest.mark.parametrize("row, expect", [
    ("2023-11-16 18:15:46.6805900,many,4", "line 2: ContextTokens 'many' or GeneratedTokens '4' is not a whole number"),
    ("2023-11-16 18:15:46.6805900,120,0", "line 2: GeneratedTokens 0 is not a whole number ≥ 1"),
    ("yesterday,120,4", "line 2: TIMESTAMP 'yesterday' is not a date and time"),
    ("2023-11-16 18:15:46.6805900,120", "line 2 has 2 columns"),
])
def test_a_bad_azure_row_is_refused_naming_the_line_and_the_column(tmp_path, row, expect):
    with pytest.raises(UsageError) as e:
        TraceSpec(path=_azure(tmp_path, [row])).check()
    assert expect in e.value.message


def test_a_file_of_neither_format_names_both(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("when,prompt,answer\n0,12,3\n")
    with pytest.raises(UsageError) as e:
        TraceSpec(path=path).check()
    assert "line 1 is not JSON" in e.value.message and AZURE_HEADER in (e.value.hint or "")


# --- item 20: the length scale and the fit (pure) ---------------------------------------------------------

def test_the_length_scale_scales_inputs_outputs_and_blocks_alike(tmp_path):
    spec = TraceSpec(path=_jsonl(tmp_path / "t.jsonl", MOONCAKE), length_scale=0.1)
    rows = spec.check()
    assert [(r.input_length, r.output_length, r.hash_ids) for r in rows] == \
        [(130, 4, (0, 1, 2)), (132, 2, (0, 1, 3)), (70, 2, (4, 5))]
    assert spec.scaled_block == 51  # 512 × 0.1: each request keeps its blocks, and what it shares
    assert spec.to_json()["length_scale"] == 0.1


@pytest.mark.parametrize("scale, expect", [
    (0.02, "leaves 10-token blocks: below 16"),
    (2.0, "--length-scale must be above 0 and at most 1, got 2"),
    (0.0, "--length-scale must be above 0"),
])
def test_a_length_scale_that_cannot_fit_is_refused(tmp_path, scale, expect):
    with pytest.raises(UsageError) as e:
        TraceSpec(path=_jsonl(tmp_path / "t.jsonl", MOONCAKE), length_scale=scale).check()
    assert expect in e.value.message


def _rec(i: int, got: int, want: int) -> RequestRecord:
    return RequestRecord(id=f"r{i}", kind="measured", t_target=0.0, prompt_tokens=got, prompt_tokens_expected=want)


def test_prompts_that_miss_the_trace_s_length_are_warned_about_with_the_totals():
    # the hand-scaled Mooncake replay: 52,374 prompt tokens sent for the 41,027 the trace asked
    figures, _ = fit([_rec(0, 52374, 41027), _rec(1, 100, 100)])
    assert figures["length_fit"]["missed"] == 1 and figures["length_fit"]["expected_tokens"] == 41127
    [warning] = figures["warnings"]
    assert "1 of 2 prompts missed the trace's length by more than 5%" in warning
    assert "52,474 prompt tokens against the 41,127 the trace asked (+28%)" in warning


def test_prompts_within_a_few_tokens_or_percent_are_not_warned_about():
    figures, _ = fit([_rec(0, 1030, 1000), _rec(1, 22, 19), _rec(2, 500, 500)])
    assert figures["length_fit"]["missed"] == 0 and "warnings" not in figures


# --- on real llama.cpp ---------------------------------------------------------------------------------

def _replay(cfg, spec: TraceSpec) -> dict:
    out = Outcome()
    with measured(cfg, "smollm2", False, out) as target:
        folder = run_loop(run(target, spec, gate_mode=False, outcome=out)).folder
    return {"view": load(folder), "lines": {ln["prompt_index"]: ln for ln in read_jsonl(folder / "requests.jsonl")}}


def _close(got: int, want: int) -> bool:
    return abs(got - want) <= max(0.05 * want, 4)


@pytest.mark.engine
@pytest.mark.llamacpp
def test_a_mooncake_trace_scaled_down_is_sent_at_the_lengths_it_asks(campaign_config, llama, tmp_path):
    # time × 3: line 1 has ended (its slot free to serve line 2's shared blocks) when line 2 is due, however busy
    spec = TraceSpec(path=_jsonl(tmp_path / "mooncake_layout.jsonl", MOONCAKE), length_scale=0.1, time_scale=3.0, seed=3)
    got = _replay(campaign_config, spec)
    lines, point = got["lines"], got["view"]["points"][0]
    assert sorted(lines) == [1, 2, 3] and all(ln["status"] == "ok" for ln in lines.values())
    # every request records the length the trace asked (× 0.1), and the server counted it within 5 %
    assert [lines[n]["prompt_tokens_expected"] for n in (1, 2, 3)] == [130, 132, 70]
    assert all(_close(ln["prompt_tokens"], ln["prompt_tokens_expected"]) for ln in lines.values()), lines
    assert [lines[n]["output_tokens"] for n in (1, 2, 3)] == [4, 2, 2]
    assert point["figures"]["length_fit"]["missed"] == 0 and not any("missed the trace" in w
                                                                     for w in point["figures"]["warnings"])
    # line 2 shares line 1's two 51-token blocks (the template's opening in the first): they come from the cache,
    # but for the template's closing tokens that end line 1's prompt
    assert lines[1]["t_end"] < lines[2]["t_send"]
    assert lines[2]["cached_tokens"] >= 2 * 51 - 8, (lines[1]["cached_tokens"], lines[2]["cached_tokens"])
    assert got["view"]["workload"]["length_scale"] == 0.1


@pytest.mark.engine
@pytest.mark.llamacpp
def test_a_trace_scaled_by_hand_with_small_blocks_gets_prompts_of_its_lengths(campaign_config, llama, tmp_path):
    # the issue's workaround, by hand: lengths × 0.1 in the file and --block-tokens 51. The blocks' unique tags
    # (hex digits, dense in tokens) made such prompts far longer than the trace asked; each block is now sized
    # with the server's tokenizer, tag included
    rows = [{**r, "input_length": round(r["input_length"] / 10), "output_length": 2} for r in MOONCAKE]
    got = _replay(campaign_config, TraceSpec(path=_jsonl(tmp_path / "by_hand.jsonl", rows), block_tokens=51, seed=4))
    lines = got["lines"]
    assert all(_close(ln["prompt_tokens"], ln["prompt_tokens_expected"]) for ln in lines.values()), \
        {n: (ln["prompt_tokens"], ln["prompt_tokens_expected"]) for n, ln in lines.items()}


@pytest.mark.engine
@pytest.mark.llamacpp
def test_servedeck_bench_replays_an_azure_trace_csv(campaign_config, llama, tmp_path):
    path = _azure(tmp_path, ["2023-11-16 18:15:46.6805900,120,4", "2023-11-16 18:15:47.1805900,200,6",
                             "2023-11-16 18:15:47.6805900,90,3"])
    r = subprocess.run([sys.executable, "-m", "servedeck", "--config", str(campaign_config.path), "bench", "smollm2",
                        "--workload", "trace", "--trace", str(path), "--no-gate", "--json"],
                       capture_output=True, text=True, timeout=600, env=dict(os.environ))
    assert r.returncode == 0, r.stderr[-3000:]
    view = json.loads(r.stdout)
    assert view["workload"]["format"] == "azure-csv" and view["workload"]["requests"] == 3
    recs = read_jsonl(Path(view["path"]) / "requests.jsonl")
    assert sorted(ln["prompt_index"] for ln in recs) == [2, 3, 4] and all(ln["status"] == "ok" for ln in recs)
    assert all(_close(ln["prompt_tokens"], ln["prompt_tokens_expected"]) for ln in recs), recs
    assert sorted(ln["output_tokens"] for ln in recs) == [3, 4, 6]
    md = (Path(view["path"]) / "summary.md").read_text()
    assert "the Azure LLM inference trace's CSV, 3 requests" in md and "None" not in md.split("## Workload")[1][:400]
