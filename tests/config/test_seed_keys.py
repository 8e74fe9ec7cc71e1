"""Issue 8 defect 10: the seed's `vision` and `max_output_tokens` keys are accepted, with meaning."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from servedeck.cli import root_app as app
from servedeck.modelsfile import load, parse
from servedeck.deck import Deck
from servedeck.errors import ConfigError

SEED = """
[builds.stock]
engine = "vllm"
python = "/venvs/vllm-029/bin/python"

[builds.llama]
engine = "llamacpp"
binary = "/opt/llama/bin/llama-server"

[models.qwen27b]
source = "RadixArk/Qwen3.8-27B-NVFP4"
build = "stock"
port = 8004
context = 262144
vision = true
max_output_tokens = 36000

[models.gemma-vl]
source = "/models/gemma3-4b.gguf"
build = "llama"
port = 8081
vision = true
mmproj = "/models/mmproj-gemma3-4b.gguf"
max_output_tokens = 512
"""


def cfg(text=SEED):
    return parse(text, Path("/home/u/models.toml"))


def test_seed_keys_are_accepted_and_vllm_renders_no_invented_flag():
    spec = Deck(cfg()).render("qwen27b")
    assert spec.max_output_tokens == 36000 and spec.vision is True
    argv = " ".join(spec.argv)
    # vLLM has no server-wide output cap and enables multimodal inputs itself: nothing is added
    assert "36000" not in argv and "mm" not in argv.replace("--max-model-len", "")
    assert spec.to_json()["vision"] is True and spec.to_json()["max_output_tokens"] == 36000
    assert spec.output_cap(64) == 64 and spec.output_cap(50_000) == 36000


def test_llamacpp_renders_the_cap_and_the_projector():
    argv = Deck(cfg()).render("gemma-vl").argv
    assert argv[argv.index("-n") + 1] == "512"
    assert argv[argv.index("--mmproj") + 1] == "/models/mmproj-gemma3-4b.gguf"


def test_llamacpp_vision_without_projector_is_refused_with_the_fix():
    with pytest.raises(ConfigError) as e:
        cfg(SEED.replace('mmproj = "/models/mmproj-gemma3-4b.gguf"\n', ""))
    assert "models.gemma-vl: vision = true on engine 'llamacpp' needs the projector file" in e.value.message
    assert "mmproj = " in e.value.message


def test_mmproj_on_vllm_or_without_vision_is_refused():
    with pytest.raises(ConfigError) as e:
        cfg(SEED.replace("max_output_tokens = 36000", 'max_output_tokens = 36000\nmmproj = "/x.gguf"'))
    assert "models.qwen27b.mmproj: engine 'vllm' takes no projector file" in e.value.message
    with pytest.raises(ConfigError) as e:
        cfg(SEED.replace("vision = true\nmmproj", "mmproj"))
    assert "models.gemma-vl.mmproj is set but vision is not" in e.value.message


def test_n_predict_in_args_is_refused_in_favour_of_the_key(tmp_path):
    p = tmp_path / "models.toml"
    p.write_text(SEED.replace('max_output_tokens = 512', 'args = { n-predict = 64 }'))
    with pytest.raises(ConfigError) as e:
        load(p)
    assert "max_output_tokens" in e.value.message


@pytest.mark.engine
def test_real_llamacpp_max_output_tokens_is_the_default_length_and_status_shows_the_keys(deck_config, tmp_path):
    """max_output_tokens renders as llama.cpp's -n: the length of a request that names none (not a cap on
    one that asks for more); servedeck's own requests are refused above it; status shows both keys."""
    text = deck_config.path.read_text().replace("args = { parallel = 4 }",
                                                "args = { parallel = 4 }\nmax_output_tokens = 6\nvision = false", 1)
    deck_config.path.write_text(text)
    c = load(deck_config.path)
    d = Deck(c)
    rec = d.start("smollm2").record
    try:
        argv = rec.spec["argv"]
        assert argv[argv.index("-n") + 1] == "6"
        # llama.cpp's -n is the length of a request that names none (it does not cut a request that asks
        # for more: measured on 11434, -n 6 with max_tokens 50 gave 50; docs/config.md says so)
        r = httpx.post(rec.base_url + "/v1/completions", timeout=180,
                       json={"model": "smollm2", "prompt": "Count: one, two, three,", "ignore_eos": True})
        assert r.json()["usage"]["completion_tokens"] == 6
        out = CliRunner().invoke(app, ["--config", str(c.path), "status", "--json"])
        row = next(x for x in json.loads(out.stdout) if x["model"] == "smollm2")
        assert row["max_output_tokens"] == 6 and row["vision"] is False
        # servedeck's own requests stay under the cap: a bench asking for more is refused, naming the key
        out = CliRunner().invoke(app, ["--config", str(c.path), "bench", "smollm2", "--output-tokens", "16",
                                       "--requests", "1", "--no-gate"])
        assert out.exit_code != 0
        assert "above models.smollm2.max_output_tokens (6)" in str(out.exception or "") + out.output
    finally:
        d.stop(["smollm2"])
