"""Issue 48 item 4: a request body's peak cost in the door is at most about twice its size. The router
reads a 64 MiB chat body (as door/front.py hands it over: one bytearray) and writes it to an engine (a
stand-in relay that keeps what it was given, as a transport does until the engine has read it), in a
process of its own whose peak RSS (VmHWM, reset just before) is read from /proc. Two cases: the body as
the client sent it, and one the door writes anew (an alias rewritten to the served name). Before this
test the body was parsed by orjson, whose parser (yyjson) copies its input: the peak was three times
the body (bench/door_limits.py bodies-1: +595 MiB for 200 MiB)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")

CHILD = textwrap.dedent('''
    import asyncio, gc, json, sys
    from types import SimpleNamespace
    from servedeck.door.request import Req
    from servedeck.door.routing import Router

    MIB = 2**20
    name = sys.argv[1]

    def status(key):
        for line in open("/proc/self/status"):
            if line.startswith(key):
                return int(line.split()[1]) * 1024

    class Relay:
        kept = []
        def host_for(self, url):
            return b"127.0.0.1:9"
        def start(self, url, payload, r):
            self.kept.append(payload)  # a transport holds what it was given until the engine has read it
            return asyncio.get_running_loop().create_task(asyncio.sleep(0))

    rt = SimpleNamespace(context=8192, embeddings=None, served_name="smollm2", managed=True, chat_logprobs=False,
                         members=[])
    manager = SimpleNamespace(resolve=lambda n: "smollm2", models={"smollm2": rt}, cfg=None,
                              take_ready=lambda model, ask: SimpleNamespace(url="http://127.0.0.1:9"))
    metrics = SimpleNamespace(count=lambda *a: None)

    async def main():
        router = Router(manager, metrics, Relay())
        r = Req(SimpleNamespace(peer_host="127.0.0.1"))
        r.method, r.url = b"POST", b"/v1/chat/completions"
        head = json.dumps({"model": name, "max_tokens": 2, "messages": [{"role": "user", "content": ""}]})
        body = bytearray(head[:-4].encode())  # up to the content's opening quote
        body += b"a" * (64 * MIB)  # written into the buffer: no other copy of it is ever made here
        body += head[-4:].encode()
        size = len(body)
        r.body = [body]
        del body
        gc.collect()
        before = status("VmRSS:")
        open("/proc/self/clear_refs", "w").write("5")  # VmHWM from here
        router.dispatch(r)
        sent = Relay.kept[0]
        sent = sent[1] if isinstance(sent, tuple) else sent
        print(json.dumps({"size": size, "before": before, "peak": status("VmHWM:"),
                          "sent_model": json.loads(bytes(sent))["model"]}))

    asyncio.run(main())
''')


@pytest.mark.parametrize("name", ["smollm2", "smol"], ids=["as-sent", "written-anew"])
def test_a_bodys_peak_cost_in_the_door_is_at_most_about_twice_its_size(name):
    out = subprocess.run([sys.executable, "-c", CHILD, name], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["sent_model"] == "smollm2", got  # the alias was rewritten: the body was written anew
    over = (got["peak"] - got["before"]) / got["size"]
    print(f"{name}: peak {over + 1:.2f} times the body (the body itself, then {over:.2f} more)")
    assert over < 1.25, f"the body's peak cost was {over + 1:.2f} times its size: {got}"
