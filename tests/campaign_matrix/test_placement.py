"""What a placement must do, and no more: run a cell somewhere, reporting on the CellNews it is handed, and
stop running cells (runner.Placement). The runner records the rest. The placement here runs no engine: it
is the contract under test (what the runner writes from what a placement reports), not a measurement.
Before issue 21's item 1 a placement had nine methods to write (check, bind, prepare, start_now,
begin_fields, run, settle, stop, lanes) and this one failed on the first it lacked."""

from __future__ import annotations

import json

import pytest

from servedeck.campaign import cells as C
from servedeck.campaign.file import parse
from servedeck.campaign.runner import Placement, RunOptions, Runner
from servedeck.cluster.node import NodeNews
from servedeck.config.load import parse as parse_models
from servedeck.init import render_starter

CAMPAIGN = """
[campaign]
name = "placed"
model = "smol"
cell_timeout = "10m"

[[variants]]
name = "p1"
args = { parallel = 1 }

[[variants]]
name = "p2"
args = { parallel = 2 }

[[workloads]]
kind = "chat"
concurrency = [1]
"""


class Elsewhere(Placement):
    """A placement with only the two methods a placement must have."""

    resume_hint = "servedeck campaign run FILE --elsewhere --resume"

    def run(self, cell: C.Cell, news) -> C.Ending:
        news.placed(cell.id, node=f"box-{cell.variant}")
        news.run_made(cell.id, f"run-of-{cell.variant}")
        if cell.variant == "p2":
            return C.Ending(C.CellState.FAILED, "p2 did not come up there")
        return C.Ending(C.CellState.DONE)

    def stop(self, cells: list[C.Cell]) -> None:
        pass


@pytest.fixture
def recorded(tmp_path, monkeypatch):
    monkeypatch.setenv("SERVEDECK_RESULTS", str(tmp_path / "results"))
    cfg_path = tmp_path / "models.toml"
    cfg_path.write_text(render_starter())
    cfg = parse_models(cfg_path.read_text(), cfg_path)
    camp = parse(CAMPAIGN.replace('"smol"', f'"{next(iter(cfg.models))}"'), tmp_path / "camp.toml")
    folder = Runner(cfg, camp, RunOptions(), place=Elsewhere()).run()
    doc = json.loads((folder.path / "campaign.json").read_text())
    return {c["variant"]: c for c in doc["cells"]}


def test_a_placement_with_only_run_and_stop_runs_every_cell(recorded):
    assert sorted(recorded) == ["p1", "p2"]


def test_the_runner_records_the_ending_the_placement_returned(recorded):
    assert (recorded["p1"]["state"], recorded["p2"]["state"]) == ("done", "failed")


def test_the_runner_records_the_reason_of_a_failed_cell(recorded):
    assert recorded["p2"]["reason"] == "p2 did not come up there"


def test_the_run_folders_reported_through_cell_news_are_listed(recorded):
    assert recorded["p1"]["runs"] == ["run-of-p1"]


def test_where_the_placement_said_the_cell_ran_is_recorded(recorded):
    assert recorded["p2"]["node"] == "box-p2"


def test_a_node_lists_a_run_folder_once_however_often_it_is_reported():
    news = NodeNews()
    news.run_made("p1#1", "r1")
    news.run_made("p1#1", "r1")
    assert news.runs() == ["r1"]


def test_a_node_sends_each_phase_once():
    news = NodeNews()
    news.phase("p1#1", "gate")
    first = news.drain()
    assert (first[0], news.drain()[0]) == ([("phase", "gate")], [])
