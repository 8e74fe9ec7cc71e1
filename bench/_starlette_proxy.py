"""Bench only: the other stack the door could have used — Starlette on uvicorn (uvloop + httptools),
httpx upstream — as a bare streaming proxy to one upstream (no routing, queue or metrics: that favours it).
`bench/door_latency.py --targets stack` runs it beside the door. Not a servedeck dependency:
`pip install starlette uvicorn httptools` to run it.

    python bench/_starlette_proxy.py PORT UPSTREAM_URL
"""

from __future__ import annotations

import sys

import httpx
import uvicorn
from starlette.applications import Starlette
from starlette.background import BackgroundTask
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

PORT, UPSTREAM = int(sys.argv[1]), sys.argv[2].rstrip("/")
HOP = {"host", "content-length", "connection", "transfer-encoding", "keep-alive"}
client = httpx.AsyncClient(base_url=UPSTREAM, timeout=None, limits=httpx.Limits(max_connections=None,
                                                                                 max_keepalive_connections=None))


async def proxy(request: Request) -> StreamingResponse:
    body = await request.body()
    headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP}
    req = client.build_request(request.method, request.url.path, content=body, headers=headers)
    up = await client.send(req, stream=True)
    return StreamingResponse(up.aiter_raw(), status_code=up.status_code,
                             headers={k: v for k, v in up.headers.items() if k.lower() not in HOP},
                             background=BackgroundTask(up.aclose))


app = Starlette(routes=[Route("/v1/{path:path}", proxy, methods=["GET", "POST"])])

if __name__ == "__main__":
    print("STARLETTE READY", flush=True)
    uvicorn.run(app, host="127.0.0.1", port=PORT, log_level="warning", loop="uvloop", http="httptools",
                access_log=False)
