"""The browser half of scripts/trial-open-webui.sh: headless Chromium (tests/door/cdp.py's driver) opens Open
WebUI, sends one message to each model with the UI's own defaults, saves a screenshot of each answer, and
writes what the door and the engine saw of it (trial.json, and a table on stdout).

Figures come from records, not from the page: the door's /door/status (its recent requests: TTFT, E2E,
completion tokens, what client_defaults filled in) and the engine's own log (llama-server's print_timing
lines: prompt and generated tokens per task)."""

from __future__ import annotations

import argparse
import asyncio
import base64
import glob
import json
import os
import re
import signal
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "door"))
from cdp import Browser  # noqa: E402  (the tests' DevTools driver, reused as it is)

CHAT = "/v1/chat/completions"
TIMING = re.compile(r"task (?P<task>\d+) \| +(?P<what>prompt eval|eval) time = +(?P<ms>[\d.]+) ms / +(?P<n>\d+) tokens")
RELEASE = re.compile(r"task (?P<task>\d+) \| stop processing")
LOG_TIME = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.(\d+) ")  # minutes.seconds.ms.µs since the engine started


def door_status(door: str, key: str) -> dict:
    req = urllib.request.Request(door + "/door/status", headers={"Authorization": f"Bearer {key}"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.load(r)


def requests_since(door: str, key: str, model: str, since: float) -> list[dict]:
    """The door's recent requests for `model` that arrived after `since` (wall clock), oldest first."""
    rec = door_status(door, key)["recent"]
    return sorted((e for e in rec if e["model"] == model and e["at"] >= since), key=lambda e: e["at"])


REQUEST = re.compile(r"request POST /v1/chat/completions body=(.*)$")


def request_kinds(door_log: str, model: str) -> list[str]:
    """What each chat request for `model` in the door's log (--log-bodies, in arrival order) was: "chat" for
    the conversation's own turn (streamed, as Open WebUI sends it), else Open WebUI's task ("title", "tags",
    "follow-ups", ...: the first line under its '### Task:'). Open WebUI sends its title request before the
    chat itself, so arrival order alone does not say which is which."""
    kinds = []
    for line in open(door_log, errors="replace"):
        m = REQUEST.search(line)
        if not m or not re.search(rf'"model":\s*"{re.escape(model)}"', m.group(1)[:200]):
            continue
        task = re.search(r"### Task:\\n([^\\]{0,80})", m.group(1))
        kinds.append(f"task: {task.group(1).strip()}" if task else "chat" if '"stream":true' in m.group(1) else "other")
    return kinds


def labelled(args: argparse.Namespace, model: str) -> list[tuple[str, dict]]:
    """The door's recent chat requests for `model`, oldest first, each with its kind from the door's log (both
    record every routed request in arrival order: the log's last N lines are the status's N entries)."""
    entries = sorted((e for e in door_status(args.door, args.key)["recent"] if e["model"] == model and e["path"] == CHAT),
                     key=lambda e: e["at"])
    kinds = request_kinds(args.door_log, model)
    if len(kinds) < len(entries):
        return []  # the log is a line behind: ask again
    return list(zip(kinds[len(kinds) - len(entries):], entries))


def engine_tasks(home: str, model: str) -> list[dict]:
    """Each finished llama-server task in the model's launch logs: prompt and generated tokens, their times, and
    when it ended (wall clock: the engine's start from engine.json plus the log line's own offset)."""
    tasks: dict[tuple[str, str], dict] = {}
    for log in sorted(glob.glob(f"{home}/launches/{model}/*/engine.log")):
        started = json.loads(Path(log).with_name("engine.json").read_text())["started_at"]
        for line in open(log, errors="replace"):
            m = TIMING.search(line) or RELEASE.search(line)
            if not m:
                continue
            t = tasks.setdefault((log, m.group("task")), {"task": int(m.group("task"))})
            if m.re is RELEASE:
                at = LOG_TIME.match(line)
                t["ended_at"] = started + int(at.group(1)) * 60 + int(at.group(2)) + int(at.group(3)) / 1e3 + int(at.group(4)) / 1e6
            else:
                kind = "prompt" if m.group("what") == "prompt eval" else "gen"
                t[f"{kind}_tokens"], t[f"{kind}_ms"] = int(m.group("n")), float(m.group("ms"))
    return list(tasks.values())


def engine_task_of(tasks: list[dict], entry: dict) -> dict | None:
    """The engine task that answered the door's request `entry`: the one that ended closest to when the door's
    response did (within 5 s). A streamed chat from Open WebUI asks for no usage, so the door has no token
    count to match by."""
    end = entry["at"] + entry["e2e_ms"] / 1e3
    near = [t for t in tasks if "ended_at" in t and t.get("prompt_tokens", 0) > 1 and abs(t["ended_at"] - end) < 5]
    return min(near, key=lambda t: abs(t["ended_at"] - end), default=None)


async def wait_for(b: Browser, expr: str, timeout: float, what: str, fail: bool = True) -> object:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = await b.eval(expr)
        if v:
            return v
        await asyncio.sleep(0.5)
    if fail:
        raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}")
    return None


def save_png(shot: dict, folder: str, name: str) -> None:
    Path(folder, name).write_bytes(base64.b64decode(shot["data"]))


DISMISS = """(() => { for (const el of document.querySelectorAll('button')) {
  if (/let.s go|^okay|^got it|^close$/i.test(el.innerText.trim())) { el.click(); return el.innerText.trim(); } }
  return ''; })()"""
ANSWER = """(() => { const a = document.querySelectorAll('[id^="response-content-container"], .chat-assistant');
  return a.length ? a[a.length - 1].innerText : ''; })()"""
GENERATING = "!!document.querySelector('button[aria-label=\"Stop\"], #stop-response-button, .stop-button')"


async def one(b: Browser, args: argparse.Namespace, model: str) -> dict:
    url = f"{args.webui}/?models={urllib.parse.quote(model)}&q={urllib.parse.quote(args.message)}"
    await b.call("Page.navigate", url=url)
    await wait_for(b, "document.querySelector('#chat-input') !== null", 120, f"Open WebUI's chat input ({model})")
    await asyncio.sleep(2)
    dismissed = await b.eval(DISMISS)  # a first visit's "what's new" dialog, if it shows
    await wait_for(b, f"(document.querySelector('#chat-input')?.innerText || '').includes({json.dumps(args.message[:20])})",
                   30, "the message in the chat input (the q= parameter)")
    t_send = time.time()
    # The send button, as a user clicks it. Its first click can come before the editor has taken the q=
    # text as its prompt (a dispatched Enter was lost so once): click again until the input is emptied.
    for _ in range(5):
        await b.eval("document.querySelector('#send-message-button')?.click()")
        if await wait_for(b, "!(document.querySelector('#chat-input')?.innerText || '').trim()", 5, "", fail=False):
            break
    # The chat request: the model's first streamed one through the door after the send; done once the door
    # counts it (its status set)
    deadline = time.monotonic() + args.timeout
    chat = first_text = None
    while time.monotonic() < deadline:
        if first_text is None and (await b.eval(ANSWER) or "").strip():
            first_text = time.time() - t_send  # the answer's first words on the page, as the user sees them
        mine = [e for kind, e in labelled(args, model) if kind == "chat" and e["at"] >= t_send - 1]
        if mine and mine[0]["status"] is not None:
            chat = mine[0]
            break
        await asyncio.sleep(1)
    if chat is None:
        save_png(await b.call("Page.captureScreenshot", format="png"), args.out, f"{model}-timed-out.png")
        return {"model": model, "error": f"no answer through the door within {args.timeout} s"}
    t_door_done = time.time()
    # the page has drawn the whole answer once its stop button is gone
    await wait_for(b, f"!({GENERATING})", 60, "the page to finish drawing", fail=False)
    await asyncio.sleep(2)
    answer = await b.eval(ANSWER) or ""
    save_png(await b.call("Page.captureScreenshot", format="png"), args.out, f"{model}.png")
    # Open WebUI's follow-up tasks (title, tags, follow-up questions) go to the same model after the answer:
    # let them finish before the next model, so that one's figures are its own
    deadline = time.monotonic() + args.tasks_wait
    while time.monotonic() < deadline:
        later = requests_since(args.door, args.key, model, t_send - 1)
        if time.time() - t_door_done > 15 and all(e["status"] is not None for e in later):
            break
        await asyncio.sleep(2)
    others = [dict(e, kind=kind) for kind, e in labelled(args, model) if e["at"] >= t_send - 1 and e is not chat
              and e["at"] != chat["at"]]
    bound = args.bounds.get(model)
    tasks = engine_tasks(args.home, model)
    mine = engine_task_of(tasks, chat)
    for t in others:
        if t.get("e2e_ms") is not None:
            t["engine_task"] = engine_task_of(tasks, t)
    generated = mine.get("gen_tokens") if mine else chat.get("tokens")
    return {
        "model": model, "dismissed_dialog": dismissed or None,
        "door": chat, "open_webui_tasks": others,
        "engine_task": mine,
        "first_text_s": None if first_text is None else round(first_text, 1),
        "answer_tokens": generated, "answer_chars": len(answer.strip()), "answer": answer.strip()[:1000],
        "max_tokens_bound": bound,
        # fewer tokens than the bound the door filled in: the model ended its turn (or hit a stop string)
        "stopped_by_itself": (generated is not None and bound is not None and generated < bound
                              and chat.get("status") == 200),
        "screenshot": f"{model}.png",
    }


async def main(b: Browser, args: argparse.Namespace) -> list[dict]:
    try:
        await b.open("about:blank")
        await b.call("Emulation.setDeviceMetricsOverride", width=1280, height=800, deviceScaleFactor=1, mobile=False)
        return [await one(b, args, m) for m in args.models]
    finally:
        await b.close()


def table(results: list[dict]) -> str:
    rows = ["| model | status | waited at the door | first words on the page | door's first byte | E2E | prompt tokens | "
            "prefill | answer tokens | answer chars | filled by client_defaults | stopped by itself |",
            "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in results:
        if "error" in r:
            rows.append(f"| {r['model']} | {r['error']} |" + " |" * 10)
            continue
        d, e = r["door"], r["engine_task"] or {}
        first = f"{r['first_text_s']:.1f} s" if r.get("first_text_s") is not None else "?"
        prefill = f"{e['prompt_ms'] / 1e3:.1f} s" if "prompt_ms" in e else "?"
        rows.append(f"| {r['model']} | {d['status']} | {d.get('waited') or '–'} | {first} | {d['ttft_ms'] / 1e3:.1f} s | "
                    f"{d['e2e_ms'] / 1e3:.1f} s | {e.get('prompt_tokens', '?')} | {prefill} | {r['answer_tokens']} | "
                    f"{r['answer_chars']} | {', '.join(d.get('filled') or []) or '–'} | "
                    f"{'yes' if r['stopped_by_itself'] else 'no (at the ' + str(r['max_tokens_bound']) + '-token bound)'} |")
    rows += ["", "Open WebUI's own requests to the same model around the chat (its task model is the chat's model):", "",
             "| model | request | status | waited | E2E | answer tokens | filled by client_defaults |", "|---|---|---|---|---:|---:|---|"]
    for r in results:
        for t in r.get("open_webui_tasks", []):
            e2e = f"{t['e2e_ms'] / 1e3:.1f} s" if t.get("e2e_ms") is not None else "…"
            rows.append(f"| {r['model']} | {t['kind']} | {t['status']} | {t.get('waited') or '–'} | {e2e} | {t.get('tokens')} | "
                        f"{', '.join(t.get('filled') or []) or '–'} |")
    return "\n".join(rows)


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--webui", required=True)
    p.add_argument("--door", required=True)
    p.add_argument("--key-file", required=True)
    p.add_argument("--door-log", required=True, help="the door's log, written with --log-bodies")
    p.add_argument("--home", required=True, help="the trial's SERVEDECK_HOME (engine logs)")
    p.add_argument("--config", required=True, help="the trial's models.toml (each model's max_tokens bound)")
    p.add_argument("--out", required=True)
    p.add_argument("--models", default="smollm2,gemma")
    p.add_argument("--message", default="Hello! In one sentence, what can you do?")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--tasks-wait", type=float, default=300)
    args = p.parse_args()
    args.key = Path(args.key_file).read_text().strip()
    args.models = args.models.split(",")
    from servedeck.config.load import load  # the trial's own models.toml, as the door read it

    cfg = load(Path(args.config))
    args.bounds = {m: cfg.models[m].client_defaults.max_tokens for m in args.models}
    Path(args.out).mkdir(parents=True, exist_ok=True)
    # SIGTERM (the trial script stopped) unwinds like Ctrl-C, so Chromium (its own process group) is stopped too
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    browser = Browser(dict(os.environ))
    try:
        results = asyncio.run(main(browser, args))
    finally:
        browser.kill()
    Path(args.out, "trial.json").write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
