"""scripts/demo.sh ends where a user can go on (issue 49, item 2): its closing lines name where `servedeck` is
and the exact command that shows the demo's launch, and that command, pasted into a shell elsewhere with
none of the demo's variables set, shows it. The demo's own scratch folder is played by a folder like it:
models.toml, home/ and results/, one launch of smollm2 started and stopped there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from ports import starter_toml

REPO = Path(__file__).resolve().parents[2]
LINES = REPO / "scripts" / "_demo_lines.sh"
SERVEDECK = str(Path(sys.executable).with_name("servedeck"))


def outside_env(**extra: str) -> dict[str, str]:
    """A new shell's environment: none of the demo's variables."""
    env = {k: v for k, v in os.environ.items() if k not in ("SERVEDECK_HOME", "SERVEDECK_RESULTS", "SERVEDECK_CONFIG")}
    return {**env, **extra}


def demo_bash(script: str, cwd: Path) -> str:
    r = subprocess.run(["bash", "-c", f". {LINES}; t0=0; {script}"], capture_output=True, text=True, timeout=30,
                       cwd=cwd)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_a_steps_heading_written_to_a_log_has_no_escape_codes(tmp_path):
    out = demo_bash('say "servedeck start smollm2"', tmp_path)  # stdout is a pipe, as under `| tee demo.log`
    assert out == "\n== servedeck start smollm2 (0s)\n", repr(out)


@pytest.mark.engine
@pytest.mark.llamacpp
def test_the_closing_line_shows_the_demos_launch_from_anywhere(tmp_path, engines_ready):
    demo = tmp_path / "servedeck-demo"
    demo.mkdir()
    (demo / "models.toml").write_text(starter_toml())
    env = outside_env(SERVEDECK_HOME=str(demo / "home"), SERVEDECK_RESULTS=str(demo / "results"))
    started = subprocess.run([SERVEDECK, "start", "smollm2"], capture_output=True, text=True, timeout=180, cwd=demo,
                             env=env)
    subprocess.run([SERVEDECK, "stop", "smollm2"], capture_output=True, text=True, timeout=180, cwd=demo, env=env)
    assert started.returncode == 0, started.stderr

    closing = demo_bash(f'next_steps "{REPO}" "{demo}"', tmp_path).rstrip("\n").splitlines()
    assert f"servedeck is {REPO}/.venv/bin/servedeck (not on your PATH)" in closing[1]
    assert closing[2].strip() == f"source {REPO}/.venv/bin/activate"
    command = closing[-1].strip()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    page = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=180, cwd=elsewhere,
                          env=outside_env())
    assert page.returncode == 0, page.stderr
    assert "1 launch under servedeck (1 became ready)" in page.stdout, page.stdout[:3000]
    assert "never launched under servedeck" not in page.stdout
