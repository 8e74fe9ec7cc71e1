"""A two-variant campaign with a capacity workload on real llama.cpp (SmolLM2 with --parallel 1 and 4):
`campaign run` searches each variant under the SLO, and the recommendation table names the variant that
carries the most load, in campaign.md, in `campaign status --json` and in the report's HTML as Chromium
renders it.

The SLO is one every load meets on this server (no failed request, TTFT p50 within 10 minutes), so each
search stops at its cap, the engine's slots: 1 and 4. That is what makes the recommendation certain
before the run: parallel=4 carries four times the load. Answers of 32 tokens keep the client's self-check
(schedule lag p99 within 1 % of E2E, at least 5 ms) from calling a point client-bound on a busy 2-core box,
as 4-token answers did (lag 5.3 ms > 5 ms)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from servedeck.init import render_starter
from ports import free_port

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

SERVEDECK = [sys.executable, "-m", "servedeck"]
CHROME_MARK = "servedeck-capacity-test-chromium"

CAMPAIGN = """
[campaign]
name = "cap"
model = "smollm2"
cell_timeout = "10m"
gate = false

[matrix]
"args.parallel" = [1, 4]

[slo.interactive]
ttft_p50 = "10m"
error_rate = "0%"

[[workloads]]
kind = "capacity"
find = "max-concurrency"
slo = ["interactive"]
input_tokens = 64
output_tokens = 32
requests = 4
warmup = 1
"""


def _cli(args: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(SERVEDECK + args, capture_output=True, text=True, env=env, timeout=900)


@pytest.fixture(scope="module")
def campaign(tmp_path_factory, engines_ready):
    tmp = tmp_path_factory.mktemp("capacity-campaign")
    text = render_starter()
    for old in ("8081", "8091", "8082"):
        text = text.replace(f"port = {old}", f"port = {free_port()}")
    (tmp / "models.toml").write_text(text)
    (tmp / "cap.toml").write_text(CAMPAIGN)
    env = {**os.environ, "SERVEDECK_HOME": str(tmp / "home"), "SERVEDECK_RESULTS": str(tmp / "results"),
           "SERVEDECK_CONFIG": str(tmp / "models.toml")}
    r = _cli(["campaign", "run", str(tmp / "cap.toml")], env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    folder = next((tmp / "results" / "campaigns").iterdir())
    return tmp, env, folder


def test_each_variant_is_searched_up_to_its_slots(campaign):
    _, env, folder = campaign
    view = json.loads(_cli(["campaign", "status", str(folder), "--json"], env).stdout)
    got = {r["variant"]: (r["capacity"], r["verdicts"]) for r in view["capacity"]}
    assert got == {"parallel=1": (1, ["capped"]), "parallel=4": (4, ["capped"])}


def test_campaign_md_carries_the_recommendation(campaign):
    _, _, folder = campaign
    md = (folder / "campaign.md").read_text()
    rec = md[md.index("### Recommendation"):]
    assert re.search(r"\| interactive \(`ttft_p50<=600s,error_rate<=0%`\) \| \*\*parallel=4\*\* \| c=4 per launch \(CPU\), "
                     r"\+300% over parallel=1 \(c=1\) \|", rec), rec


def _dom(html: Path, tmp: Path) -> str:
    """The page as headless Chromium built it (--dump-dom), its process group stopped afterwards."""
    exe = shutil.which("chromium")
    assert exe, "Debian's chromium is not installed (scripts/setup.sh installs it)"
    profile = tmp / f"{CHROME_MARK}-{os.getpid()}"
    proc = subprocess.Popen([exe, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}",
                             "--dump-dom", html.as_uri()], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                            start_new_session=True, text=True)
    try:
        out, _ = proc.communicate(timeout=120)
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # its helpers share the group
        except ProcessLookupError:
            pass
        proc.wait()
    return out


def test_the_report_html_shows_the_recommendation_in_chromium(campaign, tmp_path):
    _, env, folder = campaign
    r = _cli(["report", str(folder), "--out", str(tmp_path / "report")], env)
    assert r.returncode == 0, r.stderr
    dom = _dom(tmp_path / "report" / "report.html", tmp_path)
    rows = re.findall(r"<tr>(.*?)</tr>", dom, re.S)
    cells = [re.sub(r"<[^>]+>", "", c).strip() for row in rows for c in [row]]
    rec = [c for c in cells if "run this variant" not in c and "parallel=4" in c and "over parallel=1" in c]
    assert len(rec) == 1, cells
    assert "c=4 per launch (CPU), +300% over parallel=1 (c=1)" in rec[0]


def test_compare_compares_the_capacities(campaign):
    _, env, folder = campaign
    r = _cli(["compare", "parallel=1", "parallel=4", "--campaign", str(folder), "--json"], env)
    assert r.returncode == 0, r.stderr
    cap = json.loads(r.stdout)["capacity"]
    assert [(c["a"], c["b"], c["change"]) for c in cap] == [(1, 4, 3.0)]
    text = _cli(["compare", "parallel=1", "parallel=4", "--campaign", str(folder)], env).stdout
    assert "capacity (max-concurrency under interactive (ttft_p50<=600s,error_rate<=0%)): A c=1, B c=4: " \
           "B carries +300%" in text


def test_the_pareto_plot_marks_each_capacity_point(campaign, tmp_path):
    _, env, folder = campaign
    r = _cli(["report", str(folder), "--out", str(tmp_path / "report")], env)
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "report" / "report.html").read_text()
    pareto = page[page.index('id="pareto"'):]
    assert "<!-- capacity under an SLO -->" in pareto[:pareto.index("</svg>")]
