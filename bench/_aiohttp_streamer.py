"""The aiohttp client servedeck did not ship, kept to show why (bench/loadgen_accuracy.py --clients aiohttp).

Written the way common benchmark clients are (vllm bench serve): one ClientSession, iterate the
response line by line, stamp each line when the reading task gets it, json.loads every event.
It fills the same RequestRecord, so the instrument judges both clients the same way.
"""

from __future__ import annotations

import asyncio
import json
from time import perf_counter

import aiohttp

from servedeck.loadgen.client import ClientConfig, StreamingClient
from servedeck.loadgen.records import RequestRecord, RequestSpec


class AiohttpStreamer:
    def __init__(self, config: ClientConfig, connections: int) -> None:
        self.config = config
        self._body = StreamingClient(config).body  # the same request body as servedeck's client
        base = config.base_url.rstrip("/")
        base = base if base.endswith("/v1") else base + "/v1"
        self._url = base + ("/chat/completions" if config.api == "chat" else "/completions")
        self._session: aiohttp.ClientSession | None = None
        self._connections = connections

    async def __aenter__(self) -> AiohttpStreamer:
        self._session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self._connections),
            timeout=aiohttp.ClientTimeout(total=self.config.request_timeout_s),
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._session is not None:
            await self._session.close()

    async def send(self, spec: RequestSpec, record: RequestRecord, t0: float) -> None:
        assert self._session is not None
        headers = {"X-Request-Id": spec.id}
        record.t_send = perf_counter() - t0
        try:
            async with self._session.post(self._url, json=self._body(spec), headers=headers) as resp:
                record.http_status = resp.status
                record.t_first_byte = perf_counter() - t0
                if resp.status != 200:
                    record.status, record.error = "error", f"HTTP {resp.status}: {(await resp.text())[:300]}"
                    record.t_end = perf_counter() - t0
                    return
                async for line in resp.content:
                    t = perf_counter() - t0
                    line = line.strip()
                    if not line.startswith(b"data:"):
                        continue
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        continue
                    obj = json.loads(data)
                    if obj.get("usage"):
                        record.output_tokens = obj["usage"].get("completion_tokens")
                        record.prompt_tokens = obj["usage"].get("prompt_tokens")
                    choices = obj.get("choices") or []
                    if choices:
                        delta = choices[0].get("delta") or {}
                        if delta.get("content") or choices[0].get("text"):
                            record.chunk_t.append(t)
                            record.chunk_n.append(1)
                record.t_end = perf_counter() - t0
        except asyncio.CancelledError:
            record.status, record.error, record.t_end = "cancelled", "cancelled", perf_counter() - t0
            raise
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError, ValueError) as e:
            record.status, record.error, record.t_end = "error", f"{type(e).__name__}: {e}", perf_counter() - t0
            return
        record.streamed_tokens = sum(record.chunk_n)
        record.t_first_token = record.chunk_t[0] if record.chunk_t else None
        record.status = "ok"
