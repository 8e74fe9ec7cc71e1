"""What a running server says about token counts and its context, asked over HTTP.

The gate sizes its haystack with the server's own tokenizer, never a local guess: the count a
local tokenizer gives can differ from what the engine sees (chat template, BOS, special-token
parsing), and a prompt one token too long is refused. How to ask is the engine adapter's business
(`Engine.count_chat`); the context comes from GET /v1/models (max_model_len, or
meta.n_ctx per slot).

The requests go through loadgen.ApiClient (the bench's client); a failed request or an answer that
is not JSON is turned into RunError here, at the edge.
"""

from __future__ import annotations

from typing import Any

from servedeck.engines import get_engine
from servedeck.errors import RunError
from servedeck.loadgen.api import ApiClient

Messages = list[dict[str, str]]


class ServerTokens:
    """Token counts as the server computes them. One instance per (server, model name)."""

    def __init__(self, api: ApiClient, served_name: str, engine: str):
        self.api = api
        self.base = api.base_url
        self.served_name = served_name
        self.engine = get_engine(engine)

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        r = await self.api.post(path, body, timeout_s=120)
        if r.http_error:
            raise RunError(f"{self.base}{path}: {r.http_error}",
                           hint=f"the {self.engine.name} server must offer {path} to size prompts with its tokenizer")
        if not r.ok:  # no answer, or one cut off
            raise RunError(f"{self.base}{path}: {r.error}", hint="is the server still running? `servedeck status`")
        if not isinstance(r.doc, dict):
            raise RunError(f"{self.base}{path}: answer is not a JSON object: {r.body[:200]}")
        return r.doc

    async def count_chat(self, messages: Messages) -> int:
        """Tokens the server will prefill for this chat request, template and generation prompt included."""
        return await self.engine.count_chat(self._post, self.served_name, messages)


async def server_context(api: ApiClient) -> int | None:
    """Tokens one request may hold, as the running server reports it (None when it will not say)."""
    r = await api.get("/v1/models", timeout_s=30)
    data = r.doc.get("data") if isinstance(r.doc, dict) else None
    if not isinstance(data, list):
        return None
    for m in data:
        if not isinstance(m, dict):
            continue
        if isinstance(m.get("max_model_len"), int):
            return m["max_model_len"]
        meta = m.get("meta") or {}
        if isinstance(meta.get("n_ctx"), int):
            return meta["n_ctx"]
    return None
