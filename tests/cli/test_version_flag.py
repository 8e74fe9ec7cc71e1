"""`servedeck --version`: the one version (servedeck/__init__.py, which the package metadata reads), the
Python running it, and the engines found on this machine without a models.toml (issue 50, item 1)."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import servedeck

SERVEDECK = [sys.executable, "-m", "servedeck"]


def version_of(path: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": path}
    return subprocess.run([*SERVEDECK, "--version"], capture_output=True, text=True, timeout=60, env=env)


def test_the_installed_metadata_and_the_module_give_one_version():
    assert importlib.metadata.version("servedeck") == servedeck.__version__


def test_version_names_servedeck_python_and_a_llama_server_on_path(tmp_path: Path):
    fake = tmp_path / "llama-server"
    fake.write_text("#!/bin/sh\necho 'version: 4242 (abc1234)' >&2\n")
    fake.chmod(0o755)
    r = version_of(f"{tmp_path}:/usr/bin:/bin")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"servedeck {servedeck.__version__}"
    assert lines[1].startswith(f"Python {sys.version.split()[0]} ")
    assert f"llama.cpp: {fake} (version 4242 (abc1234))" in r.stdout


def test_version_without_engines_says_what_to_install(tmp_path: Path):
    r = version_of(str(tmp_path))  # nothing on PATH; vLLM and SGLang are not in the test venv
    assert r.returncode == 0, r.stderr
    assert "engines: none found" in r.stdout and "llama-server on PATH" in r.stdout


def test_version_registers_no_command_module():
    code = ("import sys; from servedeck.cli import register; register(['--version']); "
            "print(sorted(m for m in sys.modules if m.startswith('servedeck.cli.') and m not in "
            "('servedeck.cli.app', 'servedeck.cli.panels')))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.stdout.strip() == "[]", r.stderr
