"""Issue 36 item 6: a model's name becomes file names under $SERVEDECK_HOME (live/<name>.json,
launches/<name>/, run folders, a campaign's cells), so a name that is not one safe path component is
refused when models.toml is loaded, with the characters said and an alias suggested for a repo id.
A name of `HuggingFaceTB/SmolLM2-135M` used to start an engine whose live record landed in a subfolder of
live/, so `status`, `stop NAME` and `stop --all` lost it; `../../../../tmp/x` wrote outside the state dir."""

from __future__ import annotations

import json
import os
import random
import string
import subprocess
import sys
from pathlib import Path

import pytest

from servedeck import paths
from servedeck.deck import launch as L
from servedeck.deck import state as S
from servedeck.errors import ConfigError, ServedeckError
from servedeck.modelsfile import parse
from servedeck.runs.folder import RunFolder

SERVEDECK = str(Path(sys.executable).with_name("servedeck"))

BASE = """
[builds.l]
engine = "llamacpp"
binary = "/bin/llama-server"
[models.{key}]
source = "/m.gguf"
build = "l"
port = 8000
"""

# What a careless user or a hostile one writes; each must be refused, none may reach the disk.
HOSTILE = ["HuggingFaceTB/SmolLM2-135M", "../../../../tmp/x", "..", ".", ".hidden", "a\\b", "a\nb", "a\x00b",
           "-rf", "a b", "a__b", "x" * 200, "", "/etc/passwd", "models/../../x", "ü-model", "a/", "~root"]


def _toml_key(name: str) -> str:
    return json.dumps(name)


def test_a_repo_id_as_a_models_name_is_refused_and_an_alias_suggested():
    with pytest.raises(ConfigError) as e:
        parse(BASE.format(key=_toml_key("HuggingFaceTB/SmolLM2-135M")), Path("/x/models.toml"))
    msg = e.value.message
    assert '/x/models.toml: models."HuggingFaceTB/SmolLM2-135M"' in msg, msg
    assert "it contains '/'" in msg and "letters, digits and . _ - @ + = , :" in msg, msg
    assert '[models.SmolLM2-135M]' in msg and 'aliases = ["HuggingFaceTB/SmolLM2-135M"]' in msg, msg


@pytest.mark.parametrize("name", HOSTILE, ids=[repr(n)[:30] for n in HOSTILE])
def test_a_name_that_is_not_one_path_component_is_refused_at_load(name):
    with pytest.raises(ConfigError) as e:
        parse(BASE.format(key=_toml_key(name)), Path("/x/models.toml"))
    assert "cannot be a model's name" in e.value.message, e.value.message


def test_a_replicated_entrys_name_is_checked_once_for_the_entry():
    text = BASE.format(key=_toml_key("org/m")) + "replicas = 2\n"
    with pytest.raises(ConfigError) as e:
        parse(text, Path("/x/models.toml"))
    assert e.value.message.count("cannot be a model's name") == 1, e.value.message


def test_the_usable_names_still_load():
    for name in ("smollm2", "Qwen3.8-27B-NVFP4", "llama3.1:8b", "m@p1", "max-num-seqs=64,dtype=f32", "a_b.c+d"):
        cfg = parse(BASE.format(key=_toml_key(name)), Path("/x/models.toml"))
        assert name in cfg.models


def test_an_alias_may_be_the_repo_id():
    text = BASE.format(key="SmolLM2-135M") + 'aliases = ["HuggingFaceTB/SmolLM2-135M"]\n'
    cfg = parse(text, Path("/x/models.toml"))
    assert cfg.resolve("HuggingFaceTB/SmolLM2-135M") == "SmolLM2-135M"


def _names() -> list[str]:
    """The corpus above and 400 more drawn (seed fixed) from an alphabet rich in path syntax."""
    rng = random.Random(36)
    alphabet = string.ascii_letters + string.digits + "./\\_-@+=,:~ \n\x00$*?'\"" + "..//"
    drawn = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 24))) for _ in range(400)]
    return HOSTILE + drawn + ["../" * n + "tmp/servedeck-escape" for n in range(1, 10)]


def _every_place_a_name_becomes_a_path(name: str, results: Path) -> list[Path]:
    """Each way servedeck turns a model's name into a path, tried; what got written (or was named)."""
    made: list[Path] = []
    for step in (lambda: made.append(S.live_path(name)),
                 lambda: S.write_live(_record(name)),
                 lambda: made.append(L.new_launch_dir(name)),
                 lambda: made.extend(L.past_launches(name)),
                 lambda: made.append(RunFolder.create(results, name, "tp1", 4096, "llamacpp", {}).path),
                 lambda: made.append(RunFolder.create(results, "m", name, 4096, "llamacpp", {}).path)):
        try:
            step()
        except ServedeckError:
            pass  # refused, naming the rule: the point
    return made


def _record(name: str):
    from servedeck.deck.records import LiveRecord

    return LiveRecord(model=name, engine="llamacpp", build="l", slot="main", port=1, launch_dir="/nowhere",
                      pid=None, pgid=None, create_time=None, owner_pid=os.getpid())


def test_no_name_places_a_file_outside_the_state_dir_or_the_results(tmp_path):
    home, results = Path(os.environ["SERVEDECK_HOME"]), tmp_path / "results" / "runs"
    escape = Path("/tmp/servedeck-escape")  # where ../../../../tmp/servedeck-escape lands from this home
    results.mkdir(parents=True)
    before = set(tmp_path.rglob("*"))
    for name in _names():
        for p in _every_place_a_name_becomes_a_path(name, results):
            p = Path(os.path.abspath(p))
            assert p.is_relative_to(home) or p.is_relative_to(results), (name, p)
    written = {p for p in set(tmp_path.rglob("*")) - before}
    outside = [p for p in written if not (p.is_relative_to(home) or p.is_relative_to(results))]
    assert not outside and not escape.exists(), outside
    # and every file or folder written is one component below its room
    for p in written:
        rel = p.relative_to(home) if p.is_relative_to(home) else p.relative_to(results)
        if rel.parts[0] == "live":
            assert len(rel.parts) <= 2, p  # live/<name>.json
        elif rel.parts[0] == "launches":
            assert len(rel.parts) <= 3, p  # launches/<name>/<stamp>
        elif p.is_relative_to(results):
            assert len(rel.parts) <= 2, p  # <run>/summary.json


def test_stop_and_logs_refuse_a_path_for_a_name_without_models_toml(tmp_path):
    """With no models.toml the names come straight from the command line: refused, exit 2."""
    for args in (["stop", "../../../../tmp/x"], ["logs", "../../etc"]):
        r = subprocess.run([SERVEDECK, "--config", str(tmp_path / "none.toml"), *args], capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 2, (args, r.stdout, r.stderr)
        assert "cannot be a model name" in r.stderr and "Traceback" not in r.stderr, r.stderr


@pytest.mark.engine
@pytest.mark.llamacpp
def test_a_repo_id_named_model_never_starts_an_engine_it_would_lose(deck_config):
    """The issue's case on real llama.cpp: before, `start` launched llama-server and `stop` could not find it."""
    # the header and its sub-tables ([models.smollm2.client_defaults]): the whole entry renamed
    text = deck_config.path.read_text().replace("[models.smollm2]", '[models."HuggingFaceTB/SmolLM2-135M"]', 1)
    text = text.replace("[models.smollm2.", '[models."HuggingFaceTB/SmolLM2-135M".')
    deck_config.path.write_text(text)
    port = parse(text.replace('"HuggingFaceTB/SmolLM2-135M"', "x"), deck_config.path).models["x"].port
    try:
        r = subprocess.run([SERVEDECK, "--config", str(deck_config.path), "start", "HuggingFaceTB/SmolLM2-135M"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 2, (r.stdout, r.stderr)
        assert "cannot be a model's name" in r.stderr and "aliases" in r.stderr, r.stderr
        from servedeck.supervisor.process import port_holder

        assert port_holder(port) is None  # no engine was started on the model's port
        assert not paths.launches_dir().exists() or not any(paths.launches_dir().rglob("engine.log"))
    finally:  # the old code left the engine in live/HuggingFaceTB/: stop it so the session stays clean
        _stop_nested(Path(os.environ["SERVEDECK_HOME"]))


@pytest.mark.engine
@pytest.mark.llamacpp
def test_the_suggested_alias_starts_status_and_stops_by_the_repo_id(deck_config):
    """What the refusal suggests works end to end on llama.cpp: the repo id as an alias."""
    text = deck_config.path.read_text().replace('aliases = ["smol", "SmolLM2-135M-Instruct"]',
                                                'aliases = ["smol", "HuggingFaceTB/SmolLM2-135M-Instruct"]', 1)
    deck_config.path.write_text(text)
    cli = [SERVEDECK, "--config", str(deck_config.path)]
    r = subprocess.run([*cli, "start", "HuggingFaceTB/SmolLM2-135M-Instruct"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    rows = json.loads(subprocess.run([*cli, "status", "--json"], capture_output=True, text=True, timeout=60).stdout)
    assert [(x["model"], x["state"]) for x in rows] == [("smollm2", "ready")]
    r = subprocess.run([*cli, "stop", "HuggingFaceTB/SmolLM2-135M-Instruct"], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and "smollm2: stopped" in r.stdout, (r.stdout, r.stderr)
    assert S.all_live() == {}


def _stop_nested(home: Path) -> None:
    from servedeck.supervisor.process import stop_group

    for f in (home / "live").rglob("*.json") if (home / "live").exists() else ():
        try:
            rec = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(rec, dict) and rec.get("pgid"):
            stop_group(rec["pgid"], 10, leader_create_time=rec.get("create_time"))


def test_status_prints_the_suggested_header_of_a_bad_name(tmp_path):
    """`status` warns about a bad models.toml and goes on from state alone; the warning's suggested
    `[models.SmolLM2-135M]` was taken as rich markup and vanished ("name it  and keep", issue 48 item 7)."""
    toml = tmp_path / "models.toml"
    toml.write_text(BASE.format(key=_toml_key("HuggingFaceTB/SmolLM2-135M")))
    r = subprocess.run([SERVEDECK, "--config", str(toml), "status"], capture_output=True, text=True, timeout=60)
    assert "name it [models.SmolLM2-135M] and keep" in " ".join(r.stderr.split()), r.stderr
