"""A mistake on the command line exits 2 whichever command finds it (issue 21, item 4): the deck's,
the door's, the watch loop's and compare's own checks raise UsageError, as typer's usage errors and
models.toml's ConfigError do. Each runs the real CLI and refuses before anything starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SERVEDECK = str(Path(sys.executable).with_name("servedeck"))


@pytest.mark.parametrize("args, message", [
    (["stop"], "name the models to stop, or pass --all"),
    (["unit"], "name a model, or pass --watch"),
    (["serve", "--upstream", "nonsense"], "--upstream 'nonsense': expected NAME=http://HOST:PORT"),
    (["serve", "--upstream", "smollm2=http://127.0.0.1:9"], "--upstream smollm2: a model of that name is in"),
    (["watch", "--interval", "soon"], "--interval: 'soon' is not a duration"),
    (["compare", "a", "b", "--noise", "2"], "--noise 2.0 is not a fraction between 0 and 1"),
])
def test_a_command_line_mistake_exits_2_with_its_message(deck_config, args, message):
    r = subprocess.run([SERVEDECK, "--config", str(deck_config.path), *args], capture_output=True, text=True,
                       timeout=60, cwd=deck_config.path.parent)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert message in r.stderr
    assert "Traceback" not in r.stderr
