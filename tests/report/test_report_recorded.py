"""The report read after a real GPU campaign, on that campaign's own run folders (no engine).

Input: docs/gpu-runs/campaign-h200-cache-ram-2026-12-01/, the campaign issue 20 reported on, run again on
one H200 with scripts/gpu-cache-ram-campaign.sh and kept whole: CUDA llama-server 11434, a random-weight
Llama-3-8B-shape f16 GGUF, variants default (32 slots of 4,096 tokens) / cache-ram0 (`--cache-ram 0`) /
p8 (`parallel = 8`, so `-c` follows), chat 256 in / 128 out at 1, 8 and 32 streams and one 3,000-token
prompt; the first cell began right after the CUDA build. The gate fails on random weights.
Each expected value is read here from the run folders' own files (requests.jsonl, summary.json), not
from the report code.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

import pytest
from matplotlib.lines import Line2D

from servedeck.report import plots
from servedeck.report.build import write
from servedeck.report.collect import from_campaign

RECORDED = Path(__file__).resolve().parents[2] / "docs/gpu-runs/campaign-h200-cache-ram-2026-12-01/results"
CAMPAIGN = "h200-cache-ram__1201-094752"
SERVEDECK = [sys.executable, "-m", "servedeck"]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """A copy of the recorded results tree: reports are written beside it, never into docs/."""
    dst = tmp_path_factory.mktemp("recorded") / "results"
    shutil.copytree(RECORDED, dst)
    return dst


@pytest.fixture(scope="module")
def folder(results) -> Path:
    return results / "campaigns" / CAMPAIGN


@pytest.fixture(scope="module")
def report_md(folder) -> str:
    md, _ = write(from_campaign(folder), folder)
    return md.read_text()


def _section(md: str, title: str) -> str:
    start = md.index(f"## {title}")
    end = md.find("\n## ", start + 1)
    return md[start:end if end > 0 else None]


def _rows(md: str, title: str) -> list[str]:
    return [ln for ln in _section(md, title).splitlines() if ln.startswith("| ") and not ln.startswith("| variant")
            and not ln.startswith("| knob") and not ln.startswith("| launch")]


def _summaries(results: Path) -> dict[str, dict]:
    return {p.name: json.loads((p / "summary.json").read_text()) for p in sorted((results / "runs").iterdir())}


def _cli(args: list[str], results: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "SERVEDECK_RESULTS": str(results)}
    return subprocess.run(SERVEDECK + args, capture_output=True, text=True, env=env, timeout=120)


# --- item 5: attribution by what the user changed ----------------------------------------------------

def test_one_campaign_knob_is_credited_and_the_flags_it_renders_are_its_consequences(report_md):
    att = _section(report_md, "One knob at a time: attribution")
    assert "p8: the campaign changed one knob, args.parallel: 32 → 8 (renders as flag -c: 131072 → 32768, " \
           "flag --parallel: 32 → 8)." in att


def test_the_one_knob_variant_gets_effects_at_every_load_point(report_md):
    rows = [r for r in _rows(report_md, "One knob at a time: attribution") if "| p8 " in r and "| TTFT p50 |" in r]
    assert [r.split(" | ")[2] for r in rows] == ["chat c=1", "chat c=8", "chat c=32", "long-prompt c=1"]


def test_compare_of_two_campaign_variants_names_the_campaign_knob(folder, results):
    r = _cli(["compare", "default", "p8", "--campaign", str(folder), "--json"], results)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["knobs"] == [{"knob": "args.parallel", "a": "32", "b": "8"}]


def test_compare_lists_the_rendered_flags_as_consequences(folder, results):
    doc = json.loads(_cli(["compare", "default", "p8", "--campaign", str(folder), "--json"], results).stdout)
    assert [c["knob"] for c in doc["consequences"]] == ["flag -c", "flag --parallel"]


def test_compare_credits_the_knob_in_words(folder, results):
    text = _cli(["compare", "default", "p8", "--campaign", str(folder)], results).stdout
    assert "One knob changed (args.parallel; it renders as flag -c: 131072 → 32768, flag --parallel: 32 → 8): " \
           "a difference can be credited to it." in text


def test_compare_keeps_two_chat_workloads_apart_and_pairs_each(folder, results):
    doc = json.loads(_cli(["compare", "default", "cache-ram0", "--campaign", str(folder), "--json"], results).stdout)
    assert [(p["label"], p["paired"]) for p in doc["points"]] == [("c=1", True), ("c=8", True), ("c=32", True)]


# --- item 13 --------------------------------------------------------------------------------------------

def _engine_prefill_p50(run: Path) -> float:
    rates = []
    for line in (run / "requests.jsonl").read_text().splitlines():
        d = json.loads(line)
        t = d.get("timings") or {}
        if d["kind"] == "measured" and t.get("prompt_ms"):
            rates.append(t["prompt_n"] / (t["prompt_ms"] / 1000))
    return statistics.median(rates)


def test_long_prompt_shows_the_engines_own_prefill_rate_beside_the_clients(report_md, results):
    run = results / "runs" / "r8b__default__4k__llamacpp__1201-094832"
    engine = _engine_prefill_p50(run)
    row = next(r for r in _rows(report_md, "Long prompts: prefill and TTFT against length") if r.startswith("| default "))
    assert f" {engine:,.0f} |" in row, (engine, row)


def test_long_prompt_shows_the_gap_between_client_ttft_and_engine_prompt_ms(report_md, results):
    gaps = []
    for line in (results / "runs" / "r8b__default__4k__llamacpp__1201-094832" / "requests.jsonl").read_text().splitlines():
        d = json.loads(line)
        if d["kind"] == "measured":
            gaps.append((d["t_first_token"] - d["t_send"]) * 1000 - d["timings"]["prompt_ms"])
    row = next(r for r in _rows(report_md, "Long prompts: prefill and TTFT against length") if r.startswith("| default "))
    assert f" {statistics.median(gaps):.0f} ms |" in row, row


def test_latency_table_shows_ttft_beyond_the_engines_prefill(report_md):
    head = next(ln for ln in _section(report_md, "TTFT and TPOT against load").splitlines() if ln.startswith("| variant"))
    assert "TTFT − engine prompt_ms p50" in head


@pytest.mark.parametrize("title", ["Throughput against latency (Pareto)", "TTFT and TPOT against load",
                                   "Long prompts: prefill and TTFT against length"])
def test_every_table_row_from_a_failed_gate_says_not_a_result(report_md, title):
    rows = _rows(report_md, title)
    assert rows and all("NOT A RESULT: gate failed" in r for r in rows), rows


def _figures(monkeypatch, folder) -> dict[str, object]:
    """The matplotlib figures the report draws, by name, caught before they become SVG."""
    caught: dict[str, object] = {}

    def keep(fig, salt):
        caught[salt] = fig
        return "<svg></svg>"

    monkeypatch.setattr(plots, "_svg", keep)
    write(from_campaign(folder), folder.parent.parent / "reports" / "figures")
    return caught


def test_every_plot_from_failed_gates_says_not_a_result_in_its_legend(monkeypatch, folder):
    figs = _figures(monkeypatch, folder)
    for name in ("latency-closed", "long-prompt"):
        texts = [t.get_text() for ax in figs[name].axes for t in ax.get_legend().get_texts()]
        assert texts and all("not a result" in t for t in texts), (name, texts)


def test_the_gpu_line_names_driver_memory_and_power_limit(report_md, results):
    g = next(iter(_summaries(results).values()))["gpus"]
    gpu = g["gpus"][0]
    row = next(r for r in _section(report_md, "What was measured, where, with what").splitlines()
               if r.startswith("| default | 4 |"))
    for fact in (g["driver_version"], f"{gpu['memory_total'] / 2**30:.1f} GiB", f"{gpu['power_limit_w']:.0f} W"):
        assert f"| {fact}" in row, (fact, row)


def test_every_warning_a_point_recorded_reaches_the_report(report_md, results):
    warnings = [w for s in _summaries(results).values() for p in s.get("points") or []
                for w in p["figures"]["warnings"]]
    assert warnings
    missing = [w for w in warnings if w.replace("|", "\\|") not in report_md]
    assert not missing, missing


def test_the_pareto_legend_shows_no_filled_marker_when_none_is_drawn(monkeypatch, folder):
    ax = _figures(monkeypatch, folder)["pareto"].axes[0]
    handles = ax.get_legend().legend_handles
    filled = [h.get_label() for h in handles if isinstance(h, Line2D) and h.get_marker() not in ("", "None", None)
              and h.get_markersize() > 0 and h.get_markerfacecolor() != "none"]
    assert not filled, filled  # every point of this campaign is hollow: its gate failed


def test_pareto_point_labels_do_not_overlap(monkeypatch, folder):
    fig = _figures(monkeypatch, folder)["pareto"]
    ax = fig.axes[0]
    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), t.get_window_extent(renderer)) for t in ax.texts]
    assert boxes
    clashes = [(a, b) for i, (a, ba) in enumerate(boxes) for b, bb in boxes[i + 1:] if ba.overlaps(bb)]
    assert not clashes, clashes


def test_rate_axes_start_at_zero(monkeypatch, folder):
    figs = _figures(monkeypatch, folder)
    pareto = figs["pareto"].axes[0]
    prefill = figs["long-prompt"].axes[0]
    assert (pareto.get_xlim()[0], pareto.get_ylim()[0], prefill.get_ylim()[0]) == (0, 0, 0)


def _links(text: str) -> list[str]:
    return re.findall(r"\]\(([^)#][^)]*)\)", text) + re.findall(r'href="([^"#][^"]*)"', text)


def test_a_report_written_outside_the_results_tree_can_be_copied_elsewhere(folder, tmp_path):
    write(from_campaign(folder), tmp_path / "out")
    moved = tmp_path / "a" / "b" / "c" / "report"
    shutil.copytree(tmp_path / "out", moved)
    shutil.rmtree(tmp_path / "out")
    links = _links((moved / "report.md").read_text()) + _links((moved / "report.html").read_text())
    broken = [x for x in links if not (moved / x).exists() or not (moved / x).resolve().is_relative_to(moved)]
    assert links and not broken, broken[:5]


def test_a_report_inside_the_results_tree_links_to_the_run_folders_in_place(folder):
    md, _ = write(from_campaign(folder), folder)
    links = _links(md.read_text())
    assert not (folder / "sources").exists()
    assert any(x.startswith("../../runs/") and (folder / x).exists() for x in links)


def test_the_gate_table_has_one_row_per_gate(report_md, results):
    gates = [n for n, s in _summaries(results).items() if s["kind"] == "gate"]
    assert len(_rows(report_md, "The gate (needle in a haystack)")) == len(gates) == 3


def test_campaign_status_in_a_pipe_keeps_whole_headers_and_names(results):
    r = _cli(["campaign", "status", CAMPAIGN], results)
    assert r.returncode == 0, r.stderr
    assert "| variant | workload | point | output tok/s | per-user tok/s p50 | TTFT p50 ms |" in r.stdout, r.stdout
    assert "| cache-ram0 | long-prompt | c=1 |" in r.stdout, r.stdout


def test_the_cell_begun_on_a_busy_host_is_flagged_and_only_it(report_md, results):
    by_cell: dict[str, float] = {}
    for s in sorted(_summaries(results).values(), key=lambda s: s["created_at"]):
        by_cell.setdefault(s["campaign"]["cell"], s["host"]["load_avg"][0])
    busy = [c for c, load in by_cell.items()
            if load >= 2 * statistics.median([x for o, x in by_cell.items() if o != c])]
    assert busy == ["default#1"]  # the cell that began right after the CUDA build (load 11.2 against 4.7)
    flagged = re.findall(r"HOST BUSY: cell (\S+):", report_md)
    assert flagged == busy


def test_a_difference_no_campaign_knob_explains_still_counts_as_a_knob(folder):
    """A cell resumed under another servedeck version: the campaign changed one knob, but two things changed."""
    from dataclasses import replace

    from servedeck.report.compare import compare

    coll = from_campaign(folder)
    base = [r for r in coll.runs if r.variant == "default" and r.workload == "long-prompt"]
    p8 = [replace(r, knobs={**r.knobs, "servedeck version": "0.2.0"})
          for r in coll.runs if r.variant == "p8" and r.workload == "long-prompt"]
    c = compare(base, p8)
    assert [k[0] for k in c.att.knobs] == ["args.parallel", "servedeck version"]
    assert c.attribution.startswith("2 knobs changed (args.parallel, servedeck version")


def test_compare_of_two_runs_of_a_campaign_credits_the_campaign_knob(results):
    """Runs named one by one (not --campaign) still carry their campaign's knobs (summary.json campaign.folder)."""
    runs = results / "runs"
    r = _cli(["compare", str(runs / "r8b__default__4k__llamacpp__1201-094832"),
              str(runs / "r8b__p8__4k__llamacpp__1201-094953"), "--json"], results)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["knobs"] == [{"knob": "args.parallel", "a": "32", "b": "8"}]


def test_a_runs_own_summary_names_the_gpus_driver_memory_and_power_limit(results):
    from servedeck.report.render import markdown
    from servedeck.runs.read import load

    line = next(ln for ln in markdown(load(results / "runs" / "r8b__default__4k__llamacpp__1201-094803")).splitlines()
                if ln.startswith("- GPUs:"))
    assert line == "- GPUs: 0: NVIDIA H200; driver 580.159.04 (CUDA 13.0); memory 140.4 GiB; power limit 700 W"


def test_the_where_table_says_where_the_layers_went(folder, results, tmp_path):
    """The recorded campaign predates the placement facts, so one run's boot gets them from the real CUDA
    llama-server log captured at -lv 4 (tests/data/llamacpp-11434-cuda), parsed by the adapter itself."""
    from servedeck.engines.llamacpp import ENGINE

    log = (Path(__file__).resolve().parents[1] / "data/llamacpp-11434-cuda/boot-lv4.log").read_text()
    placement = ENGINE.parse_boot(log)["placement"]
    tree = tmp_path / "results"
    shutil.copytree(results, tree)
    camp = tree / "campaigns" / CAMPAIGN
    first = json.loads((camp / "campaign.json").read_text())["cells"][0]
    for run in first["runs"]:
        f = tree / "runs" / run / "summary.json"
        doc = json.loads(f.read_text())
        doc.setdefault("boot", {})["placement"] = placement
        f.write_text(json.dumps(doc))
    md, _ = write(from_campaign(camp), camp)
    lines = _section(md.read_text(), "What was measured, where, with what").splitlines()
    head = next(i for i, ln in enumerate(lines) if "| placement (boot) |" in ln)
    columns = [c.strip() for c in lines[head].strip("|").split("|")]
    row = next(ln for ln in lines[head + 2:] if ln.startswith(f"| {first['variant']} |"))
    assert [c.strip() for c in row.strip("|").split("|")][columns.index("placement (boot)")] == placement
