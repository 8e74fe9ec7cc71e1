"""Every doctor row, pass and fail, on real things: a real venv with a pip-installed (fake) engine wheel,
HF cache layouts built here, real listening processes, GGUF files written here. GPU rows use inventories
built by hand (there is no GPU on this machine) and the real NVML answer ("no driver") for SKIP."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from servedeck import paths
from servedeck.modelsfile import parse
from servedeck.doctor.build import verify_build
from servedeck.doctor.checks import (
    build_rows, check_config, check_gpu, check_host_ram, check_port, check_power, check_weights, run_doctor,
)
from servedeck.doctor.kernel import KernelLog
from servedeck.doctor.weights import check_hf, check_local
from servedeck.gpu.holders import attribute
from servedeck.gpu.nvml import Gpu, GpuProcess, Inventory

sys.path.insert(0, str(Path(__file__).parents[1] / "gpu"))
from gguf_writer import write_gguf  # noqa: E402
from ports import free_port  # below the kernel's ephemeral range: tests/ports.py says why

GiB = 1024**3
PIP = [sys.executable, "-m", "pip"]


# ---------------------------------------------------------------- a real venv with a pip-installed engine
def _wheel(dest: Path) -> Path:
    """A minimal wheel of a fake `vllm` 0.0.1 (a wheel is a zip: files + dist-info with RECORD)."""
    files = {"vllm/__init__.py": b"__version__ = '0.0.1'\n", "vllm/core.py": b"def run():\n    return 1\n",
             "vllm/kernels/attn.py": b"X = 2\n",
             "vllm-0.0.1.dist-info/METADATA": b"Metadata-Version: 2.1\nName: vllm\nVersion: 0.0.1\n",
             "vllm-0.0.1.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    rec = []
    for name, data in files.items():
        h = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        rec.append(f"{name},sha256={h},{len(data)}")
    rec.append("vllm-0.0.1.dist-info/RECORD,,")
    whl = dest / "vllm-0.0.1-py3-none-any.whl"
    with zipfile.ZipFile(whl, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
        z.writestr("vllm-0.0.1.dist-info/RECORD", "\n".join(rec) + "\n")
    return whl


@pytest.fixture(scope="session")
def base_venv(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root / "v")], check=True)
    whl = _wheel(root)
    # pip installs into the other venv (--python): offline, no index, the wheel from disk
    subprocess.run(PIP + ["--python", str(root / "v/bin/python"), "install", "-q", "--no-index", "--no-deps",
                          str(whl)], check=True, capture_output=True)
    return root / "v"


@pytest.fixture
def venv(base_venv, tmp_path) -> Path:
    v = tmp_path / "v"
    shutil.copytree(base_venv, v, symlinks=True)
    return v


def config(tmp_path: Path, body: str):
    p = tmp_path / "models.toml"
    p.write_text(body)
    return parse(body, p)


def vllm_cfg(tmp_path, python: Path, source: str = "/nonexistent", extra_build: str = "", extra_model: str = ""):
    return config(tmp_path, f"""
[builds.stock]
engine = "vllm"
python = "{python}"
{extra_build}

[models.qwen]
source = "{source}"
build = "stock"
port = {free_port()}
gpu_memory_utilization = 0.95
{extra_model}
""")


# ---------------------------------------------------------------- config
def test_config_row_ok_and_fail(tmp_path):
    cfg = vllm_cfg(tmp_path, Path("/x/bin/python"))
    row, got = check_config(lambda: cfg)
    assert row.status == "OK" and got is cfg
    bad = tmp_path / "bad.toml"
    bad.write_text("[models.x]\nsource = 1\n")
    from servedeck.modelsfile import load

    row, got = check_config(lambda: load(bad))
    assert row.status == "FAIL" and got is None and "models.x" in row.saw


# ---------------------------------------------------------------- build
def test_build_intact_venv(venv, tmp_path):
    rep = verify_build(vllm_cfg(tmp_path, venv / "bin/python").deck.builds["stock"], "stock")
    assert rep.exists and rep.engine_version == "0.0.1" and rep.version_source == "vllm package metadata"
    assert rep.intact and rep.files_matched == rep.files_total >= 5  # pip also hashes INSTALLER etc.
    rows = {r.check: r for r in build_rows("stock", rep)}
    assert rows["build"].status == "OK" and "vllm 0.0.1" in rows["build"].saw
    assert rows["build.integrity"].status == "OK"
    assert f"{rep.files_total} of {rep.files_total} files match" in rows["build.integrity"].saw


def test_build_tampered_venv_names_changed_missing_and_untracked(venv, tmp_path):
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "vllm/core.py").write_text("def run():\n    return 2  # patched\n")
    (site / "vllm/kernels/attn.py").unlink()
    (site / "vllm/kernels/extra_patch.py").write_text("Y = 1\n")
    (site / "vllm/__pycache__").mkdir(exist_ok=True)
    (site / "vllm/__pycache__/core.cpython-311.pyc").write_bytes(b"\0")  # bytecode is not "untracked"
    rep = verify_build(vllm_cfg(tmp_path, venv / "bin/python").deck.builds["stock"], "stock")
    assert rep.changed == ["vllm/core.py"] and rep.missing == ["vllm/kernels/attn.py"]
    assert rep.untracked == ["vllm/kernels/extra_patch.py"]
    assert rep.files_matched == rep.files_total - 2 and not rep.intact
    row = {r.check: r for r in build_rows("stock", rep)}["build.integrity"]
    assert row.status == "WARN" and "changed: vllm/core.py" in row.saw and "1 untracked" in row.saw
    assert "verify-build stock" in row.action


def test_verify_build_keeps_its_last_verdict_for_the_page(venv, tmp_path, monkeypatch):
    """`servedeck verify-build` writes its verdict under $SERVEDECK_HOME (doctor/verified.py), replacing
    the one before whole: the page reads when a build was last checked and what was found."""
    from typer.testing import CliRunner

    from servedeck.cli import root_app as app
    from servedeck.doctor.verified import last_verification, verified_file

    cfg = vllm_cfg(tmp_path, venv / "bin/python", extra_build=f'requires = ["{venv}/bin/python"]')
    monkeypatch.setenv("SERVEDECK_CONFIG", str(cfg.path))
    assert last_verification("stock") is None
    r = CliRunner().invoke(app, ["verify-build", "stock"])
    assert r.exit_code == 0, r.output
    first = last_verification("stock")
    assert first["verdict"] == "intact" and first["engine_version"] == "0.0.1" and first["at"]
    assert first["files_matched"] == first["files_total"] >= 5 and first["changed"] == {"count": 0, "first": []}
    assert first["requires"] == [{"path": f"{venv}/bin/python", "ok": True, "saw": first["requires"][0]["saw"]}]
    site = next(venv.glob("lib/python3*/site-packages"))
    (site / "vllm/core.py").write_text("def run():\n    return 2  # patched\n")
    r = CliRunner().invoke(app, ["verify-build", "stock", "--json"])
    assert r.exit_code == 1
    second = last_verification("stock")
    assert second["verdict"] == "changed" and second["changed"] == {"count": 1, "first": ["vllm/core.py"]}
    assert second["files_matched"] == second["files_total"] - 1
    assert [p.name for p in verified_file("stock").parent.iterdir()] == ["verified.json"]  # no temp file left


def test_build_missing_and_requires(tmp_path, venv):
    target = tmp_path / "lib"
    target.mkdir()
    (tmp_path / "lib64").symlink_to("lib")
    (tmp_path / "dangling.so").symlink_to("libcudart.so.13")
    cfg = vllm_cfg(tmp_path, venv / "bin/python",
                   extra_build=f'requires = ["{tmp_path}/lib64", "{tmp_path}/dangling.so", "{tmp_path}/nope"]')
    rep = verify_build(cfg.deck.builds["stock"], "stock", cfg, integrity=False)
    req = {r.path.rsplit("/", 1)[1]: r for r in rep.requires}
    assert req["lib64"].ok and "resolves" in req["lib64"].saw
    assert not req["dangling.so"].ok and "dangling symlink -> libcudart.so.13" in req["dangling.so"].saw
    assert not req["nope"].ok and req["nope"].saw == "missing"
    rows = {r.check: r for r in build_rows("stock", rep)}
    assert rows["build.requires"].status == "FAIL" and rows["build.integrity"].status == "SKIP"
    gone = verify_build(vllm_cfg(tmp_path, tmp_path / "no/bin/python").deck.builds["stock"], "stock")
    assert not gone.exists and build_rows("stock", gone)[0].status == "FAIL"


def test_binary_build_version(tmp_path):
    exe = tmp_path / "llama-server"
    exe.write_text("#!/bin/sh\necho 'version: 11434 (abc1234)' >&2\necho 'built with cc' >&2\n")
    exe.chmod(0o755)
    cfg = config(tmp_path, f'[builds.cpp]\nengine = "llamacpp"\nbinary = "{exe}"\n')
    rep = verify_build(cfg.deck.builds["cpp"], "cpp", cfg)
    assert rep.engine_version == "11434 (abc1234)" and not rep.integrity_checked
    rows = build_rows("cpp", rep)
    assert rows[0].status == "OK" and rows[1].status == "SKIP" and "no package RECORD" in rows[1].saw


# ---------------------------------------------------------------- weights: HF cache layouts
def make_repo(cache: Path, repo_id: str, snapshots: dict[str, dict[str, bytes]], refs: dict[str, str]) -> Path:
    """The hub cache layout: blobs by hash, snapshots/<commit>/<file> -> ../../blobs/<hash>, refs/<name>."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    for commit, files in snapshots.items():
        for name, data in files.items():
            h = hashlib.sha256(data).hexdigest()
            (repo / "blobs" / h).write_bytes(data)
            link = repo / "snapshots" / commit / name
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(os.path.relpath(repo / "blobs" / h, link.parent))
    for ref, commit in refs.items():
        (repo / "refs" / ref).write_text(commit)
    return repo


GOOD = "319f741c" + "0" * 32
EMPTY = "58e2c08a" + "0" * 32
CONFIG = json.dumps({"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 64,
                     "num_attention_heads": 4}).encode()
WEIGHTS = {"config.json": CONFIG, "model-00001-of-00002.safetensors": b"a" * 1000,
           "model-00002-of-00002.safetensors": b"b" * 500,
           "model.safetensors.index.json": json.dumps({"weight_map": {
               "x": "model-00001-of-00002.safetensors", "y": "model-00002-of-00002.safetensors"}}).encode()}
REPO_ID = "RadixArk/Qwen3.8-27B-NVFP4"


def test_hf_ref_points_at_weights_with_an_empty_sibling(tmp_path):
    make_repo(tmp_path / "hub", REPO_ID, {GOOD: WEIGHTS, EMPTY: {"config.json": CONFIG}}, {"main": GOOD})
    r = check_hf(REPO_ID, {"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert r.status == "OK", r.saw
    assert r.saw.startswith("refs/main -> 319f741c: 4 files, 2 weight files")
    assert "sibling snapshot(s) without weights: 58e2c08a" in r.saw and "harmless while refs/main" in r.action
    assert r.data["weights_bytes"] == 1500


def test_hf_ref_moved_to_the_snapshot_without_weights(tmp_path):
    make_repo(tmp_path / "hub", REPO_ID, {GOOD: WEIGHTS, EMPTY: {"config.json": CONFIG}}, {"main": EMPTY})
    r = check_hf(REPO_ID, {"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert r.status == "FAIL" and "refs/main -> 58e2c08a holds no weight files" in r.saw
    assert "319f741c holds weights" in r.action


def test_hf_missing_repo_shard_and_incomplete(tmp_path):
    hub = tmp_path / "hub"
    make_repo(hub, "other/model", {GOOD: WEIGHTS}, {"main": GOOD})
    assert "is not in the HF cache" in check_hf(REPO_ID, {"HF_HUB_CACHE": str(hub)}).saw
    assert check_hf(REPO_ID, {"HF_HUB_CACHE": str(tmp_path / "none")}).status == "FAIL"
    partial = dict(WEIGHTS)
    del partial["model-00002-of-00002.safetensors"]
    make_repo(hub, REPO_ID, {GOOD: partial}, {"main": GOOD})
    r = check_hf(REPO_ID, {"HF_HUB_CACHE": str(hub)})
    assert r.status == "FAIL" and "lacks 1 shard" in r.saw
    repo = make_repo(hub, "a/b", {GOOD: WEIGHTS}, {"main": GOOD})
    (repo / "blobs" / "deadbeef.incomplete").write_bytes(b"x")
    assert check_hf("a/b", {"HF_HUB_CACHE": str(hub)}).status == "WARN"
    assert "no refs/dev" in check_hf("a/b", {"HF_HUB_CACHE": str(hub)}, revision="dev").saw


def test_weights_row_uses_the_builds_hf_home(tmp_path, venv):
    make_repo(tmp_path / "hfhome/hub", REPO_ID, {GOOD: WEIGHTS}, {"main": GOOD})
    cfg = vllm_cfg(tmp_path, venv / "bin/python", source=REPO_ID,
                   extra_build=f'env = {{ HF_HOME = "{tmp_path}/hfhome" }}')
    assert check_weights(cfg, "qwen").status == "OK"


def test_local_dir_and_gguf(tmp_path):
    d = tmp_path / "m"
    d.mkdir()
    assert check_local(d).status == "FAIL"  # no weights
    (d / "model.safetensors").write_bytes(b"x" * 10)
    assert "no config.json" in check_local(d).saw
    (d / "config.json").write_text("{")
    assert check_local(d).status == "FAIL"
    (d / "config.json").write_text("{}")
    assert check_local(d).status == "OK"
    assert check_local(tmp_path / "absent").status == "FAIL"
    g = write_gguf(tmp_path / "x.gguf", "llama", {"llama.block_count": 30})
    r = check_local(g)
    assert r.status == "OK" and "GGUF v3 llama" in r.saw and "30 layers" in r.saw
    bad = write_gguf(tmp_path / "t.gguf", "llama", {"llama.block_count": 30}, truncate_at=200)
    assert check_local(bad).status == "FAIL" and "header unreadable" in check_local(bad).saw
    (tmp_path / "n.gguf").write_bytes(b"not a gguf")
    assert "no GGUF magic" in check_local(tmp_path / "n.gguf").saw


# ---------------------------------------------------------------- port
LISTEN = "import socket, sys, time; s = socket.socket(); s.bind(('127.0.0.1', int(sys.argv[1]))); s.listen(); print('up', flush=True); time.sleep(60)"


@pytest.fixture
def listener():
    procs = []

    def start(port: int) -> subprocess.Popen:
        p = subprocess.Popen([sys.executable, "-c", LISTEN, str(port)], stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
        assert p.stdout.readline().strip() == "up"
        procs.append(p)
        return p

    yield start
    for p in procs:
        p.kill()
        p.wait()


def live(model: str, pid: int) -> dict:
    import psutil

    rec = {"model": model, "pid": pid, "pgid": os.getpgid(pid), "create_time": psutil.Process(pid).create_time()}
    (paths.live_dir() / f"{model}.json").write_text(json.dumps(rec))
    return rec


def test_port_free_own_other_model_and_stranger(tmp_path, listener):
    cfg = vllm_cfg(tmp_path, Path("/x/bin/python"))
    port = cfg.models["qwen"].port
    assert check_port(cfg, "qwen", []).status == "OK"
    p = listener(port)
    r = check_port(cfg, "qwen", [])
    assert r.status == "FAIL" and f"(pid {p.pid}" in r.saw and "python" in r.saw
    assert check_port(cfg, "qwen", [live("qwen", p.pid)]).status == "OK"
    r = check_port(cfg, "qwen", [live("gemma", p.pid)])
    assert r.status == "FAIL" and f"servedeck model gemma (pid {p.pid})" in r.saw


# ---------------------------------------------------------------- GPU memory
def h200(*procs, limit=700.0):
    used = sum(u for _, u in procs)
    return Inventory(True, (Gpu(0, "NVIDIA H200", "GPU-0", "0000:01:00.0", 141 * GiB, used, 141 * GiB - used,
                                power_w=100.0, power_limit_w=limit, processes=tuple(GpuProcess(p, u) for p, u in procs)),))


def test_gpu_row_skip_fail_ok(tmp_path):
    cfg = vllm_cfg(tmp_path, Path("/x/bin/python"))
    none = Inventory(False, reason="no NVIDIA driver here (NVML: NVML Shared Library Not Found)")
    assert check_gpu(cfg, "qwen", none, []).status == "SKIP"
    inv = h200((4242, int(93.5 * GiB)))
    r = check_gpu(cfg, "qwen", inv, attribute(inv, {4242: "gemma"}))
    assert r.status == "FAIL" and "gemma on GPU 0 holds 93.5 GiB" in r.saw and "47.5 GiB is free" in r.saw
    assert "start qwen --evict gemma" in r.action  # gemma is not of qwen's slot: switch would not stop it
    assert check_gpu(cfg, "qwen", h200(), []).status == "OK"
    inv = h200((7, 100 * GiB))
    assert "qwen is running" in check_gpu(cfg, "qwen", inv, attribute(inv, {7: "qwen"})).saw


def test_gpu_row_on_this_host_is_skip_not_ok(tmp_path):
    from servedeck.gpu.nvml import inventory

    inv = inventory()
    if inv.available:
        pytest.skip("this host has a GPU")
    assert check_gpu(vllm_cfg(tmp_path, Path("/x/bin/python")), "qwen", inv, []).status == "SKIP"


# ---------------------------------------------------------------- host RAM and power
def test_host_ram(tmp_path):
    cfg = vllm_cfg(tmp_path, Path("/x/bin/python"))
    assert check_host_ram("qwen", cfg.models["qwen"]).status == "SKIP"
    cfg = vllm_cfg(tmp_path, Path("/x/bin/python"), extra_model="host_ram_gib = 1")
    assert check_host_ram("qwen", cfg.models["qwen"]).status == "OK"
    cfg = vllm_cfg(tmp_path, Path("/x/bin/python"), extra_model="host_ram_gib = 100000")
    r = check_host_ram("qwen", cfg.models["qwen"])
    assert r.status == "FAIL" and "needs 100000 GiB" in r.saw


def test_power_rows(tmp_path):
    from servedeck.config.schema import Host

    policy = Host(power_min_w=400, power_max_w=485)
    assert check_power(policy, Inventory(False, reason="no driver")).status == "SKIP"
    assert check_power(Host(), h200()).status == "SKIP"  # no policy to judge against
    assert check_power(policy, h200(limit=450)).status == "OK"
    over = check_power(policy, h200(limit=600))
    assert over.status == "FAIL" and "600 W > power_max_w 485 W" in over.saw
    under = check_power(policy, h200(limit=375))  # the seed's 375 W cap under a 485 W plan
    assert under.status == "WARN" and "375 W < power_min_w 400 W" in under.saw


# ---------------------------------------------------------------- the whole doctor, here
def test_run_doctor_here(tmp_path, venv):
    g = write_gguf(tmp_path / "m.gguf", "llama", {"llama.block_count": 2, "llama.embedding_length": 64,
                                                  "llama.attention.head_count": 4, "llama.context_length": 512})
    cfg = vllm_cfg(tmp_path, venv / "bin/python", source=str(g))
    rows = run_doctor(lambda: cfg, "qwen", inv=Inventory(False, reason="no NVIDIA driver here"),
                      klog=KernelLog(False, "journalctl -k, dmesg", "dmesg: Operation not permitted"))
    got = {(r.check, r.subject): r.status for r in rows}
    assert got == {("config", ""): "OK", ("build", "stock"): "OK", ("build.integrity", "stock"): "OK",
                   ("weights", "qwen"): "OK", ("port", "qwen"): "OK", ("gpu", "qwen"): "SKIP",
                   ("host-ram", "qwen"): "SKIP", ("power", ""): "SKIP", ("kernel", ""): "SKIP"}
    assert all(r.saw for r in rows)
