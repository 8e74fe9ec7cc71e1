"""campaign.reference_run, pure (no engine): a launch's output check held against a run folder's the moment it is
answered, and the cell ended there when the answers differ. The tune names the starter's run so (tests/tune/
test_tune_vllm.py shows it on a real vLLM); here the decision alone, on two outputs.jsonl written by hand."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from servedeck.campaign import cells as C
from servedeck.campaign.file import parse
from servedeck.campaign.steps import CellSteps, _Listed
from servedeck.errors import ConfigError

TEXT = """
[campaign]
name = "refrun"
model = "smollm2"
reference = "a"
reference_run = "{ref}"

[[variants]]
name = "a"

[[variants]]
name = "b"
outputs_may_differ = {may}

[slo.chat]
ttft_p90 = "2s"

[[workloads]]
kind = "capacity"
find = "max-concurrency"
slo = ["chat"]
max = 4
"""


def _outputs(folder: Path, ids: list[list[int]]) -> Path:
    folder.mkdir(parents=True)
    (folder / "outputs.jsonl").write_text("".join(
        json.dumps({"index": i, "content": "c", "prompt_sha": f"p{i}", "token_ids": t}) + "\n" for i, t in enumerate(ids)))
    return folder


def _decide(tmp_path: Path, mine: list[list[int]], *, may: bool = False, ref: str = "REF", variant: str = "b"):
    camp = parse(TEXT.format(ref=ref, may=str(may).lower()), tmp_path / "c.toml")
    _outputs(tmp_path / "runs" / "REF", [[1, 2, 3], [4, 5, 6]])
    run = _outputs(tmp_path / "runs" / "mine", mine)
    notes: list[str] = []
    steps = SimpleNamespace(camp=camp, runs_root=tmp_path / "runs")  # the two fields and one method it reads
    steps._titles_from = lambda k: CellSteps._titles_from(steps, k)  # type: ignore[arg-type]
    news = SimpleNamespace(note=notes.append)
    made = _Listed(lambda name: None)  # what the cell's steps hold of the first workload's run
    made.folder = run
    cell = SimpleNamespace(id=f"{variant}#1", variant=variant)
    return CellSteps._unlike_reference_run(steps, cell, news, [made]), notes  # type: ignore[arg-type]


def test_answers_that_differ_end_the_cell_before_the_capacity_search(tmp_path):
    ending, _ = _decide(tmp_path, [[1, 2, 3], [4, 9, 6]])
    assert ending is not None and ending.state == C.CellState.FAILED
    assert "greedy outputs differ from REF's (campaign.reference_run): 1/2 prompts identical" in ending.reason
    assert "the first difference at prompt 1, token 1" in ending.reason
    assert "never started: capacity" in ending.reason
    assert ending.fields == {"not_started": ["capacity"], "stopped_by": "reference_run"}


def test_the_same_answers_go_on(tmp_path):
    assert _decide(tmp_path, [[1, 2, 3], [4, 5, 6]])[0] is None


def test_a_variant_whose_outputs_may_differ_goes_on(tmp_path):
    assert _decide(tmp_path, [[7], [8]], may=True)[0] is None


def test_a_reference_run_given_by_path_is_read_there(tmp_path):
    ending, _ = _decide(tmp_path, [[7], [8]], ref=str(tmp_path / "runs" / "REF"))
    assert ending is not None and "0/2 prompts identical" in ending.reason


def test_a_reference_this_host_cannot_read_is_said_and_the_cell_goes_on(tmp_path):
    ending, notes = _decide(tmp_path, [[7], [8]], ref="elsewhere")
    assert ending is None
    assert len(notes) == 1 and notes[0].startswith("b#1: its output check was not held against elsewhere here")


def test_reference_run_needs_a_reference_variant(tmp_path):
    text = TEXT.format(ref="REF", may="false").replace('reference = "a"\n', "")
    with pytest.raises(ConfigError) as e:
        parse(text, tmp_path / "c.toml")
    assert "campaign: " in e.value.message and "reference_run needs reference" in e.value.message
