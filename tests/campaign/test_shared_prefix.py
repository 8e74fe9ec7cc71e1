"""Issue 25's shared-prefix workload on real llama.cpp: groups of requests sharing a prefix, the engine's
cache on (the default) and off (`cache_prompt = false` in the model's request table), the cached tokens
it reports per request differing as they should; the spec's rules (pure)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys

import pytest

from servedeck.workloads.session import Outcome, measured
from servedeck.workloads.session import run as shared_prefix
from servedeck.workloads.shared_prefix import SharedPrefixSpec
from servedeck.errors import UsageError
from servedeck.fsio import read_jsonl
from servedeck.loadgen.loop import run as run_loop
from servedeck.runs import load

SPEC = SharedPrefixSpec(groups=2, group_size=3, prefix_tokens=300, suffix_tokens=16, output_tokens=4, seed=11)


def _with_request(cfg, name: str, request: dict):
    model = cfg.models[name].model_copy(update={"request": request})
    return dataclasses.replace(cfg, deck=cfg.deck.model_copy(update={"models": {**cfg.models, name: model}}))


def _run(cfg, spec: SharedPrefixSpec):
    out = Outcome()
    with measured(cfg, "smollm2", False, out) as target:
        return run_loop(shared_prefix(target, spec, gate_mode=False, outcome=out)).folder


@pytest.mark.engine
@pytest.mark.llamacpp
def test_cache_on_serves_the_shared_prefix_and_cache_off_does_not(campaign_config, llama):
    on = _run(campaign_config, SPEC)
    off = _run(_with_request(campaign_config, "smollm2", {"cache_prompt": False}), dataclasses.replace(SPEC, seed=12))
    lines = {name: [ln for ln in read_jsonl(f / "requests.jsonl") if ln.get("group") is not None]
             for name, f in (("on", on), ("off", off))}
    assert [len(v) for v in lines.values()] == [6, 6]
    assert all(ln["status"] == "ok" for v in lines.values() for ln in v)
    for ln in lines["on"]:
        if ln["in_group"] > 1:  # all but the request's own part (16 tokens, its tag, the question, the template's
            # end: under 60) came from the cache
            assert ln["cached_tokens"] >= ln["prompt_tokens"] - 60 and ln["cached_tokens"] >= 200, \
                (ln["cached_tokens"], ln["prompt_tokens"])
    assert all(ln["cached_tokens"] < 50 for ln in lines["off"]), [ln["cached_tokens"] for ln in lines["off"]]
    on_view, off_view = load(on), load(off)
    assert on_view["shared_prefix"]["rest"]["cached_share"] > 0.8
    assert off_view["shared_prefix"]["rest"]["cached_share"] < 0.2
    print(f"\nrest cached share on {on_view['shared_prefix']['rest']['cached_share']:.0%}, off "
          f"{off_view['shared_prefix']['rest']['cached_share']:.0%}; TTFT p50 on "
          f"{on_view['shared_prefix']['rest']['ttft_ms_p50']:.0f} ms, off "
          f"{off_view['shared_prefix']['rest']['ttft_ms_p50']:.0f} ms")


@pytest.mark.parametrize("change, flag", [({"groups": 0}, "--groups"), ({"group_size": 0}, "--group-size"),
                                          ({"prefix_tokens": 4}, "--prefix-tokens"),
                                          ({"concurrency": 0}, "--concurrency"), ({"content": "random"}, "--content")])
def test_a_bad_option_is_refused_naming_it(change, flag):
    with pytest.raises(UsageError) as e:
        dataclasses.replace(SPEC, **change).check(None)
    assert flag in e.value.message


def test_a_prefix_that_cannot_fit_the_context_is_refused():
    with pytest.raises(UsageError) as e:
        dataclasses.replace(SPEC, prefix_tokens=4000).check(2048)
    assert "do not fit the server's context of 2048" in e.value.message


def _cli(cfg_path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "servedeck", "--config", str(cfg_path), *args],
                          capture_output=True, text=True, timeout=timeout, env=dict(os.environ))


@pytest.mark.parametrize("args, message", [
    (["--concurrency", "1,2"], "--workload shared-prefix runs one point"),
    (["--group-size", "0"], "--group-size must be at least 1"),
])
def test_servedeck_bench_refuses_a_bad_shared_prefix_option(campaign_config, args, message):
    # victim is not running: refused before the model is looked up
    r = _cli(campaign_config.path, "bench", "victim", "--workload", "shared-prefix", *args, timeout=60)
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert "Traceback" not in r.stderr and message in r.stderr and "hint:" in r.stderr


@pytest.mark.engine
@pytest.mark.llamacpp
def test_servedeck_bench_workload_shared_prefix_end_to_end(campaign_config, llama):
    r = _cli(campaign_config.path, "bench", "smollm2", "--workload", "shared-prefix", "--groups", "1",
             "--group-size", "2", "--prefix-tokens", "200", "--suffix-tokens", "16", "--output-tokens", "4",
             "--no-gate", "--json")
    assert r.returncode == 0, r.stderr
    view = json.loads(r.stdout)
    assert (view["workload"]["workload"], view["workload"]["prefix_tokens"]) == ("shared-prefix", 200)
    assert (view["shared_prefix"]["first"]["ok"], view["shared_prefix"]["rest"]["ok"]) == (1, 1)
    assert view["shared_prefix"]["rest"]["cached_share"] > view["shared_prefix"]["first"]["cached_share"]
