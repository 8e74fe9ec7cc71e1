"""The front door's models.toml keys: ttl as seconds or a duration, preload names checked, keys long enough."""

from __future__ import annotations

import pytest

from servedeck.modelsfile import parse
from servedeck.errors import ConfigError

BASE = """
[builds.b]
engine = "llamacpp"
binary = "/bin/true"

[models.m]
source = "/x.gguf"
build = "b"
port = 9001
aliases = ["mm"]
"""


def test_ttl_takes_seconds_or_a_duration(tmp_path):
    assert parse(BASE + "ttl = 90\n", tmp_path / "m.toml").models["m"].ttl == 90.0
    assert parse(BASE + 'ttl = "10m"\n', tmp_path / "m.toml").models["m"].ttl == 600.0
    assert parse(BASE, tmp_path / "m.toml").models["m"].ttl is None
    for bad in ('"soon"', "0", "-5", "true"):
        with pytest.raises(ConfigError) as e:
            parse(BASE + f"ttl = {bad}\n", tmp_path / "m.toml")
        assert "models.m.ttl" in e.value.message


def test_preload_names_must_exist_and_host_keys_are_checked(tmp_path):
    cfg = parse('[host]\npreload = ["mm"]\nmin_residency_s = 5\n' + BASE, tmp_path / "m.toml")
    assert cfg.deck.host.preload == ["mm"] and cfg.deck.host.min_residency_s == 5
    with pytest.raises(ConfigError) as e:
        parse('[host]\npreload = ["nope"]\n' + BASE, tmp_path / "m.toml")
    assert "host.preload[0]: no model or alias named 'nope'" in e.value.message
    with pytest.raises(ConfigError) as e:
        parse('[host]\napi_keys = ["short"]\n' + BASE, tmp_path / "m.toml")
    assert "host.api_keys" in e.value.message and "8 characters" in e.value.message
    with pytest.raises(ConfigError) as e:
        parse('[host]\nqueue_max = -1\n' + BASE, tmp_path / "m.toml")
    assert "host.queue_max" in e.value.message
