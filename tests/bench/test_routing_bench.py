"""bench/routing_side_by_side.py's decisions, without processes: the door's copy of models.toml (its TOML,
the arm's policy, what else it changes), which entry and whether its replicas can be emptied in place, the
time budget between reps, the options it refuses."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from servedeck.errors import UsageError
from servedeck.modelsfile import parse

import benchkit  # noqa: F401  (the bench's folder on sys.path)
from _routing_door import door_config, toml_text  # noqa: E402
from _routing_replicas import replicated_entry, reset_check  # noqa: E402
import routing_side_by_side as bench  # noqa: E402


def pair_toml(engines: dict[str, str], env: str = "", routing: str = "") -> str:
    return f"""
[host]
api_keys = ["a-key-of-8-chars"]

[builds.vllm-cpu]
engine = "vllm"
python = "{engines['vllm_python']}"

[builds.llamacpp]
engine = "llamacpp"
binary = "{engines['llama_server']}"

[models.pair]
source = "{engines['smollm2_hf']}"
build = "vllm-cpu"
port = 18000
replicas = 2
cpus = [[0], [1]]
context = 4096
env = {{ VLLM_CPU_KVCACHE_SPACE = "1"{env} }}
args = {{ enforce-eager = true, dtype = "float32" }}
{routing}

[models.lpair]
source = "./models/smol.gguf"
build = "llamacpp"
port = 18010
replicas = 2
aliases = ["lp"]

[models.single]
source = "{engines['smollm2_gguf']}"
build = "llamacpp"
port = 18020
"""


def test_toml_text_writes_back_what_tomllib_read():
    data = {"top": 1, "host": {"power_min_w": 350.5, "on_notice": ["notify-send", "servedeck"], "flag": False},
            "models": {"a.b": {"source": 'q"uote\\back\nline\ttab \x7f dé 🙂', "cpus": [[0], [1]],
                               "args": {"spec-type": "x", "n": {"deep": [1, 2.5, True]}}, "routing": {},
                               "ttl": float("inf")}},
            "empty": {}}
    text = toml_text(data)
    assert tomllib.loads(text) == data


def test_toml_text_of_the_starter_file_loads_as_the_same_deck(tmp_path):
    from servedeck.init import render_starter

    start = render_starter()
    again = toml_text(tomllib.loads(start))
    assert tomllib.loads(again) == tomllib.loads(start)
    assert parse(again, tmp_path / "m.toml").deck == parse(start, tmp_path / "m.toml").deck


def test_the_doors_copy_routes_the_entry_by_the_arms_policy_and_changes_only_what_it_says(tmp_path):
    engines = {"vllm_python": "/py", "llama_server": "/ls", "smollm2_hf": "/hf", "smollm2_gguf": "/g.gguf"}
    raw = tomllib.loads(pair_toml(engines))
    before = tomllib.loads(pair_toml(engines))
    got = door_config(raw, "lpair", "prefix", tmp_path)
    assert raw == before  # the file as read is left alone
    assert got["models"]["lpair"]["routing"] == "prefix"
    assert "routing" not in got["models"]["pair"]
    assert got["host"] == {}  # keys dropped: the door's client is the bench's, on loopback
    assert got["models"]["lpair"]["source"] == str(tmp_path / "models" / "smol.gguf")  # as servedeck reads it
    rest = {k: v for k, v in got["models"]["pair"].items()}
    assert rest == before["models"]["pair"]
    cfg = parse(toml_text(got), Path("/elsewhere/copy.toml"))
    assert {cfg.models[m].routing.policy for m in cfg.groups["lpair"].members} == {"prefix"}
    assert cfg.deck.host.api_keys == []


def test_a_routing_table_of_the_same_policy_keeps_its_knobs_and_another_policy_replaces_it(tmp_path):
    engines = {"vllm_python": "/py", "llama_server": "/ls", "smollm2_hf": "/hf", "smollm2_gguf": "/g.gguf"}
    raw = tomllib.loads(pair_toml(engines, routing='routing = { policy = "session", header = "x-conv" }'))
    assert door_config(raw, "pair", "session", tmp_path)["models"]["pair"]["routing"] == \
        {"policy": "session", "header": "x-conv"}
    got = door_config(raw, "pair", "prefix", tmp_path)
    assert got["models"]["pair"]["routing"] == "prefix"  # `header` would be a stray knob for prefix
    parse(toml_text(got), tmp_path / "copy.toml")


def test_the_entry_must_have_replicas_and_is_named_by_name_or_alias(tmp_path, engines_ready):
    cfg = parse(pair_toml(engines_ready), tmp_path / "models.toml")
    assert replicated_entry(cfg, "lp") == ("lpair", ("lpair.r1", "lpair.r2"))
    with pytest.raises(UsageError) as e:
        replicated_entry(cfg, "single")
    assert "'single' as a single server" in e.value.message and str(cfg.path) in e.value.message
    assert "pair (2 replicas)" in e.value.message and "replicas = 2" in e.value.hint
    with pytest.raises(UsageError) as e:
        replicated_entry(cfg, "nope")
    assert "no entry 'nope'" in e.value.message


def test_reset_between_arms_is_refused_before_any_boot_where_the_adapter_cannot(tmp_path, engines_ready,
                                                                                monkeypatch):
    monkeypatch.delenv("VLLM_SERVER_DEV_MODE", raising=False)
    cfg = parse(pair_toml(engines_ready), tmp_path / "models.toml")
    with pytest.raises(UsageError) as e:
        reset_check(cfg, cfg.groups["pair"].members)
    assert "pair.r1 (vllm" in e.value.message and "VLLM_SERVER_DEV_MODE=1" in e.value.message
    assert 'VLLM_SERVER_DEV_MODE = "1"' in e.value.hint and "--between-arms at restart" in e.value.hint
    with pytest.raises(UsageError) as e:
        reset_check(cfg, cfg.groups["lpair"].members)
    assert "--cache-ram" in e.value.message
    on = parse(pair_toml(engines_ready, env=', VLLM_SERVER_DEV_MODE = "1"'), tmp_path / "models.toml")
    assert reset_check(on, on.groups["pair"].members) == {"pair.r1": "/reset_prefix_cache",
                                                          "pair.r2": "/reset_prefix_cache"}
    monkeypatch.setenv("VLLM_SERVER_DEV_MODE", "1")  # servedeck's own environment reaches the engine too
    assert reset_check(cfg, cfg.groups["pair"].members)["pair.r2"] == "/reset_prefix_cache"


def test_a_rep_starts_only_while_the_longest_so_far_still_fits_the_budget():
    assert bench.budget_left(None, 0.0, 500.0, 1000.0)
    assert bench.budget_left(240.0, 100.0, 60.0, 270.0)  # 170 s so far + 60 <= 240
    assert not bench.budget_left(240.0, 100.0, 80.0, 270.0)  # 170 + 80 > 240


@pytest.mark.parametrize("argv, says", [
    (["--config", "m.toml"], "--config and --model go together"),
    (["--model", "pair"], "--config and --model go together"),
    (["--config", "m.toml", "--model", "pair", "--gguf", "x.gguf"], "with --config the entry says"),
    (["--between-arms", "reset"], "--between-arms reset needs --config"),
    (["--routers", "door:nope"], "expected one of"),
])
def test_options_that_cannot_go_together_are_refused(argv, says, capsys):
    with pytest.raises(SystemExit) as e:
        bench.parse_args(argv)
    assert e.value.code == 2 and says in capsys.readouterr().err


def test_the_entry_in_the_results_keeps_no_secret(tmp_path, engines_ready):
    engines = dict(engines_ready)
    path = tmp_path / "models.toml"
    path.write_text(pair_toml(engines, env=', HF_TOKEN = "hf_abcdefghijklmnopqrstuvwxyz0123456789"')
                    .replace('args = { enforce-eager = true, dtype = "float32" }',
                             'args = { enforce-eager = true, api-key = "sk-live-door-key-1234567890" }'))
    setup = bench.DeckSetup(path, "pair", "restart", tmp_path / "home")
    entry = setup.entry_as_written()
    assert entry["env"]["HF_TOKEN"] == "<redacted>" and entry["env"]["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert entry["args"] == {"enforce-eager": True, "api-key": "<redacted>"}
    assert entry["replicas"] == 2 and entry["cpus"] == [[0], [1]]
