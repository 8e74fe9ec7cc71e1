"""`report NAME` and `campaign status NAME` read the same campaign folder (issue 21, item 4): one lookup,
`campaign.folder.find_campaign`. Each case is a results tree where report's own rules used to pick
another folder than status (or none): the same campaign run twice, and an older campaign written last."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from servedeck.campaign.cells import cell_list, derive
from servedeck.campaign.file import parse
from servedeck.campaign.folder import CampaignFolder
from servedeck.init import render_starter
from servedeck.modelsfile import load

SERVEDECK = str(Path(sys.executable).with_name("servedeck"))

CAMPAIGN = """
[campaign]
name = "sweep"
model = "{model}"

[[variants]]
name = "p1"
args = {{ parallel = 1 }}

[[workloads]]
kind = "chat"
concurrency = [1]
"""


@pytest.fixture
def results(tmp_path) -> Path:
    """models.toml the starter; results under tmp_path/results ($SERVEDECK_RESULTS for the commands)."""
    (tmp_path / "models.toml").write_text(render_starter())
    return tmp_path / "results"


def _made(tmp_path: Path, stamp: str) -> Path:
    """A campaign folder `sweep__<stamp>`, as `campaign run` creates it (its cells pending, no runs yet)."""
    cfg = load(tmp_path / "models.toml")
    camp = parse(CAMPAIGN.format(model=next(iter(cfg.models))), tmp_path / "sweep.toml")
    derived = derive(cfg, camp)
    folder = CampaignFolder.create(tmp_path / "results" / "campaigns", camp, cell_list(camp, derived), derived.base)
    return folder.path.rename(folder.path.with_name(f"sweep__{stamp}"))


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("SERVEDECK_RESULTS", "SERVEDECK_CONFIG")}
    env["SERVEDECK_RESULTS"] = str(tmp_path / "results")
    return subprocess.run([SERVEDECK, *args], cwd=tmp_path, capture_output=True, text=True, timeout=120, env=env)


def _status_folder(tmp_path: Path, *ref: str) -> Path:
    r = _cli(tmp_path, "campaign", "status", *ref, "--json")
    assert r.returncode in (0, 1), r.stderr
    return Path(json.loads(r.stdout)["folder"])


def _report_folder(tmp_path: Path, *ref: str) -> Path:
    r = _cli(tmp_path, "report", *ref, "--json")
    assert r.returncode == 0, r.stderr
    return Path(json.loads(r.stdout)["report_md"]).parent  # a campaign's report is written into its folder


def test_a_campaign_run_twice_is_its_newest_folder_for_report_as_for_status(results, tmp_path):
    _made(tmp_path, "1201-100000")
    newer = _made(tmp_path, "1201-110000")
    assert _status_folder(tmp_path, "sweep") == newer
    assert _report_folder(tmp_path, "sweep") == newer


def test_without_a_name_both_take_the_newest_by_its_stamp_not_the_last_written(results, tmp_path):
    older = _made(tmp_path, "1201-100000")
    newer = _made(tmp_path, "1201-110000")
    # what a `campaign run --resume` of the older campaign leaves: its folder written last
    now = time.time()
    os.utime(newer, (now - 3600, now - 3600))
    os.utime(older, (now, now))
    assert _status_folder(tmp_path) == newer
    assert _report_folder(tmp_path) == newer
