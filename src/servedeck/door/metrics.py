"""The door's /metrics, through prometheus-client (one registry per door, so two doors in one
process, as in the tests, do not share counters). GPU memory and power come from NVML at scrape
time, through servedeck.gpu.nvml, and only where there is a GPU."""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from servedeck.door.policy import ASLEEP, DRAINING, FAILED, READY, STARTING, STOPPED, STOPPING

STATES = (STOPPED, ASLEEP, STARTING, READY, DRAINING, STOPPING, FAILED)
# TTFT at the door reaches from sub-millisecond (a warm engine) to minutes (a boot behind it).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 900)
SWAP_BUCKETS = (0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 900)


class GpuCollector:
    """Per GPU: memory used/total and power draw, read through NVML when scraped (cached 2 s:
    a scrape storm must not turn into an NVML storm)."""

    def __init__(self) -> None:
        self._at = 0.0
        self._inv = None

    def collect(self):
        from servedeck.gpu.nvml import inventory

        if time.monotonic() - self._at > 2.0:
            self._inv, self._at = inventory(), time.monotonic()
        inv = self._inv
        used = GaugeMetricFamily("servedeck_gpu_memory_used_bytes", "GPU memory in use (NVML)", labels=["gpu"])
        total = GaugeMetricFamily("servedeck_gpu_memory_total_bytes", "GPU memory in all (NVML)", labels=["gpu"])
        power = GaugeMetricFamily("servedeck_gpu_power_watts", "GPU power draw (NVML)", labels=["gpu"])
        if inv is not None and inv.available:
            for g in inv.gpus:
                used.add_metric([str(g.index)], g.memory_used)
                total.add_metric([str(g.index)], g.memory_total)
                if g.power_w is not None:
                    power.add_metric([str(g.index)], g.power_w)
        yield used
        yield total
        yield power


class ModelMetrics:
    __slots__ = ("inflight", "queue", "ttft", "e2e")

    def __init__(self, inflight, queue, ttft, e2e) -> None:
        self.inflight, self.queue, self.ttft, self.e2e = inflight, queue, ttft, e2e


class DoorMetrics:
    def __init__(self, gpu: bool = True) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter("servedeck_door_requests", "requests answered at the door, by HTTP status",
                                ["model", "status"], registry=r)
        self.inflight = Gauge("servedeck_door_inflight", "requests being proxied now", ["model"], registry=r)
        self.queue = Gauge("servedeck_door_queue_depth", "requests waiting for the model to start", ["model"],
                           registry=r)
        self.ttft = Histogram("servedeck_door_ttft_seconds", "request arrival to the first response byte sent "
                              "to the client (includes any boot or switch it waited for)", ["model"],
                              buckets=LATENCY_BUCKETS, registry=r)
        self.e2e = Histogram("servedeck_door_e2e_seconds", "request arrival to the last byte sent", ["model"],
                             buckets=LATENCY_BUCKETS, registry=r)
        self.upstream_failures = Counter("servedeck_door_upstream_failures", "engine connections that failed, by "
                                         "when: before-response (the client got 502) or mid-stream (the stream "
                                         "ended with an error event, or was cut when it was not an event stream)",
                                         ["model", "when"], registry=r)
        self.swaps = Counter("servedeck_door_swaps", "switches made by the door, by outcome", ["model", "outcome"],
                             registry=r)
        self.swap_seconds = Histogram("servedeck_door_swap_seconds", "a switch: eviction, memory release and the "
                                      "new model's boot", ["model"], buckets=SWAP_BUCKETS, registry=r)
        self.boots = Counter("servedeck_door_boots", "starts and switches the door asked of the deck, by outcome",
                             ["model", "outcome"], registry=r)
        self.unloads = Counter("servedeck_door_ttl_unloads", "models stopped after ttl without requests", ["model"],
                               registry=r)
        self.ttl_sleeps = Counter("servedeck_door_ttl_sleeps", "models put to sleep after ttl_sleep without requests",
                                  ["model"], registry=r)
        self.state = Gauge("servedeck_door_model_state", "1 for the model's current door state", ["model", "state"],
                           registry=r)
        self._children: dict[str, ModelMetrics] = {}
        self._counts: dict[tuple[str, str], Any] = {}
        if gpu:
            r.register(GpuCollector())

    def of(self, model: str) -> "ModelMetrics":
        """The model's labelled children, looked up once (labels() takes a lock and hashes each call)."""
        m = self._children.get(model)
        if m is None:
            m = self._children[model] = ModelMetrics(self.inflight.labels(model), self.queue.labels(model),
                                                     self.ttft.labels(model), self.e2e.labels(model))
        return m

    def count(self, model: str, status: str) -> None:
        """One request answered with `status` (its labelled child looked up once)."""
        c = self._counts.get((model, status))
        if c is None:
            c = self._counts[(model, status)] = self.requests.labels(model, status)
        c.inc()

    def request_done(self, model: str, status: int, e2e_s: float, ttft_s: float | None) -> None:
        """A proxied request ended with `status`; `ttft_s`: to the engine's first body byte, if one came."""
        m = self.of(model)
        m.e2e.observe(e2e_s)
        if ttft_s is not None:
            m.ttft.observe(ttft_s)
        self.count(model, str(status))

    def upstream_failed(self, model: str, when: str) -> None:
        """An engine connection failed: `before-response` or `mid-stream`."""
        self.upstream_failures.labels(model, when).inc()

    def set_state(self, model: str, state: str) -> None:
        for s in STATES:
            self.state.labels(model, s).set(1 if s == state else 0)

    def render(self) -> bytes:
        return generate_latest(self.registry)
