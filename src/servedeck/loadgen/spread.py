"""Several servers behind one Streamer: each request goes to the replica with the fewest requests
in flight (ties: the one that has been sent fewest, then the first), as a least-outstanding-requests
balancer would. It counts what each replica was sent, per kind, so a point can say how many requests
each replica served."""

from __future__ import annotations

from typing import Any

from servedeck.loadgen.client import StreamingClient
from servedeck.loadgen.records import RequestRecord, RequestSpec


class Spread:
    """Lifecycle as StreamingClient's: open after construction, closed by `aclose` (closes every client)."""

    def __init__(self, clients: list[StreamingClient]) -> None:
        if not clients:
            raise ValueError("Spread needs at least one client")
        self.clients = clients
        self.outstanding = [0] * len(clients)
        self.sent = [0] * len(clients)
        self.served: dict[str, list[int]] = {"warmup": [0] * len(clients), "measured": [0] * len(clients)}
        self.ok: dict[str, list[int]] = {"warmup": [0] * len(clients), "measured": [0] * len(clients)}

    def pick(self) -> int:
        return min(range(len(self.clients)), key=lambda i: (self.outstanding[i], self.sent[i], i))

    async def send(self, spec: RequestSpec, record: RequestRecord, t0: float) -> None:
        i = self.pick()
        self.outstanding[i] += 1
        self.sent[i] += 1
        try:
            await self.clients[i].send(spec, record, t0)
        finally:
            self.outstanding[i] -= 1
            self.served[spec.kind][i] += 1
            if record.status == "ok":
                self.ok[spec.kind][i] += 1

    def in_flight(self) -> list[tuple[str, float, int, Any]]:
        """Every replica's requests now waiting on their server (what a stall watch looks at)."""
        return [x for c in self.clients for x in c.in_flight()]

    end = staticmethod(StreamingClient.end)

    async def prewarm(self, n: int) -> int:
        return sum([await c.prewarm(max(1, n // len(self.clients) + 1)) for c in self.clients])

    def reset_counts(self) -> None:
        for d in (self.served, self.ok):
            for k in d:
                d[k] = [0] * len(self.clients)

    def counts(self) -> list[dict[str, Any]]:
        return [{"replica": i + 1, "base_url": c.config.base_url, "requests": self.served["measured"][i],
                 "ok": self.ok["measured"][i]} for i, c in enumerate(self.clients)]

    async def aclose(self) -> None:
        for c in self.clients:
            await c.aclose()

    async def __aenter__(self) -> "Spread":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
