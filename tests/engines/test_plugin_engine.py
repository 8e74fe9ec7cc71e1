"""The engine seam is real: an engine from an outside package, registered through its own
`servedeck.engines` entry point, validates, renders, starts, gates and benches like a built-in,
touching no servedeck file. The plugin here is a fork of the llama.cpp adapter under another name
(as a vLLM fork would subclass the vLLM adapter), wrapping the real llama-server."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ports import free_port  # below the kernel's ephemeral range: tests/ports.py says why


PLUGIN = '''
"""An outside engine: llama-server under another name (a fork), registered by entry point."""
from servedeck.engines.llamacpp import LlamaCpp


class WrappedLlama(LlamaCpp):
    name = "llamawrap"

    def command(self, name, model, build, cfg):
        argv, env = super().command(name, model, build, cfg)
        env["LLAMAWRAP"] = "1"  # what differs in this fork: an env var of its own
        return argv, env


ENGINE = WrappedLlama()
'''


@pytest.fixture
def plugin_env(tmp_path) -> dict[str, str]:
    """A package on its own sys.path entry with dist-info metadata naming its entry point, exactly
    what `pip install` leaves behind; servedeck finds it through importlib.metadata."""
    site = tmp_path / "plugin-site"
    (site / "llamawrap_plugin").mkdir(parents=True)
    (site / "llamawrap_plugin" / "__init__.py").write_text(PLUGIN)
    info = site / "llamawrap_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llamawrap-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[servedeck.engines]\nllamawrap = llamawrap_plugin:ENGINE\n")
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(site), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def _cli(env, cfg: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg), *args],
                          capture_output=True, text=True, env=env, timeout=timeout)


def _config(tmp_path: Path, engines_ready: dict, engine: str) -> Path:
    cfg = tmp_path / "models.toml"
    cfg.write_text(textwrap.dedent(f"""\
        [host]
        results_dir = "{tmp_path / 'results'}"

        [builds.wrapped]
        engine = "{engine}"
        binary = "{engines_ready['llama_server']}"

        [models.smolwrap]
        source = "{engines_ready['smollm2_gguf']}"
        build = "wrapped"
        port = {free_port()}
        context = 2048
        args = {{ parallel = 2 }}
        """))
    return cfg


def test_unknown_engine_is_refused_with_the_registered_names(tmp_path, engines_ready, plugin_env):
    cfg = _config(tmp_path, engines_ready, "nosuch")
    r = _cli(plugin_env, cfg, "render", "smolwrap")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "builds.wrapped.engine: unknown engine 'nosuch'" in r.stderr
    assert "llamawrap" in r.stderr and "llamacpp" in r.stderr  # the plugin is among the registered names


@pytest.mark.engine
@pytest.mark.llamacpp
def test_plugin_engine_validates_renders_starts_gates_and_benches(tmp_path, engines_ready, plugin_env):
    cfg = _config(tmp_path, engines_ready, "llamawrap")
    r = _cli(plugin_env, cfg, "render", "smolwrap", "--json")
    assert r.returncode == 0, r.stderr
    spec = json.loads(r.stdout)
    assert spec["engine"] == "llamawrap" and spec["env"]["LLAMAWRAP"] == "1"
    assert spec["argv"][0] == engines_ready["llama_server"] and "--metrics" in spec["argv"]
    assert spec["argv"][spec["argv"].index("-c") + 1] == "4096"  # the llama.cpp rules it inherits: c = ctx × slots

    # One bench with --launch: start through the deck, gate, one measured point, stop.
    r = _cli(plugin_env, cfg, "bench", "smolwrap", "--launch", "--concurrency", "2", "--requests", "4",
             "--input-tokens", "64", "--output-tokens", "8", "--gate-context", "1024", "--json", timeout=600)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-2000:])
    view = json.loads(r.stdout)
    assert view["engine"] == "llamawrap" and view["gate"]["status"] == "passed"
    [point] = view["points"]
    assert point["headline"]["ok"] == 4
    # the engine's own prefix-cache counters were read through the inherited adapter
    assert point["counters"]["available"] and point["counters"]["queried_tokens"] > 0
    hist = _cli(plugin_env, cfg, "history", "--json")
    events = [(e["event"], e["outcome"]) for e in json.loads(hist.stdout)]
    assert ("campaign", "ready") in events and ("stop", "stopped") in events
    st = _cli(plugin_env, cfg, "status", "--json")
    assert json.loads(st.stdout) == []  # --launch stopped it again
