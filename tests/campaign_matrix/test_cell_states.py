"""A campaign cell's states and the moves between them (cells.CellState, cells.MOVES), and the campaign
folder as their one writer: pure, no process started."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from servedeck.campaign.cells import CellMoveError, CellState, cell_list, derive, moved
from servedeck.campaign.file import parse
from servedeck.campaign.folder import CampaignFolder, newest_unfinished
from servedeck.config.load import parse as parse_models
from servedeck.init import render_starter
from servedeck.runs.folder import RunFolder

CAMPAIGN = """
[campaign]
name = "states"
model = "smol"
cell_timeout = "10m"

[[variants]]
name = "p1"
args = { parallel = 1 }

[[workloads]]
kind = "chat"
concurrency = [1]
"""


@pytest.mark.parametrize("old,new", [
    ("pending", "running"), ("pending", "skipped"), ("skipped", "running"),
    ("running", "done"), ("running", "failed"), ("running", "timed-out"), ("running", "pending"),
    ("running", "running"),  # found running by a later run (its servedeck is gone), or a node-loss retry
    ("failed", "running"), ("timed-out", "running"),  # --retry-failed
])
def test_a_cell_makes_these_moves(old, new):
    assert moved(old, new) is CellState(new)


@pytest.mark.parametrize("old,new", [
    ("pending", "done"), ("pending", "failed"), ("pending", "pending"), ("skipped", "done"),
    ("done", "running"), ("done", "pending"), ("done", "failed"), ("failed", "done"), ("timed-out", "pending"),
])
def test_a_cell_refuses_these_moves_naming_both_ends(old, new):
    with pytest.raises(CellMoveError, match=f"{old} → {new}"):
        moved(old, new)


def test_a_state_that_is_no_cell_state_is_refused():
    with pytest.raises(CellMoveError, match="'finished'"):
        moved("running", "finished")


def test_the_values_on_disk_are_the_strings_campaign_json_always_held():
    assert [s.value for s in CellState] == ["pending", "running", "done", "failed", "timed-out", "skipped"]
    assert {s.value for s in CellState if s.finished} == {"done", "failed", "timed-out"}


def _folder(tmp_path: Path) -> tuple[CampaignFolder, str]:
    cfg_path = tmp_path / "models.toml"
    cfg_path.write_text(render_starter())
    cfg = parse_models(cfg_path.read_text(), cfg_path)
    camp = parse(CAMPAIGN.replace('"smol"', f'"{next(iter(cfg.models))}"'), tmp_path / "camp.toml")
    derived = derive(cfg, camp)
    cells = cell_list(camp, derived)
    return CampaignFolder.create(tmp_path / "campaigns", camp, cells, derived.base), cells[0].id


def test_the_campaign_folder_moves_a_cell_and_writes_the_plain_string(tmp_path):
    folder, cid = _folder(tmp_path)
    folder.move_cell(cid, CellState.RUNNING, reason=None)
    on_disk = json.loads((folder.path / "campaign.json").read_text())
    assert on_disk["cells"][0]["state"] == "running"


def test_the_campaign_folder_refuses_a_move_and_leaves_the_record_as_it_was(tmp_path):
    folder, cid = _folder(tmp_path)
    with pytest.raises(CellMoveError):
        folder.move_cell(cid, CellState.DONE, reason="never ran")
    assert folder.cell(cid)["state"] == "pending" and folder.cell(cid)["reason"] is None


def test_set_cell_does_not_change_a_state(tmp_path):
    folder, cid = _folder(tmp_path)
    with pytest.raises(ValueError, match="move_cell"):
        folder.set_cell(cid, state="done")


def test_an_old_folder_with_string_states_still_reads_for_resume(tmp_path):
    folder, cid = _folder(tmp_path)
    doc = json.loads((folder.path / "campaign.json").read_text())
    doc["cells"][0]["state"] = "running"  # as a servedeck killed mid-cell left it
    (folder.path / "campaign.json").write_text(json.dumps(doc))
    camp = parse((folder.path / "campaign.toml").read_text(), Path(doc["file"]))
    assert newest_unfinished(tmp_path / "campaigns", camp) == folder.path
    assert CampaignFolder.open(folder.path).state(cid) is CellState.RUNNING


def test_a_run_folder_left_running_by_a_lost_writer_is_closed_through_run_folder(tmp_path):
    made = RunFolder.create(tmp_path, "m", "p1", 1024, "llamacpp", {"kind": "bench"})
    again = RunFolder.open(made.path)
    again.finish("failed", "node lost")
    summary = json.loads((made.path / "summary.json").read_text())
    assert (summary["status"], summary["reason"]) == ("failed", "node lost")
    assert summary["kind"] == "bench" and summary["finished_at"]


def test_a_folder_without_a_summary_opens_as_none(tmp_path):
    assert RunFolder.open(tmp_path) is None
