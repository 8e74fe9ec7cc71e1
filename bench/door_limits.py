"""The door under hostile clients (issues 36 and 48): what one client that pipelines and never reads, one
huge header value, or huge request bodies (one, and several at once: the door-wide total) cost the
door's memory and its other clients.

    .venv/bin/python bench/door_limits.py [--pipeline-mib 24] [--header-mib 128] [--attackers 5]
        [--before-tree PATH] [--out bench/results/door_limits.json]

Each scenario runs against `servedeck serve` (its own process and SERVEDECK_HOME, the starter models.toml,
an api key set; no engine is started: /v1/models and the 401s are the door's own answers):
  pipeline-200   one connection sends --pipeline-mib of `GET /v1/models` with the key, reading nothing,
                 for at most --seconds
  pipeline-401   the same without the key: every answer a 401
  header         connections in turn (--attackers, for --header-seconds at least) each send one header
                 value of --header-mib
  bodies-N       N clients at once each POST a --body-mib JSON body (one chat message) naming an unknown
                 model: the door reads and parses each, or refuses it past its body budget (503)
Meanwhile another client asks GET /v1/models every 0.1 s on its own connection, timed, and the door's
RSS is sampled (psutil) every 0.05 s. Reported: the door's RSS before and at its peak, what the attacker
sent (and how much before a send first blocked: the kernel's socket buffers hold most of that, not the
door), the time from a huge header's first byte to the 431, and the other client's median and worst
latency.

--before-tree PATH runs every scenario also against another checkout's door (its src/, e.g.
`git worktree add /tmp/before COMMIT`), after this one's. The door before the limits grows about 40
bytes per byte pipelined: --pipeline-mib 24 took it past 1 GiB in issue 36, so pick the size for the box.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from door_latency import DoorProcess, git_commit  # noqa: E402

from servedeck.init import render_starter  # noqa: E402
from servedeck.testing.hostile import Bystander, huge_header, pipeline  # noqa: E402

HERE = Path(__file__).resolve().parent
KEY = "bench-limits-key"


def watched(door: DoorProcess) -> Bystander:
    return Bystander(door.url, door.proc.pid, {"Authorization": f"Bearer {KEY}"}, every_s=0.1)


def said(seen: dict) -> dict:
    return {"rss_before_mib": seen["rss_before"] / 2**20, "rss_peak_mib": seen["rss_peak"] / 2**20,
            "grew_mib": seen["grew"] / 2**20, "other_requests": len(seen["times"]), "other_failed": len(seen["failed"]),
            "other_median_ms": seen["median_s"] * 1e3 if seen["times"] else None,
            "other_max_ms": seen["max_s"] * 1e3 if seen["times"] else None}


def pipelining(door: DoorProcess, with_key: bool, mib: float, seconds: float) -> dict:
    req = b"GET /v1/models HTTP/1.1\r\nHost: door\r\n" + (b"Authorization: Bearer %s\r\n" % KEY.encode()
                                                        if with_key else b"") + b"\r\n"
    w = watched(door)
    t0 = time.monotonic()
    p = pipeline(door.port, req, int(mib * 2**20), seconds)
    send_s = time.monotonic() - t0
    with p.sock:
        time.sleep(2)  # the door answers what it took, as far as it will
        seen = w.done()
    return {"scenario": f"pipeline-{200 if with_key else 401}", "sent_mib": p.sent / 2**20,
            "blocked_after_mib": p.blocked_after / 2**20 if p.blocked_after is not None else None,
            "send_s": send_s, **said(seen)}


def header(door: DoorProcess, mib: int, attackers: int, seconds: float) -> dict:
    w = watched(door)
    took: list[float | None] = []
    answers: set[str] = set()
    t_end = time.monotonic() + seconds
    while len(took) < attackers or time.monotonic() < t_end:
        t, got = huge_header(door.port, mib, wait_s=120)
        took.append(t)
        answers.add(got.split(b"\r\n", 1)[0].decode("latin-1") or "(nothing)")
    seen = w.done()
    ok = [t for t in took if t is not None]
    return {"scenario": "header", "value_mib": mib, "attackers": len(took), "answers": sorted(answers),
            "refused_median_ms": statistics.median(ok) * 1e3 if ok else None,
            "refused_max_ms": max(ok) * 1e3 if ok else None, **said(seen)}


def bodies(door: DoorProcess, mib: int, clients: int) -> dict:
    """`clients` requests at once, each a JSON body of `mib` MiB (one chat message) naming a model the door
    does not know: the door reads, parses and refuses each (404), or refuses past its body budget (503)."""
    import httpx
    from concurrent.futures import ThreadPoolExecutor

    body = json.dumps({"model": "no-such-model", "messages": [{"role": "user", "content": "a" * (mib * 2**20)}]}).encode()
    w = watched(door)

    def one(_: int) -> str:
        t0 = time.perf_counter()
        try:
            r = httpx.post(door.url + "/v1/chat/completions", content=body, timeout=300,
                           headers={"Authorization": f"Bearer {KEY}", "Content-Type": "application/json"})
            return f"{r.status_code} in {time.perf_counter() - t0:.1f} s"
        except httpx.HTTPError as e:
            return repr(e)[:100]

    with ThreadPoolExecutor(clients) as pool:
        answers = list(pool.map(one, range(clients)))
    time.sleep(1)
    seen = w.done()
    return {"scenario": f"bodies-{clients}", "sent_mib": len(body) * clients / 2**20, "answers": answers,
            "grew_per_body": seen["grew"] / len(body) / clients, **said(seen)}


def starter_of(src: Path | None) -> str:
    """The starter models.toml as that checkout writes it (an older door refuses keys added since)."""
    if src is None:
        return render_starter()
    import subprocess

    return subprocess.run([sys.executable, "-c", "from servedeck.init import render_starter; print(render_starter())"],
                          env=dict(os.environ, PYTHONPATH=str(src)), capture_output=True, text=True, check=True).stdout


def run_all(a: argparse.Namespace, src: Path | None, label: str) -> list[dict]:
    rows = []
    starter = starter_of(src)
    if a.body_budget_mib and src is None:  # the door before issue 48 has no such key
        starter = starter.replace("[host]\n", f"[host]\nbody_budget_mib = {a.body_budget_mib}\n", 1)
    for scenario in a.scenarios.split(","):
        door = DoorProcess(starter, "--api-key", KEY, src=src)  # a fresh door: RSS from its start
        try:
            time.sleep(1)
            if scenario == "header":
                row = header(door, a.header_mib, a.attackers, a.header_seconds)
            elif scenario.startswith("bodies-"):
                row = bodies(door, a.body_mib, int(scenario.split("-")[1]))
            else:
                row = pipelining(door, scenario.endswith("200"), a.pipeline_mib, a.seconds)
        finally:
            door.stop()
        row.update(door=label, load_avg=os.getloadavg())
        rows.append(row)
    return rows


def fmt(x, nd: int = 1) -> str:
    return "–" if x is None else f"{x:,.{nd}f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipeline-mib", type=float, default=24, help="pipelined requests sent, MiB (issue 36: 24)")
    ap.add_argument("--seconds", type=float, default=20, help="the pipelining client's longest send")
    ap.add_argument("--header-mib", type=int, default=128, help="the one header value's size, MiB (issue 36: 128)")
    ap.add_argument("--attackers", type=int, default=5, help="huge-header connections, one after another (at least)")
    ap.add_argument("--header-seconds", type=float, default=5, help="... and for at least this long")
    ap.add_argument("--body-mib", type=int, default=200, help="each request body of the bodies scenarios, MiB "
                    "(issue 48: 200)")
    ap.add_argument("--body-budget-mib", type=int, help="[host] body_budget_mib for this tree's door (default: "
                    "an eighth of host memory)")
    ap.add_argument("--scenarios", default="pipeline-200,pipeline-401,header,bodies-1,bodies-4",
                    help="which to run, comma-separated: bodies-N sends N bodies at once")
    ap.add_argument("--before-tree", type=Path, metavar="PATH", help="also run another checkout's door (its src/)")
    ap.add_argument("--out", type=Path, default=HERE / "results" / "door_limits.json")
    a = ap.parse_args()
    if a.before_tree and not (a.before_tree / "src" / "servedeck" / "door").is_dir():
        ap.error(f"--before-tree {a.before_tree}: expected a servedeck checkout (no src/servedeck/door there)")
    started = datetime.now(timezone.utc).isoformat(timespec="seconds")
    rows = run_all(a, None, "this")
    if a.before_tree:
        rows += run_all(a, a.before_tree / "src", "before")
    t = Table(title="the door under hostile clients")
    for col in ("door", "scenario", "sent MiB", "sent before blocking MiB", "431 median / max ms (bodies: answers)",
                "RSS before → peak MiB", "grew MiB", "other client median / max ms", "load avg"):
        t.add_column(col, justify="right")
    for r in rows:
        t.add_row(r["door"], r["scenario"], fmt(r.get("sent_mib")), fmt(r.get("blocked_after_mib")),
                  f"{fmt(r.get('refused_median_ms'))} / {fmt(r.get('refused_max_ms'))}" if r["scenario"] == "header" else
                  ", ".join(r.get("answers", [])) or "–",
                  f"{fmt(r['rss_before_mib'], 0)} → {fmt(r['rss_peak_mib'], 0)}", fmt(r["grew_mib"]),
                  f"{fmt(r['other_median_ms'])} / {fmt(r['other_max_ms'])}",
                  " ".join(f"{x:.1f}" for x in r["load_avg"]))
    Console(width=200).print(t)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"started": started, "commit": git_commit(HERE.parent),
            "before_commit": git_commit(a.before_tree) if a.before_tree else None, "python": platform.python_version(),
            "cpus": os.cpu_count(), "args": {k: str(v) for k, v in vars(a).items()}}
    a.out.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
