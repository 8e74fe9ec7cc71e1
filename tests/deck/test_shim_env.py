"""The supervisor shim runs in servedeck's environment, the engine in the launch's.

On the H200 device servedeck was importable only through PYTHONPATH (the checkout's src/ and a
`pip --target` folder), and a build whose `env` set PYTHONPATH for vLLM replaced it for the shim
too: the shim died with `ModuleNotFoundError: No module named 'servedeck'` and `start` said "the
engine's process group is gone and no exit record was written (killed with its shim?)".

The same shape here: a bare venv of the base interpreter (nothing installed in it), servedeck and its
dependencies reached through PYTHONPATH only, and a real llama-server whose build sets PYTHONPATH."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import psutil
import pytest

from ports import free_port  # below the kernel's ephemeral range: tests/ports.py says why
from servedeck.supervisor.process import stop_group

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

SRC = Path(__file__).parents[2] / "src"


@pytest.fixture(scope="module")
def bare_python(tmp_path_factory) -> Path:
    """An interpreter that has neither servedeck nor its dependencies of its own."""
    d = tmp_path_factory.mktemp("bare-venv")
    subprocess.run([sys.base_prefix + "/bin/python3", "-m", "venv", "--without-pip", str(d)], check=True)
    return d / "bin" / "python"


def _config(tmp_path: Path, llama_server: str, gguf: str, port: int) -> Path:
    cfg = tmp_path / "models.toml"
    cfg.write_text(f"""
[builds.llamacpp]
engine = "llamacpp"
binary = "{llama_server}"
env = {{ PYTHONPATH = "/opt/the-engines-own-site" }}

[models.m]
source = "{gguf}"
build = "llamacpp"
port = {port}
context = 1024
""")
    return cfg


def _servedeck_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(SRC), sysconfig.get_paths()["purelib"]])  # deps from the test's venv
    return env


def _environ(pid: int) -> dict[str, str]:
    return psutil.Process(pid).environ()


def _stop(home: Path) -> None:
    for f in (home / "live").glob("*.json"):
        rec = json.loads(f.read_text())
        if rec.get("pgid"):
            stop_group(rec["pgid"], 10, leader_create_time=rec.get("create_time"))


def test_a_builds_pythonpath_reaches_the_engine_and_not_the_shim(tmp_path, bare_python, engines_ready, servedeck_home):
    cfg = _config(tmp_path, engines_ready["llama_server"], engines_ready["smollm2_gguf"], free_port())
    env = _servedeck_env()
    try:
        cp = subprocess.run([str(bare_python), "-m", "servedeck", "--config", str(cfg), "start", "m"],
                            env=env, capture_output=True, text=True, timeout=120)
        assert cp.returncode == 0, cp.stdout + cp.stderr
        rec = json.loads((servedeck_home / "live" / "m.json").read_text())
        shim, engine = _environ(rec["pid"]), _environ(rec["engine_pid"])
        assert shim["PYTHONPATH"] == env["PYTHONPATH"]  # servedeck's own, so the shim could import it
        assert engine["PYTHONPATH"] == "/opt/the-engines-own-site"  # the build's, as models.toml says
    finally:
        _stop(servedeck_home)


def test_a_shim_that_cannot_start_says_why(tmp_path, bare_python, engines_ready, servedeck_home):
    """servedeck imported by a program that put it on sys.path itself: the shim, started with the same
    interpreter and no such path, cannot import servedeck. `start` must say so, with the shim's words."""
    cfg = _config(tmp_path, engines_ready["llama_server"], engines_ready["smollm2_gguf"], free_port())
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    paths = [str(SRC), sysconfig.get_paths()["purelib"]]
    code = (f"import sys; sys.path[:0] = {paths!r}; sys.argv = ['servedeck', '--config', {str(cfg)!r}, 'start', 'm']; "
            "from servedeck.cli import main; main()")
    try:
        cp = subprocess.run([str(bare_python), "-c", code], env=env, capture_output=True, text=True, timeout=120)
    finally:
        _stop(servedeck_home)
    out = cp.stdout + cp.stderr
    assert cp.returncode != 0
    assert "supervisor" in out and "before it started the engine" in out, out
    assert "No module named 'servedeck'" in out, out
    assert "killed with its shim" not in out
