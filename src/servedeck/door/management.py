"""The door's own routes, answered by the front itself (no second server behind it):

    GET  /v1/models       every model and alias, with its door state
    GET  /health          the door answers, and each model's state (also /v1/health; ?model=NAME: that one's)
    GET  /metrics         Prometheus text
    GET  /                the live page (door/page.py)
    GET  /events          its server-sent events: a snapshot whenever it changed, checked every second
    GET  /door/status     the same snapshot as JSON (GPU power, limit and memory: door/gpu_watch.py)
    GET  /page?model=M    model M's page (servedeck.page), the HTML `servedeck page M --html` prints

HEAD is answered as GET without the body. Any other path outside /v1/ is 404 and another method on
these paths 405, in the door's JSON error shape. Who may ask is decided before (door/admission.py).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from typing import Any, Callable, Coroutine
from urllib.parse import parse_qs

from servedeck.door.admission import HEALTH_PATHS, Admission
from servedeck.door.checks import cut
from servedeck.door.front import WRITE_HIGH, Answer, Req, error_body
from servedeck.door.gpu_watch import GpuWatch
from servedeck.door.manager import Manager, Refusal
from servedeck.door.metrics import DoorMetrics
from servedeck.door.page import EVERY_S, PAGE, snapshot

log = logging.getLogger("servedeck.door")

JSON = b"application/json; charset=utf-8"


class Management:
    def __init__(self, manager: Manager, metrics: DoorMetrics, recent: deque[dict], admission: Admission) -> None:
        self.manager = manager
        self.admission = admission
        self.metrics = metrics
        self.recent = recent
        self.gpu = GpuWatch()  # read in its own thread, once a second at most
        self.descriptors: Callable[[], dict] = dict  # the listener's: the descriptor limit and what is open
        self.bodies: Callable[[], dict] = dict  # the front's: the body budget and what holds it
        self.routes: dict[bytes, Callable[[Req], None]] = {
            b"/v1/models": self.models, b"/metrics": self.metrics_text, b"/door/status": self.status,
            b"/": self.page, b"/events": self.events, b"/page": self.model_page,
            **{p: self.health for p in HEALTH_PATHS}}

    def answer(self, r: Req) -> None:
        route = self.routes.get(r.path)
        if route is None:
            raise Answer(404, error_body(404, f"no route {cut(r.path)} at the door",
                                         "the door answers /v1/* (by the body's model), /v1/models, /health, "
                                         "/v1/health, /metrics, /, /events, /door/status and /page?model=NAME"))
        if r.method not in (b"GET", b"HEAD"):
            raise Answer(405, error_body(405, f"{cut(r.path)} answers GET and HEAD, "
                                              f"not {cut(r.method)}"), {"Allow": "GET, HEAD"})
        route(r)

    def _later(self, r: Req, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
        """Answer in a task (a thread read, a stream); the client leaving cancels it."""
        async def run() -> None:
            try:
                await work()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # an answer still goes out, naming what failed
                log.exception("the door's %s failed", r.path.decode("latin-1"))
                r.task = None
                if not r.head_sent:
                    r.respond(Answer(500, error_body(500, f"{r.path.decode('latin-1')} failed: {e}")))
                else:
                    r.cut()
            else:
                r.task = None

        r.task = asyncio.get_running_loop().create_task(run())

    # --- the routes --------------------------------------------------------------------------------
    def models(self, r: Req) -> None:
        data = []
        for m in self.manager.snapshot():
            for n in [m["model"], *m["aliases"]]:
                data.append({"id": n, "object": "model", "owned_by": "servedeck", "created": 0,
                             "servedeck": {"model": m["model"], "alias_of": m["model"] if n != m["model"] else None,
                                           "state": m["state"], "slot": m["slot"], "detail": m["detail"]}})
        r.respond_body(200, JSON, json.dumps({"object": "list", "data": data}).encode())

    def health(self, r: Req) -> None:
        """200 while the door serves: a stopped model is no failure, the door starts it on demand. The
        models' states go to a caller who may read /v1/models (with a key set: who sends it). `?model=NAME`
        (a name or alias) asks about one model, and needs the key when one is set (401 otherwise): 200 when
        it is ready, else 503 with its state, without starting it."""
        q = parse_qs(r.url.split(b"?", 1)[1].decode("latin-1")) if b"?" in r.url else {}
        asked = q.get("model", [None])[0]
        may_list = self.admission.may_list(r)
        if asked and not may_list:  # a model's state, slot and aliases, or even whether the name exists (issue 48)
            raise Answer(401, error_body(401, "/health?model=NAME needs the api key; without it /health says only "
                                              "whether the door is up",
                                         "send Authorization: Bearer <key>"), {"WWW-Authenticate": "Bearer"})
        try:
            one = self.manager.resolve(asked) if asked else None
        except Refusal as e:
            raise Answer(e.status, error_body(e.status, e.message, e.hint)) from None
        body: dict[str, Any] = {"status": "ok"}
        status = 200
        if may_list:
            models = {m["model"]: {"state": m["state"], "slot": m["slot"], "aliases": m["aliases"],
                                   "detail": m["detail"] or None,
                                   "replicas_ready": len(m["replicas"]) if m["state"] == "ready" else 0}
                      for m in self.manager.snapshot() if one is None or m["model"] == one}
            body["models"] = models
            if one is not None and models[one]["state"] != "ready":
                status = 503
                body["status"] = models[one]["state"]
        r.respond_body(status, JSON, json.dumps(body).encode())

    def metrics_text(self, r: Req) -> None:
        async def work() -> None:
            body = await asyncio.to_thread(self.metrics.render)  # NVML reads may take a moment
            r.respond_body(200, b"text/plain; version=0.0.4; charset=utf-8", body)

        self._later(r, work)

    def status(self, r: Req) -> None:
        async def work() -> None:
            snap = await snapshot(self.manager, self.recent, self.gpu.now())
            snap["descriptors"] = self.descriptors()
            snap["bodies"] = self.bodies()
            r.respond_body(200, JSON, json.dumps(snap, default=str).encode())

        self._later(r, work)

    def page(self, r: Req) -> None:
        r.respond_body(200, b"text/html; charset=utf-8", PAGE.encode())

    def model_page(self, r: Req) -> None:
        """A model's page, rebuilt from the records on each request (file reads: in a thread)."""
        from urllib.parse import parse_qs

        from servedeck.errors import ServedeckError
        from servedeck.page import build_page, to_html

        query = r.url.split(b"?", 1)[1].decode("latin-1") if b"?" in r.url else ""
        names = parse_qs(query).get("model")
        if not names:
            raise Answer(400, error_body(400, "/page needs the model: /page?model=NAME",
                                         "the live page at / links each model's page"))

        async def work() -> None:
            try:
                text = await asyncio.to_thread(lambda: to_html(build_page(self.manager.cfg, names[0])))
            except ServedeckError as e:
                r.respond(Answer(404, error_body(404, e.message, e.hint)))
                return
            r.respond_body(200, b"text/html; charset=utf-8", text.encode())

        self._later(r, work)

    def events(self, r: Req) -> None:
        async def work() -> None:
            r.open_stream(200, [(b"Content-Type", b"text/event-stream"), (b"Cache-Control", b"no-cache")])
            if r.method == b"HEAD":
                r.end()
                return
            last = None
            while not r.gone:
                snap = await snapshot(self.manager, self.recent, self.gpu.now())
                if r.unsent() > WRITE_HIGH:  # the page stopped reading: send nothing more until it catches up
                    last = None
                else:
                    data = json.dumps({k: v for k, v in snap.items() if k != "at"}, default=str)
                    if data != last:
                        last = data
                        r.send(f"event: snapshot\ndata: {data}\n\n".encode())
                    else:
                        r.send(b": keep-alive\n\n")
                await asyncio.sleep(EVERY_S)

        self._later(r, work)
