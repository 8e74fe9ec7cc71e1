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
    from servedeck.cli import root_app as a  # the app with every command module registered

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


def _kernel_row(out: str) -> dict:
    return next(r for r in json.loads(out)["rows"] if r["check"] == "kernel")


def test_doctor_ack_kernel_records_who_and_when_and_quiets_only_those_events(cfg_file, tmp_path, monkeypatch):
    """Issue 31 item 5, through the command and the journal reader: seed 004's two September Xid 79 (+154)
    fail the kernel row until acknowledged; after, they are shown and the row passes; a new one fails it."""
    from kernel_log import KernelJournal
    from servedeck.doctor.kernel_ack import acks_file

    k = KernelJournal(tmp_path / "kernel", monkeypatch)
    lost = "NVRM: Xid (PCI:0000:01:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    reboot = "NVRM: Xid (PCI:0000:01:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)"
    for at in (1_789_154_681.0, 1_789_219_544.0):  # 2026-09-11 21:24:41 and 2026-09-12 14:25:44 (+02:00)
        k.add(lost, at)
        k.add(reboot, at + 0.01)
    before = _kernel_row(runner.invoke(app(), ["doctor", "smol", "--json", "--no-integrity"]).stdout)
    assert before["status"] == "FAIL" and "Xid 79 ×2" in before["saw"]
    r = runner.invoke(app(), ["doctor", "smol", "--ack-kernel", "--no-integrity"])
    assert "acknowledged Xid 154 ×2, Xid 79 ×2" in r.stdout
    [ack] = json.loads(acks_file().read_text())["acks"]
    assert ack["by"] and ack["acknowledged_at"] and ack["events"] == 4
    after = _kernel_row(runner.invoke(app(), ["doctor", "smol", "--json", "--no-integrity"]).stdout)
    assert after["status"] == "OK" and "acknowledged by" in after["saw"] and "Xid 79 ×2" in after["saw"]
    runner.invoke(app(), ["doctor", "smol", "--ack-kernel", "--json", "--no-integrity"])
    assert len(json.loads(acks_file().read_text())["acks"]) == 1  # nothing new: nothing recorded
    k.add(lost, 1_791_000_000.0)  # 2026-10-03: after the acknowledgement
    new = _kernel_row(runner.invoke(app(), ["doctor", "smol", "--json", "--no-integrity"]).stdout)
    assert new["status"] == "FAIL" and new["saw"].startswith("Xid 79 ×1")


def test_crashes_are_grouped_by_build_and_engine_version(cfg_file, tmp_path):
    """Issue 31 item 4: seed 004's Xid 79 crash on 0.29.0 is the host's, and the race was on 0.27.1: each
    build and version is its own table. A record from before they were kept gets them from its launch folder."""
    from servedeck.doctor.forensics import classify

    lost = classify("RuntimeError: CUDA error: unspecified launch failure\nEngineDeadError", {"returncode": 1},
                    [{"kind": "xid", "code": 79, "line": "NVRM: Xid (PCI:0000:01:00): 79, ..."}])
    race = classify("!!!!!!! Segfault encountered !!!!!!!", {"signal": "SIGSEGV"}, [], engine="vllm")
    old = tmp_path / "launches" / "smol" / "20260910-031200"
    old.mkdir(parents=True)
    (old / "launch.json").write_text(json.dumps({"build": "rollback"}))
    (old / "boot.json").write_text(json.dumps({"engine_version": "0.27.1"}))
    for rec in ({"ts": "2026-09-10T03:12:01+02:00", "cause": race, "launch_dir": str(old)},
                {"ts": "2026-09-12T14:25:46+02:00", "cause": lost, "build": "stock", "engine_version": "0.29.0"},
                {"ts": "2026-09-13T10:00:00+02:00", "cause": race, "build": "stock", "engine_version": "0.29.0"}):
        append_jsonl(paths.journal_file(), {"event": "crash", "model": "smol", "outcome": "crashed", **rec})
    recs = json.loads(runner.invoke(app(), ["crashes", "--json"]).stdout)
    assert [(r["build"], r["engine_version"]) for r in recs] == [("rollback", "0.27.1"), ("stock", "0.29.0"),
                                                                 ("stock", "0.29.0")]
    out = runner.invoke(app(), ["crashes"], env={"COLUMNS": "200"}).stdout
    assert "crashes of build rollback, engine 0.27.1: 1" in out and "crashes of build stock, engine 0.29.0: 2" in out
    assert out.index("rollback") < out.index("vllm-cudagraph-segfault") < out.index("crashes of build stock")
