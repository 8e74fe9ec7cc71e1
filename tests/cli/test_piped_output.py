"""Output that survives a pipe (issue 49, item 3): piped or logged, no line is wrapped inside a figure, a path or
a timestamp (rich's 80 columns did: `healthy after 1.61` / `s, answered after ...`), and words in a row that
look like markup (`[builds.llamacpp]`) are shown as written. Each command runs as a user's `| tee log` would
run it: the real `servedeck` script, stdout a pipe, no COLUMNS."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

SERVEDECK = str(Path(sys.executable).with_name("servedeck"))


def piped(cfg_path: Path, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    return subprocess.run([SERVEDECK, "--config", str(cfg_path), *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cfg_path.parent, env=env)


@pytest.mark.engine
@pytest.mark.llamacpp
def test_start_piped_keeps_its_readiness_figures_and_launch_folder_on_one_line(deck_config):
    cfg = deck_config.path
    r = piped(cfg, "start", "smollm2")
    try:
        assert r.returncode == 0, r.stderr
        assert re.search(r"ready on http://\S+ \(pid \d+, llamacpp\): healthy after [\d.]+ s, answered after "
                         r"[\d.]+ s$", r.stdout, re.M), r.stdout
        folder = next(ln for ln in r.stdout.splitlines() if ln.startswith("launch folder: "))
        assert Path(folder.removeprefix("launch folder: ")).is_dir(), r.stdout
    finally:
        piped(cfg, "stop", "smollm2")


def test_doctor_shows_a_build_key_in_brackets_as_written(tmp_path):
    cfg = tmp_path / "models.toml"
    cfg.write_text(f'[builds.llamacpp]\nengine = "llamacpp"\nbinary = "{tmp_path}/nope/llama-server"\n\n'
                   f'[models.m]\nsource = "{tmp_path}/m.gguf"\nbuild = "llamacpp"\nport = 18931\ncontext = 2048\n')
    r = piped(cfg, "doctor", "m", "--no-integrity")
    assert "fix the path in [builds.llamacpp] or install the engine there" in r.stdout, r.stdout


def test_plan_puts_the_start_needs_basis_under_predicted_not_last_measured(deck_config):
    r = piped(deck_config.path, "plan", "smollm2", "--gpu-gib", "80")
    assert r.returncode == 0, r.stderr
    need = next(ln for ln in r.stdout.splitlines() if "a start needs free per GPU" in ln)
    basis = next(ln for ln in r.stdout.splitlines() if "start need basis" in ln)
    cells = [c.strip() for c in need.split("│")]
    assert cells[-2] == "", need  # the "last measured" column: nothing was measured for this row
    assert "planned" in basis or "measured" in basis, basis


def test_doctor_counts_one_weight_file_in_the_singular(deck_config):
    r = piped(deck_config.path, "doctor", "smollm2-vllm", "--no-integrity", "--json")
    rows = json.loads(r.stdout)["rows"]
    [weights] = [row for row in rows if row["check"] == "weights"]
    assert ": 1 weight file, " in weights["saw"], weights  # the starter's HF snapshot: one model.safetensors
