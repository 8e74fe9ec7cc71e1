"""The commands as a person and a script use them: tables and --json, exit codes, errors without tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from servedeck import paths
from servedeck.fsio import append_jsonl

FIX = Path(__file__).parents[1] / "gpu" / "fixtures"
runner = CliRunner()


@pytest.fixture
def cfg_file(tmp_path, monkeypatch):
    d = tmp_path / "smol"
    d.mkdir()
    (d / "config.json").write_text((FIX / "smollm2-135m-hf.json").read_text())
    with open(d / "model.safetensors", "wb") as fh:
        fh.truncate(538_090_408)
    p = tmp_path / "models.toml"
    p.write_text(f"""
[builds.cpu]
engine = "vllm"
python = "{tmp_path}/nope/bin/python"

[models.smol]
source = "{d}"
build = "cpu"
port = 18777
context = 8192
aliases = ["s"]
env = {{ VLLM_CPU_KVCACHE_SPACE = "2" }}
""")
    monkeypatch.setenv("SERVEDECK_CONFIG", str(p))
    return p


def app():
    from servedeck.cli.app import app as a  # importing servedeck.cli (its package) registers every command module

    return a


def test_plan_json_and_table(cfg_file):
    r = runner.invoke(app(), ["plan", "s", "--json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.stdout)
    assert data["model"] == "smol" and data["plan"]["kv_pool_tokens"] == 93_184 and data["last_measured"] is None
    r = runner.invoke(app(), ["plan", "smol"])
    assert "93,184" in r.stdout and "no boot of this model+build measured yet" in r.stdout


def test_plan_shows_last_measured(cfg_file):
    from servedeck.gpu import record_measurement

    record_measurement("smol", "cpu", {"kv_tokens": 93_184, "max_concurrency": 11.38}, {"kv_pool_tokens": 93_184})
    r = runner.invoke(app(), ["plan", "smol"])
    assert r.stdout.count("93,184") == 2 and "+0.00%" in r.stdout


def test_plan_for_a_gpu_size_without_a_gpu(cfg_file):
    text = cfg_file.read_text().replace('env = { VLLM_CPU_KVCACHE_SPACE = "2" }', "gpu_memory_utilization = 0.9")
    cfg_file.write_text(text)
    r = runner.invoke(app(), ["plan", "smol", "--gpu-gib", "80", "--json"])
    p = json.loads(r.stdout)["plan"]
    assert p["budget_bytes_per_gpu"] == int(80 * 1024**3 * 0.9) and p["kv_pool_tokens"] > 1_000_000


def test_unknown_model_is_a_user_error(cfg_file):
    from servedeck.errors import UnknownModelError

    r = runner.invoke(app(), ["plan", "nope"])
    assert isinstance(r.exception, UnknownModelError) and "no model or alias named 'nope'" in str(r.exception)


def test_the_console_script_prints_errors_without_tracebacks(cfg_file):
    r = subprocess.run([sys.executable, "-c", "from servedeck.cli import main; main()", "plan", "nope"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and "error:" in r.stderr and "Traceback" not in r.stderr


def test_gpu_json_here(cfg_file):
    r = runner.invoke(app(), ["gpu", "--json"])
    data = json.loads(r.stdout)
    assert set(data) >= {"available", "reason", "gpus", "holders"}
    if not data["available"]:
        assert data["reason"] and data["gpus"] == [] and data["holders"] == []


def test_doctor_json_fails_on_a_missing_build(cfg_file):
    r = runner.invoke(app(), ["doctor", "smol", "--json"])
    data = json.loads(r.stdout)
    rows = {(x["check"], x["subject"]): x for x in data["rows"]}
    assert rows[("build", "cpu")]["status"] == "FAIL" and data["worst"] == "FAIL" and r.exit_code == 1
    assert rows[("weights", "smol")]["status"] == "OK"
    r = runner.invoke(app(), ["doctor"])
    assert "FAIL" in r.stdout and "weights" in r.stdout


def test_crashes_from_the_journal(cfg_file):
    from servedeck.doctor.forensics import classify

    cause = classify("RuntimeError: CUDA error: unspecified launch failure\nEngineDeadError",
                     {"returncode": 1}, [{"kind": "xid", "code": 79, "line": "NVRM: Xid (PCI:0000:01:00): 79, ..."}])
    append_jsonl(paths.journal_file(), {"ts": "2026-09-12T14:25:46+00:00", "event": "crash", "model": "smol",
                                        "outcome": "crashed", "build": "cpu", "cause": cause})
    append_jsonl(paths.journal_file(), {"ts": "2026-09-12T15:00:00+00:00", "event": "start", "model": "smol",
                                        "outcome": "ready"})
    append_jsonl(paths.journal_file(), {"ts": "2026-09-12T16:00:00+00:00", "event": "start", "model": "smol",
                                        "outcome": "failed", "cause": classify("error: unrecognized arguments: --x", None, [])})
    r = runner.invoke(app(), ["crashes", "s", "--json"])
    recs = json.loads(r.stdout)
    assert [x["cause"]["id"] for x in recs] == ["xid-79", "vllm-bad-flag"]
    r = runner.invoke(app(), ["crashes"])
    assert "xid-79" in r.stdout and "gpu-lost" in r.stdout
    assert "no crashes recorded for gone" in runner.invoke(app(), ["crashes", "gone"]).stdout


def test_verify_build_unknown_and_missing(cfg_file):
    r = runner.invoke(app(), ["verify-build", "nope"])
    assert "no build named 'nope'" in str(r.exception)
    r = runner.invoke(app(), ["verify-build", "cpu", "--json"])
    assert r.exit_code == 1 and json.loads(r.stdout)["exists"] is False
