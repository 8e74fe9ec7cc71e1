"""Routing a proxied /v1/ call: the model named by its JSON body's "model" (a name, an alias or a
served name), a replica of it from the manager (now when it is ready, else after waiting for its
boot or switch in a task), the request written to that engine through the relay, and what the
request leaves behind when it ends (its replica given back, its metrics, its line on the live page).

Every /v1/ path is proxied but GET and HEAD /v1/models and /v1/health, which the door answers
(door/management.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections import deque
from typing import Any

from servedeck.door import policy as Pol
from servedeck.door.checks import bad_number, cut, encode, parse, quoted, unreadable
from servedeck.door.front import NESTING_HINT, Answer, Req, error_body, upstream_request
from servedeck.door.logprobs import CompletionLogprobs
from servedeck.door.manager import Manager, Refusal
from servedeck.door.metrics import DoorMetrics
from servedeck.door.relay import Exchange, Relay, UpstreamError

log = logging.getLogger("servedeck.door")

USAGE_RE = re.compile(rb'"completion_tokens"\s*:\s*(\d+)')
WAITED_HEADER = "x-servedeck-waited"  # `28.2s min-residency, 2.0s switch`: how long and why a request waited
RECENT = 50  # requests kept for the live page and /door/status


DOOR_V1 = (b"/v1/models", b"/v1/health")  # the /v1/ paths the door answers itself (GET, HEAD)
EMBEDDINGS = b"/v1/embeddings"
COMPLETIONS = b"/v1/completions"
FILLED = (b"/v1/chat/completions", COMPLETIONS)  # where models.toml's client_defaults apply (chat first)
GENERATE = (b"/v1/chat/completions", b"/v1/completions", b"/v1/responses", b"/v1/messages")


def is_proxied(r: Req) -> bool:
    return r.path.startswith(b"/v1/") and not (r.path in DOOR_V1 and r.method in (b"GET", b"HEAD"))


def answer_refusal(r: Refusal) -> Answer:
    headers = {"Retry-After": str(int(max(1, round(r.retry_after_s))))} if r.retry_after_s else {}
    return Answer(r.status, error_body(r.status, r.message, r.hint, cause=r.cause), headers)


class Router:
    def __init__(self, manager: Manager, metrics: DoorMetrics, relay: Relay, log_bodies: bool = False) -> None:
        self.manager = manager
        self.metrics = metrics
        self.relay = relay
        self.log_bodies = log_bodies
        self.recent: deque[dict] = deque(maxlen=RECENT)

    def dispatch(self, r: Req) -> None:
        """Send `r` to its model's engine. Raises Answer for what the door answers itself."""
        body = r.body[0] if r.body else b""  # one buffer (door/front.py's on_body): used as it is, not copied
        r.body = []
        if self.log_bodies:
            log.info("request %s %s body=%s", r.method.decode(), r.url.decode("latin-1"),
                     body[:4096].decode(errors="replace"))
        name = doc = None
        by_json = False
        if body:
            try:
                doc, by_json = parse(body)
                name = doc.get("model") if isinstance(doc, dict) else None
            except ValueError as e:  # JSONDecodeError, UnicodeDecodeError, an integer past Python's digit limit
                self.metrics.count("-", "400")
                raise Answer(400, error_body(400, f"{cut(r.path)}: {unreadable(e)}",
                                             "send the body as JSON in UTF-8")) from None
            except RecursionError:  # nested past what Python's parser reads (front.py's NESTING_HINT)
                self.metrics.count("-", "400")
                raise Answer(400, error_body(400, f"{cut(r.path)}: the JSON body is nested too deeply "
                                                  "to read", NESTING_HINT)) from None
        if not isinstance(name, str) or not name:
            self.metrics.count("-", "400")
            raise Answer(400, error_body(400, f"{cut(r.path)}: the JSON body names no \"model\"" +
                                         ("" if name is None else f" (its \"model\" is {quoted(json.dumps(name), 40)})"),
                                         "send {\"model\": NAME, ...}; GET /v1/models lists the names"))
        mgr = self.manager
        try:
            model = mgr.resolve(name)
        except Refusal as e:
            self.metrics.count("-", "404")
            raise answer_refusal(e) from None
        bad = bad_number(doc, mgr.models[model].context, r.path == COMPLETIONS)
        if bad is not None:  # before any engine is started for it: the engine would take it on trust
            self.metrics.count(model, "400")
            raise Answer(400, error_body(400, f"{model}: {bad[1]}", f"send \"{bad[0]}\" within its limit",
                                         param=bad[0]))
        embeds = mgr.models[model].embeddings  # what the model can answer, from models.toml (one compare)
        if embeds is not None and (r.path in GENERATE if embeds else r.path == EMBEDDINGS):
            self.metrics.count(model, "400")
            raise self.wrong_kind(model, embeds)
        r.model = model
        r.entry = {"model": model, "path": r.path.decode("latin-1"), "status": None, "ttft_ms": None,
                   "e2e_ms": None, "tokens": None, "waited": None, "at": time.time()}
        self.recent.append(r.entry)
        ask = Pol.Ask(r.path, r.headers, body, doc)
        rep = mgr.take_ready(model, ask)
        # From here the body is held by the request alone, so that _send can let it go before it writes a
        # changed body anew: the parsed values and their new bytes are then the only two copies held
        r.body = [body]
        del body
        if rep is None:  # not ready: wait for it (a boot or a switch) in a task
            r.task = asyncio.get_running_loop().create_task(self._wait_then_send(r, model, name, doc, by_json, ask))
            return
        del ask
        self._send(r, rep, model, name, doc, by_json)

    def wrong_kind(self, model: str, embeds: bool) -> Answer:
        """A request the model's kind cannot answer, said before any engine is started for it: llama.cpp
        answers embeddings without --embeddings 501, vLLM's generate runner a bare 404 {"detail":"Not Found"}."""
        others = sorted(n for n, rt in self.manager.models.items() if rt.embeddings is not embeds and n != model)
        if embeds:
            return Answer(400, error_body(400, f"{model} is an embedding model (embeddings = true in [models.{model}]): "
                                               "it answers /v1/embeddings only",
                                          f"send chat and completions to another model ({', '.join(others) or 'none'}"
                                          " in models.toml) or serve this one for generation in an entry without "
                                          "embeddings = true"))
        return Answer(400, error_body(400, f"{model} does not serve embeddings: [models.{model}] has no embeddings = true",
                                      f"send /v1/embeddings to an embedding model ({', '.join(others) or 'none is set'}"
                                      f" in models.toml), or set embeddings = true in [models.{model}] for a model "
                                      "that embeds (llama.cpp renders --embeddings, vLLM --runner pooling, SGLang "
                                      "--is-embedding); the entry then serves nothing else"))

    async def _wait_then_send(self, r: Req, model: str, name: str, doc: Any, by_json: bool, ask: Pol.Ask) -> None:
        waited = Pol.Waited(since=self.manager.clock())
        try:
            rep = await self.manager.acquire(model, waited, ask)
        except Refusal as e:
            r.task = None
            r.model = None  # answered here, not by finish()
            a = answer_refusal(e)
            why = waited.text()
            if why:
                a.headers[WAITED_HEADER] = why
            if r.entry is not None:
                r.entry.update(status=e.status, e2e_ms=round((time.perf_counter() - r.t0) * 1e3, 1), error=e.message,
                               waited=why or None)
            self.metrics.count(model, str(e.status))
            r.respond(a)
            return
        del ask  # it holds the body too (_send lets the body go)
        r.task = None
        why = waited.text()
        if why:  # said in the response's head and on the page: why this request did not start at once
            r.waited = b"%s: %s\r\n" % (WAITED_HEADER.encode(), why.encode())
            if r.entry is not None:
                r.entry["waited"] = why
        if r.gone:  # the client left as the model became ready
            self.manager.release(model, rep)
            return
        self._send(r, rep, model, name, doc, by_json)

    def _send(self, r: Req, rep: Any, model: str, name: str, doc: Any, by_json: bool) -> None:
        """Write the request to `rep`: the body as the client sent it, or, when the door changed what it
        says, written anew from `doc` once the body it came in has been let go (the request holds it alone)."""
        body: bytes | bytearray = r.body.pop() if r.body else b""
        r.rep = rep
        rt = self.manager.models[model]
        changed = False
        if doc is not None and name != rt.served_name and rt.managed:
            doc["model"] = rt.served_name  # an alias: the engine knows the model by its served name
            changed = True
        if isinstance(doc, dict) and r.path in FILLED and self._fill(r, rt, doc):
            changed = True
        if changed:
            del body  # freed here, before its replacement is written: a body costs twice its size, not three times
            body = encode(doc, by_json)
        if rt.chat_logprobs and r.path == COMPLETIONS and doc.get("logprobs"):  # llama-server's chat-shaped ones
            r.rewrite = CompletionLogprobs()
        got = self.relay.start(rep.url, upstream_request(r, self.relay.host_for(rep.url), body), r)
        if isinstance(got, Exchange):
            r.ex = got
        else:
            r.task = got

    def _fill(self, r: Req, rt: Any, doc: dict) -> bool:
        """models.toml's client_defaults for what the client left out (a chat UI's missing max_tokens, its
        tools); what was filled is on the request's line of the live page."""
        cfg = self.manager.cfg
        if cfg is None or not rt.members:
            return False
        done = cfg.models[rt.members[0]].client_defaults.fill(doc, chat=r.path == FILLED[0])
        if done and r.entry is not None:
            r.entry["filled"] = done
        return bool(done)

    def finish(self, r: Req, ex: Exchange | None) -> None:
        """A proxied request is over (answered, failed or abandoned): give its replica back, count it,
        and fill in its line on the page. Once per request; nothing for a request routed nowhere."""
        model = r.model
        if model is None:
            return
        r.model = None
        if r.rep is not None:
            self.manager.release(model, r.rep)
            r.rep = None
        e2e = time.perf_counter() - r.t0
        ttft = ex.t_first_body - r.t0 if ex is not None and ex.t_first_body is not None else None
        self.metrics.request_done(model, r.status, e2e, ttft)
        entry = r.entry
        if entry is not None:
            if ttft is not None:
                entry["ttft_ms"] = round(ttft * 1e3, 1)
            if ex is not None:
                m = USAGE_RE.findall(ex.usage_body[-4096:])
                entry["tokens"] = int(m[-1]) if m else None
            entry["status"] = r.status
            entry["e2e_ms"] = round(e2e * 1e3, 1)

    def ended(self, r: Req, ex: Exchange) -> None:
        self.finish(r, ex)
        self.relay.release(ex)

    def failed(self, r: Req, ex: Exchange | None, exc: UpstreamError) -> None:
        if not r.head_sent:
            self.upstream_failed(r, exc)
        else:
            self.stream_broke(r, ex, exc)

    def upstream_failed(self, r: Req, exc: UpstreamError) -> None:
        """The upstream failed before answering: 502, naming it."""
        r.status = 502
        url = r.rep.url if r.rep is not None else "?"
        model = r.model
        self.metrics.upstream_failed(model or "-", "before-response")
        self.finish(r, None)
        r.respond(Answer(502, error_body(502, f"{model} at {url}: {exc}", f"`servedeck logs {model}` shows the engine's side")))

    def stream_broke(self, r: Req, ex: Exchange | None, exc: UpstreamError) -> None:
        """The engine broke off a response after its head went out: the request is counted now (502,
        an upstream failure mid-stream) and its replica given back. An event stream ends once the
        cause is known (the engine's own ending, read in a thread) with an error event naming it; any
        other body cannot say more, so the client's connection is cut (an incomplete body, not a clean end)."""
        model = r.model or "-"
        url = r.rep.url if r.rep is not None else "?"
        r.status = 502
        self.metrics.upstream_failed(model, "mid-stream")
        self.finish(r, ex)
        if ex is not None and r.can_end_with_an_event(ex):
            r.task = asyncio.get_running_loop().create_task(self._end_broken_stream(r, model, url, exc))
        else:
            r.cut()

    async def _end_broken_stream(self, r: Req, model: str, url: str, exc: UpstreamError) -> None:
        try:
            message, cause = await asyncio.to_thread(self.manager.why_stream_broke, model, url, str(exc))
        except Exception as e:  # the stream must still end properly
            message, cause = f"{model} at {url} broke off the response: {exc} (and reading why failed: {e})", None
        r.task = None
        if r.entry is not None:
            r.entry["error"] = message
        r.end_stream(error_body(502, message, f"`servedeck logs {model}` shows the engine's side", cause=cause))
