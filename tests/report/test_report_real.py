"""Reports and comparisons on real run folders (tiny llama.cpp benches made in conftest.py)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from servedeck.loadgen.records import RequestRecord
from servedeck.loadgen.stats import tpot
from servedeck.report.build import write
from servedeck.report.collect import collect, from_runs
from servedeck.report.compare import compare
from servedeck.report.pareto import pareto
from servedeck.report.stats import NOISE

from reportkit import CHROME_MARK, SEED, chromium_processes

# the first test also waits for the module's five launches (about two minutes on a quiet 2-core machine)
pytestmark = [pytest.mark.engine, pytest.mark.llamacpp, pytest.mark.timeout(2400)]

SERVEDECK = [sys.executable, "-m", "servedeck"]


def _cli(args: list[str], results: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SERVEDECK_RESULTS": str(results)}
    return subprocess.run(SERVEDECK + args, capture_output=True, text=True, env=env, timeout=300)


def test_same_seed_sends_the_same_prompts_and_records_them(real_runs):
    a = json.loads((real_runs.a1 / "summary.json").read_text())
    assert a["prompt_seed"] == SEED
    digests = []
    for run in (real_runs.a1, real_runs.b):
        lines = [json.loads(x) for x in (run / "requests.jsonl").read_text().splitlines()]
        digests.append({(x["point"], x["prompt_index"]): x["prompt_digest"] for x in lines if x["kind"] == "measured"})
    assert digests[0] == digests[1] and len(digests[0]) == 12
    # distinct between the two points of one run: no point replays another's prompts
    assert not {d for (p, _), d in digests[0].items() if p == 0} & {d for (p, _), d in digests[0].items() if p == 1}


def test_compare_of_one_changed_flag_names_exactly_that_flag(real_runs):
    r = _cli(["compare", str(real_runs.a1), str(real_runs.b), "--json"], real_runs.results)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["config_changes"] == ["flag --threads"]
    assert [c for c in doc["changes"] if c["knob"] == "flag --threads"] == [{"knob": "flag --threads", "a": "1", "b": "2"}]
    assert doc["attribution"].startswith("one knob changed (flag --threads)")
    assert [p["label"] for p in doc["points"]] == ["c=1", "c=2"]
    for p in doc["points"]:
        assert p["paired"] and p["pairing"].startswith("paired: 6 request pairs")
        assert [v["figure"] for v in p["verdicts"]] == ["TTFT p50", "TPOT p50", "E2E p50", "output tok/s per host"]
        assert p["verdicts"][-1]["method"] == "none"  # one launch per side: no throughput interval
    text = _cli(["compare", str(real_runs.a1), str(real_runs.b)], real_runs.results).stdout
    assert "flag --threads: 1 → 2" in text and "One knob changed" in text


def test_compare_of_a_run_with_itself_finds_nothing_and_a_repeat_is_judged_consistently(real_runs):
    # the same folder on both sides: every pair is identical, so every paired change is exactly zero
    same = compare(from_runs([real_runs.a1]).runs, from_runs([real_runs.a1]).runs)
    assert same.config_changes == [] and same.attribution.startswith("same configuration")
    same_paired = [v for p in same.points for v in p.verdicts if v.method == "paired"]
    assert len(same_paired) == 6  # TTFT, TPOT, E2E at c=1 and c=2
    for v in same_paired:
        assert v.change == 0.0 and not v.distinguishable and "no difference distinguishable" in v.text
    # a real repeat on a shared 2-core machine may or may not differ (CI saw TPOT 25 % slower once):
    # what must hold is that each verdict says what its own interval says
    c = compare(from_runs([real_runs.a1]).runs, from_runs([real_runs.a2]).runs)
    assert c.config_changes == [] and c.attribution.startswith("same configuration")
    assert all(p.paired for p in c.points)
    print("\n".join(f"{p.label} {v.figure}: {v.text}" for p in c.points for v in p.verdicts))
    repeat_paired = [v for p in c.points for v in p.verdicts if v.method == "paired"]
    assert len(repeat_paired) == 6
    for v in repeat_paired:
        excludes_zero = not (v.low <= 0.0 <= v.high)
        assert v.distinguishable == (excludes_zero and abs(v.change) >= NOISE), v.text
        assert ("no difference distinguishable" in v.text) == (not v.distinguishable), v.text


def test_a_gate_failed_point_is_hollow_and_off_the_frontier(real_runs):
    coll = from_runs([real_runs.a1, real_runs.a2, real_runs.b, real_runs.rope])
    rows = pareto(coll)
    rope = [r for r in rows if "rope" in r.point.variant]
    assert rope and all("gate failed" in r.why_not and not r.on_frontier for r in rope)
    assert any(r.on_frontier for r in rows) and all(r.eligible for r in rows if r.on_frontier)
    # every number traced to the files: x = 1000 / TPOT p50 of requests.jsonl, y = output tok/s (CPU: per host)
    row = next(r for r in rows if r.point.variant == coll.runs[0].variant and r.point.label == "c=1")
    xs = []
    for run in (real_runs.a1, real_runs.a2):
        recs = [RequestRecord.from_json({k: v for k, v in json.loads(x).items() if k != "point"})
                for x in (run / "requests.jsonl").read_text().splitlines() if json.loads(x)["point"] == 0]
        xs.append(1.0 / float(np.median([tpot(r) for r in recs if r.kind == "measured"])))
    assert row.x == pytest.approx(np.mean(xs), rel=1e-9) and row.per == "host"


def _links(md: str) -> list[str]:
    return re.findall(r"\]\(([^)#][^)]*)\)", md)


def test_report_of_runs_has_every_section_and_links_its_sources(real_runs, tmp_path):
    runs = [real_runs.a1, real_runs.a2, real_runs.b, real_runs.rope, real_runs.long]
    r = _cli(["report", *map(str, runs), "--out", str(tmp_path), "--json"], real_runs.results)
    assert r.returncode == 0, r.stderr
    md = (tmp_path / "report.md").read_text()
    for title in ("What was measured", "The gate", "Throughput against latency (Pareto)", "TTFT and TPOT against load",
                  "Long prompts", "Repeats", "One knob at a time", "Sources"):
        assert f"## {title}" in md, title
    assert "hollow: gate failed" in md and "on the frontier" in md
    assert "| flag --threads | 1 | 2 | 1 |" in md
    links = _links(md)
    assert links and all((tmp_path / x).resolve().exists() for x in links)
    for run in runs:
        assert f"[{run.name}]" in md
    html = (tmp_path / "report.html").read_text()
    # self-contained: inline figures, nothing fetched (XML namespace URIs in the SVGs are names, not fetches)
    assert html.count("<svg") >= 3 and "<script" not in html and "<link" not in html and "@import" not in html
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)


def _campaign(real_runs, tmp_path) -> Path:
    """campaign.json per the shared contract (campaign-contract.md), pointing at the real run folders; the
    campaign runner (issue 9) writes the same shape."""
    folder = real_runs.results / "campaigns" / "threads__1130-120000"
    folder.mkdir(parents=True, exist_ok=True)
    name = lambda p: p.name  # noqa: E731
    cells = [
        {"id": "base#1", "variant": "base", "repeat": 1, "state": "done", "runs": [name(real_runs.a1)]},
        {"id": "base#2", "variant": "base", "repeat": 2, "state": "done", "runs": [name(real_runs.a2)]},
        {"id": "two-threads#1", "variant": "two-threads", "repeat": 1, "state": "done", "runs": [name(real_runs.b)]},
        {"id": "rope#1", "variant": "rope", "repeat": 1, "state": "done", "runs": [name(real_runs.rope)]},
        {"id": "big-batch#1", "variant": "big-batch", "repeat": 1, "state": "failed", "runs": [],
         "reason": "llama-server exited during start-up (exit code 1)", "signature": "bad-flag"},
    ]
    for c in cells:
        c.setdefault("reason", None)
        c.setdefault("signature", None)
        c.update(started=None, ended=None, node=None)
    doc = {"schema": 1, "name": "threads", "file": "campaign.toml", "model": "smollm2", "started": "2026-11-30T12:00:00",
           "updated": "2026-11-30T12:10:00", "host": "here",
           "variants": {"base": {"overrides": {}, "replicas": 1, "knobs": {}},
                        "two-threads": {"overrides": {"args": {"threads": 2}}, "replicas": 1, "knobs": {"args.threads": 2}},
                        "rope": {"overrides": {"args": {"rope-freq-base": 10}}, "replicas": 1,
                                 "knobs": {"args.rope-freq-base": 10}},
                        "big-batch": {"overrides": {"args": {"batch-size": -5}}, "replicas": 1,
                                      "knobs": {"args.batch-size": -5}}},
           "base_variant": "base", "reference": None, "cells": cells}
    (folder / "campaign.json").write_text(json.dumps(doc))
    (folder / "campaign.toml").write_text("# frozen copy\n")
    return folder


def test_report_of_a_campaign_folder(real_runs, tmp_path):
    folder = _campaign(real_runs, tmp_path)
    coll = collect([folder])
    assert list(coll.variants()) == ["base", "two-threads", "rope"] and coll.base_variant == "base"
    md_path, html_path = write(coll, folder)
    md = md_path.read_text()
    assert "## Repeats" in md and "## Failures" in md and "cell big-batch#1" in md and "bad-flag" in md
    # attribution: one knob per variant against the base, with an effect per figure and point
    # by the campaign's own knob (campaign.json args.threads), its base value from the base's models.toml entry
    assert "| args.threads: 1 → 2 | two-threads | chat c=1 | TTFT p50 |" in md
    assert "flag --rope-freq-base: (absent) → 10" in md
    r = _cli(["compare", "base", "two-threads", "--campaign", str(folder), "--json"], real_runs.results)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["a"] == [real_runs.a1.name, real_runs.a2.name] and doc["config_changes"] == ["flag --threads"]
    # repeat 1 of each side pairs up (B has one repeat): 6 requests with the same prompts
    assert doc["points"][0]["pairing"].startswith("paired: 6 request pairs")
    assert doc["points"][0]["verdicts"][-1]["method"] == "none"  # B has one repeat only
    bad = _cli(["compare", "base", "nope", "--campaign", str(folder)], real_runs.results)
    assert bad.returncode != 0 and "variant 'nope'" in bad.stderr and "Traceback" not in bad.stderr


def _colour_box(png: Path, rgb: tuple[int, int, int], tol: int = 40) -> tuple[int, tuple[int, int, int, int] | None]:
    a = np.asarray(Image.open(png).convert("RGB")).astype(int)
    mask = (np.abs(a - np.array(rgb)).sum(axis=2) < tol)
    if not mask.any():
        return 0, None
    ys, xs = np.nonzero(mask)
    return int(mask.sum()), (int(xs.min()), int(ys.min()), int(xs.max()), int(ys.max()))


def _screenshot(html: Path, png: Path, tmp: Path) -> None:
    exe = shutil.which("chromium")
    assert exe, "Debian's chromium is not installed (scripts/setup.sh installs it)"
    profile = tmp / f"{CHROME_MARK}-{os.getpid()}"
    proc = subprocess.Popen([exe, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                             f"--user-data-dir={profile}", "--window-size=1200,4000", f"--screenshot={png}",
                             html.as_uri()], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        proc.wait(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its helpers share the group
        except ProcessLookupError:
            pass
        proc.wait()
    assert not [p for p in chromium_processes() if str(profile) in " ".join(p.cmdline())]


def test_report_html_shows_its_plots_in_headless_chromium(real_runs, tmp_path):
    folder = _campaign(real_runs, tmp_path)
    _, html = write(collect([folder]), tmp_path / "out")
    png = tmp_path / "report.png"
    _screenshot(html, png, tmp_path)
    keep = os.environ.get("SERVEDECK_REPORT_KEEP")
    if keep:
        shutil.copy(png, Path(keep) / "report.png")
    # matplotlib's first two colours draw the variants' curves; nothing else on the page uses them
    for rgb in ((31, 119, 180), (255, 127, 14)):
        n, box = _colour_box(png, rgb)
        assert n > 200 and box is not None and box[2] - box[0] > 150 and box[3] - box[1] > 80, (rgb, n, box)
    # the same page without its figures has none of those pixels: the check can fail
    bare = tmp_path / "bare.html"
    bare.write_text(re.sub(r"<svg.*?</svg>", "", html.read_text(), flags=re.S))
    _screenshot(bare, tmp_path / "bare.png", tmp_path)
    assert _colour_box(tmp_path / "bare.png", (31, 119, 180))[0] < 50
