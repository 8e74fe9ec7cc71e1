"""`servedeck init` on a machine that has never seen this repository (issue 50 items 2 and 3): a machine laid
out in tmp_path with real things on it (the real llama-server on PATH, the real SmolLM2 GGUF in a folder,
its Hugging Face snapshot in a cache laid out as huggingface_hub lays it, an Ollama manifest and blob and an
LM Studio folder holding the same GGUF), through the real CLI; the GGUF model it writes answers a request.
Container images are tested on `docker images` output only: no Docker engine runs here."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import httpx
import pytest

from machine import REPO, bare_env, free_ports, lay_out_machine
from servedeck.discover.engines import image_engine, parse_image_list
from servedeck.init import default_locations
from servedeck.install import LLAMA_CPP_VERSION

SERVEDECK = str(Path(sys.executable).with_name("servedeck"))


def run(args, env, cwd, timeout=120, servedeck=SERVEDECK) -> subprocess.CompletedProcess:
    return subprocess.run([servedeck, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.engine
@pytest.mark.llamacpp
def test_init_finds_each_engine_and_model_and_the_gguf_entry_answers(tmp_path, engines_ready):
    lay = lay_out_machine(tmp_path, engines_ready)
    env = bare_env(tmp_path, f"{lay['bin']}:/usr/bin:/bin")
    work = tmp_path / "work"
    work.mkdir()
    vllm_py = engines_ready["vllm_python"]
    r = run(["init", "--models-dir", str(lay["gguf_dir"]), "--vllm-python", vllm_py], env, work)
    assert r.returncode == 0, r.stdout + r.stderr
    doc = tomllib.loads((work / "models.toml").read_text())
    builds = {b.get("binary") or b.get("python"): (name, b["engine"]) for name, b in doc["builds"].items()}
    assert builds[str(lay["bin"] / "llama-server")][1] == "llamacpp"
    assert builds[vllm_py][1] == "vllm"
    sources = {m["source"]: (name, m) for name, m in doc["models"].items()}
    for where in ("gguf", "ollama_blob", "lmstudio", "snapshot"):
        assert str(lay[where]) in sources, f"{where} missing from models.toml:\n{r.stdout}"
    assert sources[str(lay["snapshot"])][1]["build"] == builds[vllm_py][0]
    assert sources[str(lay["snapshot"])][1]["aliases"] == [REPO]
    assert sources[str(lay["snapshot"])][1]["context"] == 8192  # its config.json's max_position_embeddings
    assert sources[str(lay["ollama_blob"])][0] == "smollm2:135m"
    assert "Traceback" not in r.stderr and "wrote models.toml" in r.stdout
    # An Ollama blob has no .gguf name: it is still read as the GGUF it is (render, doctor's weights row).
    r = run(["render", "smollm2:135m"], env, work)
    assert r.returncode == 0 and str(lay["ollama_blob"]) in r.stdout, r.stdout + r.stderr
    r = run(["doctor", "smollm2:135m", "--json", "--no-integrity"], env, work)
    weights = [row for row in json.loads(r.stdout)["rows"] if row["check"] == "weights"]
    assert [row["status"] for row in weights] == ["OK"], weights

    # `servedeck start` of the GGUF model answers a request, then stops with nothing left behind.
    (work / "models.toml").write_text(free_ports((work / "models.toml").read_text()))
    name = sources[str(lay["gguf"])][0]
    env["SERVEDECK_HOME"] = os.environ["SERVEDECK_HOME"]
    try:
        r = run(["start", name], env, work, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        port = tomllib.loads((work / "models.toml").read_text())["models"][name]["port"]
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120, json={
            "model": name, "max_tokens": 8, "messages": [{"role": "user", "content": "Say hi."}]})
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
    finally:
        stop = run(["stop", name], env, work, timeout=180)
    assert stop.returncode == 0, stop.stdout + stop.stderr


def test_with_nothing_on_the_machine_init_says_what_to_install_and_exits_8(tmp_path):
    env = bare_env(tmp_path, "/usr/bin:/bin")
    r = run(["init"], env, tmp_path)
    assert r.returncode == 8, r.stdout + r.stderr
    assert "found no engine and no model" in r.stderr
    assert "servedeck install llama-server" in r.stderr and "--models-dir" in r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "models.toml").exists()


def test_a_gguf_without_llama_server_is_left_out_saying_why(tmp_path):
    gguf = tmp_path / "models" / "x.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF")  # unreadable past its magic: left out as well, with its own reason
    env = bare_env(tmp_path, "/usr/bin:/bin")
    r = run(["init", "--models-dir", str(gguf.parent)], env, tmp_path)
    assert r.returncode == 8 and "x.gguf" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.engine
def test_a_quote_in_the_cache_path_gives_valid_toml_and_the_starter_by_discovery(tmp_path, engines_ready):
    # SERVEDECK_CACHE='/tmp/c "x"' servedeck init && servedeck render smollm2 exited 2 when init wrote TOML
    # with str.format; the starter's entry is found in that cache by the same discovery as anything else.
    cache = tmp_path / 'c "x"'
    exe = cache / "engines" / f"llama.cpp-{LLAMA_CPP_VERSION}-cpu" / "bin" / "llama-server"
    exe.parent.mkdir(parents=True)
    exe.symlink_to(engines_ready["llama_server"])
    (cache / "models").mkdir()
    (cache / "models" / "smollm2-135m-instruct-q4_1.gguf").symlink_to(engines_ready["smollm2_gguf"])
    env = bare_env(tmp_path, "/usr/bin:/bin")
    env["SERVEDECK_CACHE"] = str(cache)
    r = run(["init", "--no-images"], env, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    r = run(["render", "smollm2"], env, tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    assert 'c "x"' in r.stdout or "c \\\"x\\\"" in r.stdout or "'c \"x\"'" in r.stdout
    doc = tomllib.loads((tmp_path / "models.toml").read_text())
    assert doc["models"]["smollm2"]["source"] == str(cache / "models" / "smollm2-135m-instruct-q4_1.gguf")
    assert doc["models"]["smollm2"]["tools"] is True  # the starter's tuned entry, not a plain one
    assert "smollm2-vllm" not in doc["models"]  # its engine and weights are not in this cache


def test_images_are_read_from_the_docker_images_listing():
    # No Docker engine runs here: the listing's parsing is what is tested.
    listing = "\n".join(["vllm/vllm-openai:v0.26.0", "lmsysorg/sglang:latest", "ghcr.io/ggml-org/llama.cpp:server-cuda",
                         "ghcr.io/ggml-org/llama.cpp:full", "python:3.12", "<none>:<none>",
                         "localhost:5000/vllm/vllm-openai:nightly", "vllm/vllm-openai:v0.26.0"])
    assert parse_image_list(listing) == ["vllm/vllm-openai:v0.26.0", "lmsysorg/sglang:latest",
                                         "ghcr.io/ggml-org/llama.cpp:server-cuda",
                                         "localhost:5000/vllm/vllm-openai:nightly"]
    assert [image_engine(r) for r in parse_image_list(listing)] == ["vllm", "sglang", "llamacpp", "vllm"]


def test_init_refuses_a_path_that_names_nothing(tmp_path):
    env = bare_env(tmp_path, "/usr/bin:/bin")
    for args, needle in ((["--llama-server", str(tmp_path / "nope")], "--llama-server"),
                         (["--models-dir", str(tmp_path / "nope")], "--models-dir"),
                         (["--vllm-python", sys.executable], "cannot import vllm")):
        r = run(["init", *args], env, tmp_path)
        assert r.returncode == 2 and needle in r.stderr and "Traceback" not in r.stderr, r.stderr


def test_the_starter_is_what_discovery_of_a_set_up_cache_gives():
    from servedeck.init import compose, starter_found

    text = compose(starter_found()).text
    doc = tomllib.loads(text)
    assert list(doc["models"]) == ["smollm2", "smollm2-vllm", "gemma", "minilm"]
    assert doc["builds"]["llamacpp"]["binary"] == default_locations()["llama_server"]
    # each comment stays with the table it is about, a sub-table ([models.x.client_defaults]) or not
    for name in doc["models"]:
        head = text.index(f"[models.{name}]\n")
        found_note = text.index("# found: ", head)
        assert found_note < text.find("\n[models.", head + 1) or text.find("\n[models.", head + 1) == -1, name


def test_a_model_whose_architecture_no_found_engine_serves_is_left_out_saying_why():
    from servedeck.discover import Engine, Found, Model
    from servedeck.init import compose

    found = Found([Engine("vllm", "python", "/v/bin/python", "--vllm-python", "0.32.0", serves=("LlamaForCausalLM",))],
                  [Model("/m/llama", "hf", "llama", "--models-dir /m", architecture="LlamaForCausalLM"),
                   Model("/m/odd", "hf", "odd", "--models-dir /m", architecture="OddForCausalLM"),
                   Model("/m/x.gguf", "gguf", "x", "--models-dir /m")])
    out = compose(found)
    assert list(out.models) == ["llama"]
    why = {lo.what: lo.why for lo in out.left_out}
    assert "OddForCausalLM is not in the model registry of vllm 0.32.0" in why["/m/odd"]
    assert why["/m/x.gguf"] == "a GGUF file needs llama-server, and none was found"
    assert "# Found but left out:" in out.text and "/m/odd" in out.text


@pytest.mark.engine
def test_install_finds_its_own_build_at_once_and_init_finds_it_there(tmp_path, engines_ready):
    # The installer set-up ran (scripts/build-llama-server.sh → servedeck/install.py) is `servedeck install`'s.
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    r = run(["install", "llama-server"], env, tmp_path, timeout=60)
    assert r.returncode == 0 and r.stdout.splitlines()[0] == engines_ready["llama_server"], r.stdout + r.stderr


def test_install_without_a_compiler_says_what_to_install(tmp_path):
    env = bare_env(tmp_path, str(tmp_path / "nothing"))
    r = run(["install", "llama-server"], env, tmp_path, timeout=60)
    assert r.returncode == 1 and "building llama-server needs" in r.stderr and "cmake" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and not (tmp_path / "cache" / "engines").exists()
