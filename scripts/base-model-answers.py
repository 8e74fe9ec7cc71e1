"""How often a base model's first chat answer is empty, under llama.cpp's fallback chat template (ChatML) and
under servedeck's plain transcript (src/servedeck/data/base-transcript.jinja), each with its stop strings.

    .venv/bin/python scripts/base-model-answers.py [--reps 5] [--gguf PATH] [--llama-server PATH]

12 first messages (the first is the chat UI test's) x REPS, one llama-server per template (--parallel 2, as
the starter), llama.cpp's default sampling (temperature 0.8), the door's max_tokens 256. An answer is empty when
the stop strings leave nothing but white space: the model's first words were a turn marker. Prints a table,
one sample answer per message, and writes the counts as JSON to --out."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from servedeck.init import default_locations

LOC = default_locations()  # servedeck's cache ($SERVEDECK_CACHE honoured) and its installed data files
SYSTEM = ("You are a helpful assistant. Use the tools provided when they help answer the user's question; "
          "cite what a tool returned. Today's date is 2026-12-06.")  # tests/door/test_chat_ui_defaults.py's
MESSAGES = ["Hello! In one sentence, what can you do?", "Hello!", "Hi, who are you?", "What is the capital of France?",
            "Write a haiku about the sea.", "Explain recursion in one sentence.", "Can you help me plan a trip to Rome?",
            "What's 17 times 3?", "Tell me a joke.", "Summarise the plot of Hamlet.", "How do I boil an egg?",
            "What time is it?"]
TEMPLATES = {  # name: (--chat-template-file or None for the GGUF's own / llama.cpp's fallback, stop strings)
    "fallback ChatML": (None, ["<|im_end|>", "<|im_start|>", "<end_of_turn>"]),
    "base-transcript.jinja": (Path(LOC["data"]) / "base-transcript.jinja", ["\nUser:", "\nAssistant:"]),
}
PORT = 8399


def post(path: str, body: dict) -> dict:
    req = urllib.request.Request(f"http://127.0.0.1:{PORT}{path}", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=300).read())


def one_template(server: str, gguf: str, template: Path | None, stop: list[str], reps: int) -> dict:
    argv = [server, "-m", gguf, "--port", str(PORT), "-c", "4096", "--parallel", "2", "--jinja"]
    if template:
        argv += ["--chat-template-file", str(template)]
    srv = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(240):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{PORT}/health", timeout=1).read()
                break
            except OSError:
                time.sleep(0.5)
        empty = length = n = 0
        tokens, samples = [], []
        for msg in MESSAGES:
            for k in range(reps):
                d = post("/v1/chat/completions", {
                    "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": msg}],
                    "max_tokens": 256, "stop": stop})
                text = d["choices"][0]["message"].get("content") or ""
                n += 1
                empty += not text.strip()
                length += d["choices"][0]["finish_reason"] == "length"
                tokens.append(d["usage"]["completion_tokens"])
                if k == 0:
                    samples.append((msg, text))
        tokens.sort()
        return {"answers": n, "empty": empty, "hit_max_tokens": length, "median_tokens": tokens[len(tokens) // 2],
                "samples": samples}
    finally:
        os.killpg(srv.pid, signal.SIGTERM)
        srv.wait()


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--gguf", default=LOC["gemma_gguf"])
    ap.add_argument("--llama-server", default=LOC["llama_server"])
    ap.add_argument("--out", default="base-model-answers.json")
    a = ap.parse_args()
    if not Path(a.llama_server).is_file() or not Path(a.gguf).is_file():
        print(f"no llama-server ({a.llama_server!r}) or model ({a.gguf!r}): run bash scripts/setup.sh, or name them",
              file=sys.stderr)
        return 2
    got = {name: one_template(a.llama_server, a.gguf, t, stop, a.reps) for name, (t, stop) in TEMPLATES.items()}
    print(f"{'template':24} {'answers':>7} {'empty':>6} {'hit 256':>8} {'median tokens':>14}")
    for name, r in got.items():
        print(f"{name:24} {r['answers']:>7} {r['empty']:>6} {r['hit_max_tokens']:>8} {r['median_tokens']:>14}")
    for name, r in got.items():
        print(f"\n{name}:")
        for msg, text in r["samples"]:
            print(f"  {msg[:32]!r:36} -> {text[:70]!r}")
    Path(a.out).write_text(json.dumps(got, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
