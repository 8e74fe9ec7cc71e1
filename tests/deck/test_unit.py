"""Issue 31 item 10: `servedeck unit MODEL` writes the unit as seed 004 writes its own: `Restart=always` when
models.toml says so (there was no key: the unit always said on-failure), and `TimeoutStopSec=` the model's
stop_timeout_s (120 in the seed; it rendered as stop_timeout_s + 30). Where servedeck's unit differs
from the seed's, the unit says why, in comments a person reads beside the line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from servedeck.errors import ConfigError
from servedeck.modelsfile import parse

SERVEDECK = str(Path(sys.executable).with_name("servedeck"))


def _unit(deck_config, extra: str) -> str:
    text = deck_config.path.read_text().replace("args = { parallel = 4 }", "args = { parallel = 4 }\n" + extra, 1)
    deck_config.path.write_text(text)
    r = subprocess.run([SERVEDECK, "--config", str(deck_config.path), "unit", "smollm2"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


def _keys(unit: str) -> dict[str, str]:
    return dict(ln.split("=", 1) for ln in unit.splitlines() if "=" in ln and not ln.startswith("#"))


def _verify(unit: str, tmp_path: Path) -> None:
    if not shutil.which("systemd-analyze"):  # pragma: no cover - the CI image has it
        pytest.skip("systemd-analyze is not installed here")
    path = tmp_path / "servedeck-smollm2.service"
    path.write_text(unit)
    v = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60)
    assert v.returncode == 0 and str(path) not in v.stderr, v.stderr


def test_seed_004s_unit_restart_always_and_timeout_stop_120(deck_config, tmp_path):
    unit = _unit(deck_config, 'unit_restart = "always"\nstop_timeout_s = 120')
    keys = _keys(unit)
    assert keys["Restart"] == "always" and keys["TimeoutStopSec"] == "120", unit
    # the difference that matters under Restart=always is said where it is set
    assert "servedeck stop" in unit and "systemctl stop servedeck-smollm2" in unit
    _verify(unit, tmp_path)


def test_the_default_unit_restarts_on_failure_and_stops_within_stop_timeout_s(deck_config, tmp_path):
    unit = _unit(deck_config, "stop_timeout_s = 45")
    keys = _keys(unit)
    assert keys["Restart"] == "on-failure" and keys["TimeoutStopSec"] == "45", unit
    assert "KillMode=mixed" in unit and "# KillMode=mixed:" in unit  # differs from systemd's default: says why
    _verify(unit, tmp_path)


def test_a_fractional_stop_timeout_is_written_as_systemd_reads_it(deck_config, tmp_path):
    unit = _unit(deck_config, "stop_timeout_s = 2.5")
    assert _keys(unit)["TimeoutStopSec"] == "2.5s"
    _verify(unit, tmp_path)


def test_an_unknown_restart_value_is_refused_naming_systemds_values(deck_config):
    text = deck_config.path.read_text().replace("args = { parallel = 4 }", 'args = { parallel = 4 }\nunit_restart = "sometimes"', 1)
    with pytest.raises(ConfigError) as e:
        parse(text, deck_config.path)
    assert "models.smollm2.unit_restart" in e.value.message and "on-failure" in e.value.message, e.value.message
