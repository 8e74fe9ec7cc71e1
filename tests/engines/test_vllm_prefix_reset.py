"""vLLM's prefix cache emptied in place, on vLLM's CPU build (SmolLM2-135M): what bench/routing_side_by_side.py
--between-arms reset relies on so that each router meets cold replicas without a boot per arm. The same prompt
sent twice is served from the cache the second time; after the adapter's reset (POST /reset_prefix_cache, the
launch in dev mode) it is prefilled again from nothing; and the adapter's request counter counts each request."""

from __future__ import annotations

import os

import httpx
import pytest

from servedeck.deck import Deck
from servedeck.engines import get_engine
from servedeck.engines.metrics import read_metrics
from servedeck.loadgen import texts

pytestmark = [pytest.mark.engine, pytest.mark.vllm, pytest.mark.slow]
MODEL = "smollm2-vllm"


def test_a_reset_empties_vllms_prefix_cache_and_every_request_is_counted(campaign_config, campaign_home, vllm,
                                                                          monkeypatch):
    """On the session's shared vLLM (tests/shared_servers.py: its models.toml entry carries
    VLLM_SERVER_DEV_MODE=1). Emptying its prefix cache harms no other test: each cache test sends its own
    prompts twice and reads the second."""
    monkeypatch.setenv("SERVEDECK_HOME", str(campaign_home))
    deck = Deck(campaign_config)
    adapter = get_engine("vllm")
    spec = deck.render(MODEL)
    assert spec.env.get("VLLM_SERVER_DEV_MODE") == "1"
    how = adapter.prefix_cache_reset({**os.environ, **spec.env})
    assert how.path == "/reset_prefix_cache"
    url = vllm.base_url
    # about 600 tokens: several of the CPU backend's 128-token blocks, so a cached prompt shows; a text no
    # other test sends (its offset), so the first send finds nothing cached
    body = {"model": vllm.served_name, "max_tokens": 1, "temperature": 0,
            "messages": [{"role": "user", "content": "prefix reset: " + texts.piece("prose", 7, 2400)}]}

    def cached() -> int:
        r = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r.json()["usage"]["prompt_tokens_details"]["cached_tokens"]

    before = read_metrics(url)
    assert cached() == 0
    warm = cached()
    assert warm >= 384
    r = httpx.post(url + how.path, timeout=30)
    assert adapter.prefix_cache_reset_done(r.status_code, r.text), (r.status_code, r.text)
    assert cached() == 0
    assert cached() == warm  # the cache works as before: the reset emptied it, it did not turn it off
    after = read_metrics(url)
    assert adapter.requests_finished(after) - adapter.requests_finished(before) == 4
    got = adapter.prefix_counters(after)
    assert got and got["hits"] - adapter.prefix_counters(before)["hits"] == 2 * warm
