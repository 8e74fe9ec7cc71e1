"""Headless Chromium (the Debian package) driven over the DevTools protocol with aiohttp's websocket
client: navigate, evaluate, and collect every console error and uncaught exception."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
from typing import Any

import aiohttp


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self, env: dict[str, str]):
        exe = chromium()
        assert exe, "chromium is not installed (scripts/setup.sh installs the Debian package)"
        self.profile = tempfile.mkdtemp(prefix="door-chromium-")
        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
             "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1", f"--user-data-dir={self.profile}",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
            start_new_session=True)  # its own process group: stopped whole, no orphan renderers
        self.ws_url = None
        assert self.proc.stderr is not None
        for _ in range(200):
            line = self.proc.stderr.readline()
            m = re.search(r"DevTools listening on (ws://\S+)", line)
            if m:
                self.ws_url = m.group(1)
                break
            if not line and self.proc.poll() is not None:
                break
        assert self.ws_url, "chromium did not open its DevTools port"
        self.errors: list[dict[str, Any]] = []
        self.ids = itertools.count(1)

    async def open(self, url: str) -> None:
        port = self.ws_url.split(":")[2].split("/")[0]
        self.session = aiohttp.ClientSession()
        async with self.session.get(f"http://127.0.0.1:{port}/json/list") as r:
            pages = [t for t in await r.json() if t["type"] == "page"]
        self.ws = await self.session.ws_connect(pages[0]["webSocketDebuggerUrl"], max_msg_size=0)
        self.pending: dict[int, asyncio.Future] = {}
        self.reader = asyncio.create_task(self._read())
        for method in ("Runtime.enable", "Log.enable", "Page.enable"):
            await self.call(method)
        await self.call("Page.navigate", url=url)

    async def _read(self) -> None:
        async for msg in self.ws:
            d = json.loads(msg.data)
            if "id" in d and d["id"] in self.pending:
                self.pending.pop(d["id"]).set_result(d)
            elif d.get("method") == "Runtime.exceptionThrown":
                self.errors.append(d["params"])
            elif d.get("method") == "Runtime.consoleAPICalled" and d["params"]["type"] in ("error", "assert"):
                self.errors.append(d["params"])
            elif d.get("method") == "Log.entryAdded" and d["params"]["entry"]["level"] == "error":
                self.errors.append(d["params"]["entry"])

    async def call(self, method: str, **params: Any) -> dict:
        i = next(self.ids)
        fut = asyncio.get_running_loop().create_future()
        self.pending[i] = fut
        await self.ws.send_str(json.dumps({"id": i, "method": method, "params": params}))
        d = await asyncio.wait_for(fut, 30)
        assert "error" not in d, d
        return d["result"]

    async def eval(self, expr: str) -> Any:
        r = await self.call("Runtime.evaluate", expression=expr, returnByValue=True)
        return r["result"].get("value")

    async def close(self) -> None:
        try:
            self.reader.cancel()
            await self.ws.close()
            await self.session.close()
        finally:
            self.kill()

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGTERM)
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        shutil.rmtree(self.profile, ignore_errors=True)
