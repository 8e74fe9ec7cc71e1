"""Issue 36 item 8: the results disk fills in the middle of a bench. It used to end in a traceback and exit
1 (docs promise exit 7 with error:/hint:), the last line of requests.jsonl cut in half, server.log 0
bytes, and `runs` blaming "servedeck stopped before finishing". Now the run says "disk full" in its
state, requests.jsonl keeps whole lines only, and `runs` and `show` read the folder.

The results live on an 8 MiB tmpfs of the test's own (tests/fulldisk.py), filled at once when the bench
has written its tenth request; the bench runs on the campaign tests' shared llama-server."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from servedeck.fsio import read_jsonl

sys.path.insert(0, str(Path(__file__).parent.parent))
from fulldisk import small_disk  # noqa: E402

SERVEDECK = str(Path(sys.executable).with_name("servedeck"))

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]


def test_a_bench_whose_results_disk_fills_says_disk_full_and_keeps_whole_lines(campaign_config, llama, tmp_path,
                                                                              monkeypatch):
    with small_disk(tmp_path / "results", mib=8) as disk:
        monkeypatch.setenv("SERVEDECK_RESULTS", str(disk.path))
        filled = threading.Event()

        def fill_mid_bench() -> None:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                for f in disk.path.glob("runs/*/requests.jsonl"):
                    if f.read_bytes().count(b"\n") >= 10:
                        disk.fill()
                        filled.set()
                        return
                time.sleep(0.02)

        t = threading.Thread(target=fill_mid_bench, daemon=True)
        t.start()
        cli = [SERVEDECK, "--config", str(campaign_config.path)]
        r = subprocess.run([*cli, "bench", "smollm2", "--no-gate", "--concurrency", "2", "--requests", "400",
                            "--input-tokens", "64", "--output-tokens", "8"], capture_output=True, text=True, timeout=600)
        t.join(5)
        assert filled.is_set(), (r.stdout, r.stderr)
        assert r.returncode == 7, (r.returncode, r.stdout[-2000:], r.stderr[-3000:])
        assert "Traceback" not in r.stderr, r.stderr
        assert "error: disk full" in r.stderr and "hint:" in r.stderr and "free" in r.stderr, r.stderr

        [run] = list(disk.path.glob("runs/*"))
        summary = json.loads((run / "summary.json").read_text())
        assert summary["status"] == "failed" and summary["reason"].startswith("disk full"), summary["reason"]
        assert summary["disk_full"]["path"].startswith(str(run))
        lines = read_jsonl(run / "requests.jsonl")
        assert len(lines) >= 10 and lines.torn == 0 and lines.skipped == 0  # whole lines only
        assert (run / "requests.jsonl").read_bytes().endswith(b"\n")
        log = run / "server.log"
        assert not log.exists() or log.read_bytes().endswith(b"\n")  # absent or whole lines, never 0 bytes
        assert "server_log_error" in summary
        assert not (run / ".reserve").exists()  # the room kept for the closing summary was used

        # the folder reads back while the disk is still full
        runs = subprocess.run([*cli, "runs"], capture_output=True, text=True, timeout=120)
        assert runs.returncode == 0 and "disk full" in runs.stdout, (runs.stdout, runs.stderr)
        assert "stopped before finishing" not in runs.stdout
        show = subprocess.run([*cli, "show", run.name, "--json"], capture_output=True, text=True, timeout=120)
        assert show.returncode == 0, show.stderr
        view = json.loads(show.stdout)
        assert view["status"] == "failed" and "disk full" in view["reason"]
        assert view["requests"]["lines"] == len(lines) and not view["requests"]["torn_last_line"]


def test_a_bench_into_a_disk_with_no_room_is_refused_before_it_begins(campaign_config, llama, tmp_path, monkeypatch):
    """Less room than the run folder keeps for its closing summary: refused at once, nothing left behind."""
    with small_disk(tmp_path / "results", mib=8) as disk:
        monkeypatch.setenv("SERVEDECK_RESULTS", str(disk.path))
        disk.path.joinpath("runs").mkdir()
        disk.fill(leave=200_000)
        r = subprocess.run([SERVEDECK, "--config", str(campaign_config.path), "bench", "smollm2", "--no-gate",
                            "--concurrency", "1", "--requests", "2", "--input-tokens", "64", "--output-tokens", "8"],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 7, (r.stdout, r.stderr)
        assert "error: disk full" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert list(disk.path.glob("runs/*")) == []
