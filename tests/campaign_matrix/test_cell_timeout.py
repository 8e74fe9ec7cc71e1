"""cell_timeout on real llama.cpp: a cell still measuring when it passes ends timed-out, its engine stopped,
and the campaign's exit code says a cell did not finish. The runner records it; the local placement keeps
the clock."""

from __future__ import annotations

import pytest

from tests.campaign_matrix.test_matrix_llamacpp import (  # noqa: F401
    _engines, campaign_doc, cli, env_for, llama_ready, models_toml)

pytestmark = pytest.mark.engine

SLOW = """
[campaign]
name = "t-timeout"
model = "smollm2"
cell_timeout = "20s"
gate = false

[[variants]]
name = "a"
args = { parallel = 1, threads = 1 }

[[workloads]]
kind = "chat"
concurrency = [1]
input_tokens = 48
output_tokens = 8
duration = "10m"
warmup = 0
"""


@pytest.fixture(scope="module")
def timed_out(tmp_path_factory, llama_ready):  # noqa: F811
    tmp = tmp_path_factory.mktemp("timeout")
    home, results = tmp / "home", tmp / "results"
    home.mkdir()
    camp = tmp / "slow.toml"
    camp.write_text(SLOW)
    res = cli(models_toml(tmp), env_for(home, results), "campaign", "run", str(camp), "--json", timeout=300)
    return {"res": res, "cell": campaign_doc(results)["cells"][0], "home": home}


def test_the_campaign_exits_1_when_a_cell_timed_out(timed_out):
    assert timed_out["res"].returncode == 1, timed_out["res"].stderr[-3000:]


def test_the_cell_is_recorded_timed_out_with_its_timeout_named(timed_out):
    cell = timed_out["cell"]
    assert (cell["state"], cell["reason"].split(";")[0]) == ("timed-out", "cell_timeout 20s passed")


def test_no_engine_of_the_cell_is_left_running(timed_out):
    assert not _engines(timed_out["home"])
