"""The bench's own processes end with an interrupt that comes while they start: a Ctrl-C (or the SIGTERM the
routing bench turns into one) during vllm-router's wait for /health, or during the warm-up request the
routing bench sends the replicas the deck just started, leaves nothing running."""

from __future__ import annotations

import time

import pytest

from servedeck.deck import Deck
from servedeck.modelsfile import parse
from servedeck.supervisor.process import group_members

from benchkit import pair_toml
from ports import free_port_pair

import _routing_replicas  # noqa: E402
import _vllm_router  # noqa: E402


def test_vllm_router_interrupted_while_it_starts_is_stopped(monkeypatch):
    started = []

    def interrupted(proc, *a, **k):  # the Ctrl-C lands while it waits for /health
        started.append(proc)
        time.sleep(1.0)
        assert proc.poll() is None
        raise KeyboardInterrupt

    monkeypatch.setattr(_vllm_router, "wait_healthy", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _vllm_router.VllmRouter(["http://127.0.0.1:9"], "round_robin")
    [proc] = started
    assert proc.poll() is not None and not group_members(proc.pid)


@pytest.mark.engine
@pytest.mark.llamacpp
def test_replicas_interrupted_in_their_warm_up_are_stopped_by_the_deck(tmp_path, engines_ready, monkeypatch):
    text = pair_toml(engines_ready, free_port_pair(), context=512)
    cfg = parse(text, tmp_path / "models.toml")

    def interrupted(self):
        raise KeyboardInterrupt

    monkeypatch.setattr(_routing_replicas.DeckReplicas, "warm_up", interrupted)
    with pytest.raises(KeyboardInterrupt):
        _routing_replicas.DeckReplicas(cfg, "smol")
    assert Deck(cfg).running() == {}
