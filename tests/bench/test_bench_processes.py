"""The bench's own processes end with an interrupt that comes while they start: a Ctrl-C (or the SIGTERM the
routing bench turns into one) during vllm-router's wait for /health, or during the warm-up request the
routing bench sends the replicas the deck just started, leaves nothing running."""

from __future__ import annotations

import time

import httpx
import pytest

from servedeck.deck import Deck
from servedeck.modelsfile import parse
from servedeck.supervisor.process import group_members
from servedeck.testing.instrument_process import InstrumentProcess

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


def test_two_vllm_routers_at_once_each_come_up():
    """Two routers on one machine (the two test workers, or a user's own router beside the bench): each has its
    own Prometheus port. At vllm-router's default (127.0.0.1:29000 for every router) the second one panicked at
    start, and a CI run lost the routing bench to it (2026-12-06)."""
    worker = InstrumentProcess()  # a measuring instrument as the routers' worker: it answers /health
    routers: list[_vllm_router.VllmRouter] = []
    try:
        for _ in range(2):
            routers.append(_vllm_router.VllmRouter([worker.url], "round_robin"))
        assert routers[0].metrics_port != routers[1].metrics_port
        for r in routers:
            assert r.proc.poll() is None
            assert httpx.get(r.url + "/health", timeout=5).status_code == 200
            assert httpx.get(f"http://127.0.0.1:{r.metrics_port}/metrics", timeout=5).status_code == 200
    finally:
        for r in routers:
            r.stop()
        worker.stop()
    assert all(not group_members(r.proc.pid) for r in routers)
