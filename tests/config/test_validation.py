"""A corpus of bad models.toml files, each giving its specific error (file, key path, what was expected)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from servedeck.modelsfile import load, parse
from servedeck.errors import ConfigError, UnknownModelError

CORPUS = sorted((Path(__file__).parent.parent / "data" / "bad_configs").glob("*.toml"))


def expected(path: Path) -> str:
    first = path.read_text().splitlines()[0]
    assert first.startswith("# expect: "), path
    return first.removeprefix("# expect: ")


@pytest.mark.parametrize("path", CORPUS, ids=[p.stem for p in CORPUS])
def test_bad_config_names_file_key_and_expectation(path):
    with pytest.raises(ConfigError) as e:
        load(path)
    msg = e.value.message
    assert str(path) in msg, msg
    assert expected(path) in msg, msg
    assert e.value.hint


def test_missing_file_suggests_init(tmp_path):
    with pytest.raises(ConfigError) as e:
        load(tmp_path / "nope.toml")
    assert "servedeck init" in e.value.hint


def test_cli_prints_error_without_traceback(tmp_path):
    bad = CORPUS[0]
    r = subprocess.run([sys.executable, "-m", "servedeck", "--config", str(bad), "render", "a"],
                       capture_output=True, text=True)
    assert r.returncode == 2
    assert "Traceback" not in r.stderr
    assert expected(bad) in r.stderr


GOOD = """
[builds.l]
engine = "llamacpp"
binary = "/bin/llama-server"
[models.smollm2]
source = "/m.gguf"
build = "l"
port = 8000
aliases = ["smol", "tiny"]
"""


def test_alias_resolves_everywhere():
    cfg = parse(GOOD, Path("models.toml"))
    assert cfg.resolve("smol") == "smollm2"
    assert cfg.resolve("tiny") == "smollm2"
    assert cfg.resolve("smollm2") == "smollm2"
    with pytest.raises(UnknownModelError) as e:
        cfg.resolve("gemma")
    assert "smollm2" in e.value.hint


def test_file_is_never_rewritten(tmp_path):
    p = tmp_path / "models.toml"
    p.write_text(GOOD)
    before = p.stat().st_mtime_ns, p.read_bytes()
    cfg = load(p)
    from servedeck.deck import Deck

    Deck(cfg).render("smol")
    assert (p.stat().st_mtime_ns, p.read_bytes()) == before


def test_starter_config_validates():
    from servedeck.init import render_starter

    cfg = parse(render_starter(Path("/cache")), Path("models.toml"))
    assert set(cfg.models) == {"smollm2", "smollm2-vllm", "gemma", "minilm"}
    assert cfg.models["smollm2"].source == "/cache/models/smollm2-135m-instruct-q4_1.gguf"


REPLICATED = """
[builds.l]
engine = "llamacpp"
binary = "/bin/llama-server"
[models.smol]
source = "/m.gguf"
build = "l"
port = 8000
slot = "main"
replicas = 2
cpus = [[0], [1]]
aliases = ["pair"]
ttl = "1m"
[models.other]
source = "/m.gguf"
build = "l"
port = 8010
"""


def test_replicas_expand_into_servers_of_their_own(tmp_path):
    cfg = parse(REPLICATED, tmp_path / "models.toml")
    assert sorted(cfg.models) == ["other", "smol.r1", "smol.r2"]
    r1, r2 = cfg.models["smol.r1"], cfg.models["smol.r2"]
    assert (r1.port, r2.port) == (8000, 8001) and (r1.cpus, r2.cpus) == ([0], [1])
    assert r1.slot == r2.slot == "main" and r1.served_name == r2.served_name == "smol"
    assert r1.aliases == [] and r1.replicas == 1 and r1.ttl is None
    assert cfg.members("pair") == cfg.members("smol") == ("smol.r1", "smol.r2")
    assert cfg.members("other") == ("other",)
    g = cfg.group_named("pair")
    assert g and g.ttl == 60 and cfg.group_of("smol.r2") is g and cfg.group_of("other") is None
    with pytest.raises(UnknownModelError) as e:  # a one-server command names a replica
        cfg.resolve("smol")
    assert "smol.r1, smol.r2" in e.value.hint


def test_a_replica_relaunched_from_desired_state_still_knows_its_siblings(tmp_path):
    from servedeck.deck.deck import config_from_settings, settings_of

    cfg = parse(REPLICATED, tmp_path / "models.toml")
    again = config_from_settings("smol.r2", settings_of("smol.r2", cfg), cfg)
    assert list(again.models) == ["smol.r2"] and again.group_of("smol.r2").members == ("smol.r1", "smol.r2")
