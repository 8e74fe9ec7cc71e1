"""Issue 8 defect 7: `servedeck runs` with a broken models.toml says so, and which results dir it lists;
issue 21: `campaign status` reads the results dir the same way (one helper), so it says so too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SERVEDECK = str(Path(sys.executable).with_name("servedeck"))


def test_runs_with_a_broken_config_says_so(tmp_path):
    (tmp_path / "models.toml").write_text("[models.x\nsource = 1\n")
    r = subprocess.run([SERVEDECK, "runs"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    err = " ".join(r.stderr.split())
    assert "models.toml is broken" in err and "results_dir is not known" in err, err
    assert f"listing runs under {tmp_path / 'results'}" in err, err
    assert "no runs under" in r.stdout


def test_campaign_status_with_a_broken_config_says_so(tmp_path):
    (tmp_path / "models.toml").write_text("[models.x\nsource = 1\n")
    r = subprocess.run([SERVEDECK, "campaign", "status"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    err = " ".join(r.stderr.split())
    assert "models.toml is broken" in err and "results_dir is not known" in err, err
    assert f"listing campaigns under {tmp_path / 'results' / 'campaigns'}" in err, err


def test_runs_without_a_config_is_quiet(tmp_path):
    r = subprocess.run([SERVEDECK, "runs", "--json"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stderr == "" and r.stdout.strip() == "[]"
