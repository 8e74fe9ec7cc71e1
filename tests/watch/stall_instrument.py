"""An instrument, not an engine stand-in: an HTTP server that accepts connections and answers
/health, but stops answering completions after the first `--answer` of them (so the deck sees it
ready, then it stalls, as the seed's "0 tok/s for ten minutes" engine did).

    stall_instrument.py [--answer 1] [--moving] [--reasoning] [--stall-chat] --port P   (other llama-server flags ignored)

/metrics serves llama.cpp's counter names; with --moving they grow every second (busy but not
for us: "slow"), without it they freeze ("stalled"). /v1/chat/completions answers (for the
conversation test) with an assistant message, adding reasoning_content only with --reasoning and
a null tool_calls always; every chat body received is served back at GET /bodies. With --stall-chat
chat completions are accepted and never answered as well (the soak's requests, for its stall watch).
"""

import argparse
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

p = argparse.ArgumentParser()
p.add_argument("--port", type=int, required=True)
p.add_argument("--host", default="127.0.0.1")
p.add_argument("--answer", type=int, default=1)
p.add_argument("--moving", action="store_true")
p.add_argument("--reasoning", action="store_true")
p.add_argument("--stall-chat", action="store_true")
args, _ = p.parse_known_args()

state = {"answered": 0, "prompt": 10.0, "gen": 5.0, "bodies": []}
lock = threading.Lock()
t_start = time.monotonic()


def counters():
    grow = (time.monotonic() - t_start) * 50 if args.moving else 0.0
    return state["prompt"] + grow, state["gen"] + grow


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _send(self, code, body, ctype="application/json"):
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/health":
            self._send(200, {"status": "ok"})
        elif self.path == "/metrics":
            pt, gt = counters()
            self._send(200, f"llamacpp:prompt_tokens_total {pt}\nllamacpp:tokens_predicted_total {gt}\n"
                            "llamacpp:requests_processing 1\nllamacpp:requests_deferred 0\n", "text/plain")
        elif self.path == "/bodies":
            with lock:
                self._send(200, state["bodies"])
        else:
            self._send(404, {"error": "not found"})

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n) or b"{}")
        if self.path == "/v1/chat/completions" and args.stall_chat:
            while True:  # accepted, never answered
                time.sleep(3600)
        if self.path == "/v1/chat/completions":
            with lock:
                state["bodies"].append(body)
                k = len(state["bodies"])
            msg = {"role": "assistant", "content": f"fact {k}", "tool_calls": None}
            if args.reasoning:
                msg["reasoning_content"] = f"thinking {k}"
            self._send(200, {"choices": [{"index": 0, "message": msg, "finish_reason": "stop"}],
                             "usage": {"prompt_tokens": 10, "completion_tokens": 2}})
            return
        with lock:
            state["answered"] += 1
            mine = state["answered"]
        if mine > args.answer:
            while True:  # accepted, never answered: the stall
                time.sleep(3600)
        self._send(200, {"choices": [{"text": " Paris", "index": 0}], "usage": {"completion_tokens": 1}})


srv = ThreadingHTTPServer((args.host, args.port), H)
srv.daemon_threads = True
print(f"llama_server: listening on http://{args.host}:{args.port}", flush=True)
srv.serve_forever()
