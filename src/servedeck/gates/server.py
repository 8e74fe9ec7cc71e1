"""What a running server says about token counts and its context, asked over HTTP.

The gate sizes its haystack with the server's own tokenizer, never a local guess: the count a
local tokenizer gives can differ from what the engine sees (chat template, BOS, special-token
parsing), and a prompt one token too long is refused. How to ask is the engine adapter's business
(`Engine.count_chat`); the context comes from GET /v1/models (max_model_len, or
meta.n_ctx per slot).

HTTP and JSON failures are turned into RunError here, at the edge.
"""

from __future__ import annotations

from typing import Any

import httpx

from servedeck.engines import get_engine
from servedeck.errors import RunError

Messages = list[dict[str, str]]


class ServerTokens:
    """Token counts as the server computes them. One instance per (server, model name)."""

    def __init__(self, client: httpx.AsyncClient, base_url: str, served_name: str, engine: str):
        self.client = client
        self.base = base_url.rstrip("/")
        self.served_name = served_name
        self.engine = get_engine(engine)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            r = await self.client.post(self.base + path, json=body, timeout=120)
        except httpx.HTTPError as e:
            raise RunError(f"{self.base}{path}: {type(e).__name__}: {e}",
                           hint="is the server still running? `servedeck status`") from None
        if r.status_code != 200:
            raise RunError(f"{self.base}{path}: HTTP {r.status_code}: {r.text[:300]}",
                           hint=f"the {self.engine.name} server must offer {path} to size prompts with its tokenizer")
        try:
            return r.json()
        except ValueError:
            raise RunError(f"{self.base}{path}: answer is not JSON: {r.text[:200]}") from None

    async def count_chat(self, messages: Messages) -> int:
        """Tokens the server will prefill for this chat request, template and generation prompt included."""
        return await self.engine.count_chat(self._post, self.served_name, messages)


async def server_context(client: httpx.AsyncClient, base_url: str) -> int | None:
    """Tokens one request may hold, as the running server reports it (None when it will not say)."""
    try:
        r = await client.get(base_url.rstrip("/") + "/v1/models", timeout=30)
        data = r.json().get("data") or []
    except (httpx.HTTPError, ValueError, AttributeError):
        return None
    for m in data:
        if isinstance(m.get("max_model_len"), int):
            return m["max_model_len"]
        meta = m.get("meta") or {}
        if isinstance(meta.get("n_ctx"), int):
            return meta["n_ctx"]
    return None
