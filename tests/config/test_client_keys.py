"""models.toml's keys for what clients ask of a model beyond chat: `tools` (tool calling), `chat_template`
and `embeddings` (issue 31 items 17 and 18), each rendered into the flags its engine wants, each refused
in the form another engine wants, with the fix named. Pure: no engine runs here (the door's tests run
them for real: tests/door/test_door_clients.py, tests/door/test_door_vllm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from servedeck.deck import Deck
from servedeck.errors import ConfigError
from servedeck.init import render_starter
from servedeck.modelsfile import parse

BASE = """
[builds.vllm]
engine = "vllm"
python = "/venvs/vllm/bin/python"

[builds.llama]
engine = "llamacpp"
binary = "/opt/llama/bin/llama-server"

[builds.sgl]
engine = "sglang"
python = "/venvs/sglang/bin/python"

[models.qwen]
source = "Qwen/Qwen2.5-7B-Instruct"
build = "vllm"
port = 8001
{qwen}

[models.qwen-gguf]
source = "/models/qwen2.5-7b-instruct-q4_k_m.gguf"
build = "llama"
port = 8002
{gguf}

[models.qwen-sgl]
source = "Qwen/Qwen2.5-7B-Instruct"
build = "sgl"
port = 8003
{sgl}
"""


def cfg(qwen: str = "", gguf: str = "", sgl: str = ""):
    return parse(BASE.format(qwen=qwen, gguf=gguf, sgl=sgl), Path("/home/u/models.toml"))


def argv(c, name: str) -> list[str]:
    return Deck(c).render(name).argv


def test_tools_render_each_engines_own_flags():
    c = cfg('tools = "hermes"', "tools = true", 'tools = "qwen25"')
    a = argv(c, "qwen")
    assert "--enable-auto-tool-choice" in a and a[a.index("--tool-call-parser") + 1] == "hermes"
    assert "--jinja" in argv(c, "qwen-gguf")
    s = argv(c, "qwen-sgl")
    assert s[s.index("--tool-call-parser") + 1] == "qwen25" and "--enable-auto-tool-choice" not in s
    plain = cfg()
    for name in ("qwen", "qwen-gguf", "qwen-sgl"):  # nothing rendered without the key
        assert not {"--enable-auto-tool-choice", "--tool-call-parser", "--jinja"} & set(argv(plain, name))


def test_tools_in_the_other_engines_form_is_refused_naming_the_fix():
    with pytest.raises(ConfigError) as e:
        cfg(qwen="tools = true")
    assert "models.qwen.tools = true: engine 'vllm' needs its tool-call parser named" in e.value.message
    assert 'tools = "hermes"' in e.value.message and "llama3_json" in e.value.message
    with pytest.raises(ConfigError) as e:
        cfg(gguf='tools = "hermes"')
    assert "models.qwen-gguf.tools = 'hermes': engine 'llamacpp' takes no parser name" in e.value.message
    assert "tools = true" in e.value.message and "chat_template" in e.value.message
    with pytest.raises(ConfigError) as e:
        cfg(sgl="tools = true")
    assert "engine 'sglang' needs its tool-call parser named" in e.value.message
    with pytest.raises(ConfigError) as e:
        cfg(qwen='tools = ""')
    assert "tools is an empty string" in e.value.message


def test_chat_template_is_a_file_for_each_engine_relative_to_models_toml():
    t = 'chat_template = "./templates/tools.jinja"'
    c = cfg(t, t, t)
    want = "/home/u/templates/tools.jinja"
    a, g, s = argv(c, "qwen"), argv(c, "qwen-gguf"), argv(c, "qwen-sgl")
    assert a[a.index("--chat-template") + 1] == want
    assert g[g.index("--chat-template-file") + 1] == want
    assert s[s.index("--chat-template") + 1] == want


def test_flags_servedeck_renders_from_these_keys_are_refused_in_args():
    for model, args, key in (("qwen", "args = { tool-call-parser = \"hermes\" }", "tools"),
                             ("qwen", "args = { enable-auto-tool-choice = true }", "tools"),
                             ("qwen", 'args = { chat-template = "/t.jinja" }', "chat_template"),
                             ("qwen-gguf", "args = { jinja = true }", "tools"),
                             ("qwen-gguf", 'args = { chat-template-file = "/t.jinja" }', "chat_template"),
                             ("qwen-gguf", "args = { embedding = true }", "embeddings"),
                             ("qwen-sgl", "args = { is-embedding = true }", "embeddings")):
        kw = {"qwen": "qwen", "qwen-gguf": "gguf", "qwen-sgl": "sgl"}[model]
        with pytest.raises(ConfigError) as e:
            cfg(**{kw: args})
        assert f"servedeck renders this flag from models.{model}.{key}" in e.value.message, args


def test_embeddings_render_each_engines_switch_and_exclude_tools():
    c = cfg("embeddings = true", "embeddings = true\nargs = { pooling = \"mean\" }", "embeddings = true")
    a = argv(c, "qwen")
    assert a[a.index("--runner") + 1] == "pooling"
    assert "--embeddings" in argv(c, "qwen-gguf") and "--is-embedding" in argv(c, "qwen-sgl")
    a = argv(cfg('embeddings = true\nargs = { runner = "pooling", convert = "embed" }'), "qwen")
    assert a.count("--runner") == 1  # the user's own runner flag is kept, not doubled
    with pytest.raises(ConfigError) as e:
        cfg('embeddings = true\ntools = "hermes"')
    assert "embeddings = true serves /v1/embeddings only" in e.value.message


def test_the_starter_shows_tools_and_an_embedding_model(tmp_path):
    text = render_starter()
    c = parse(text, tmp_path / "models.toml")
    smol, smol_vllm, minilm = c.models["smollm2"], c.models["smollm2-vllm"], c.models["minilm"]
    assert smol.tools is True and smol_vllm.tools == "hermes"
    assert smol.chat_template == smol_vllm.chat_template and Path(smol.chat_template).is_file()
    assert minilm.embeddings and minilm.build == "vllm-cpu" and not c.models["gemma"].embeddings
    assert "--runner" in Deck(c).render("minilm").argv
