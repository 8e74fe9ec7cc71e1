"""What only vLLM gives the page, on the real vLLM CPU build: the engine's own package version, a RECORD
verdict over a real venv of 150 distributions, and a KV pool the engine reports in tokens beside the
planner's prediction. The rest of the page is tested on llama.cpp. The run the page shows is measured on the
session's shared vLLM (tests/shared_servers.py: the starter's smollm2-vllm, dev mode's endpoints on), which
the page only reads: a boot of its own cost this module ~45 s."""

from __future__ import annotations

import os

import pytest

from pagekit import cli, page_json, TEST_MARK, SESSION
from servedeck.workloads.points import BenchSpec
from servedeck.workloads.session import Outcome, measured, run as bench
from servedeck.loadgen import ClosedLoop
from servedeck.loadgen.loop import run as run_loop

pytestmark = [pytest.mark.engine, pytest.mark.vllm]

NAME = "smollm2-vllm"


@pytest.fixture(scope="module")
def vhist(campaign_config, campaign_home, vllm, tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:  # module scope: the page's own home is set for its other tests
        mp.setenv("SERVEDECK_HOME", str(campaign_home))
        mp.setenv("SERVEDECK_RESULTS", str(tmp_path_factory.mktemp("page-vllm-results")))
        env = {**os.environ, TEST_MARK: SESSION}  # the CLI calls below see the same home and results
        out = Outcome()
        with measured(campaign_config, NAME, False, out) as target:
            run_loop(bench(target, BenchSpec(workload="chat", shapes=(ClosedLoop(1),), input_tokens=48, output_tokens=4,
                                              requests=2, warmup=0, seed=3), gate_mode=False, outcome=out))
    path = campaign_config.path
    verify = cli(path, env, "verify-build", "vllm-cpu", timeout=600)
    return {"cfg": path, "env": env, "run": out.folder, "verify": verify, "doc": page_json(path, env, NAME)}


def test_the_engines_version_comes_from_its_package(vhist):
    w = vhist["doc"]["sections"]["what"]
    assert w["engine_version"] == {"value": "0.32.0", "source": "vllm-cpu package metadata", "problems": []}
    [group] = vhist["doc"]["sections"]["measured"]["by_engine_version"]
    assert group["engine_version"] == "0.32.0"
    [run] = group["runs"]
    assert run["path"] == str(vhist["run"]) and run["gate"]["status"] == "not run"
    assert run["provenance"]["engine_version_from"].startswith("the run")


def test_memory_has_the_planners_kv_pool_beside_vllms_own(vhist):
    m = vhist["doc"]["sections"]["memory"]
    got = m["measured"]
    assert got["figures"]["kv_tokens"] == m["predicted"]["kv_pool_tokens"] > 0  # docs/planner.md: exact on CPU
    assert got["kv_tokens_error_pct"] == 0 and got["engine_version"] == "0.32.0"
    assert got["stale"] == {"stale": False, "why": [], "unknown": []}


def test_the_build_section_has_the_record_verdict_of_the_venv(vhist):
    v = vhist["doc"]["sections"]["build"]["verified"]
    assert v["integrity_checked"] and v["dists"] > 100 and v["files_total"] > 10_000
    assert v["files_matched"] == v["files_total"] - v["changed"]["count"] - v["missing"]["count"]
    assert v["verdict"] == ("intact" if v["files_matched"] == v["files_total"] and not v["untracked"]["count"]
                            else "changed")
    assert v["engine_version"] == "0.32.0" and vhist["verify"].returncode in (0, 1)
    assert f"{v['files_matched']:,} of {v['files_total']:,} files match their RECORD hashes" in vhist["verify"].stdout


def test_the_launch_configuration_shows_vllms_flags_and_env(vhist):
    la = vhist["doc"]["sections"]["launch"]
    flags = {f["flag"]: f["value"] for f in la["flags"]}
    assert flags["--max-model-len"] == "4096" and flags["--enforce-eager"] == "on"
    assert {e["name"]: e["value"] for e in la["env_rows"]}["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert la["today_launches"] == 1
